"""mmt's recipes: what every rank of a job runs. Each recipe reads its place from ``mmt.RankInfo``.

``lm`` (Lightning Trainer), ``lm_fabric`` (Lightning Fabric) and ``lm_torch`` (raw PyTorch DDP) train the same
model on the same data with the same batch plan; ``probe`` checks an allocation. ``tuned/`` holds their tuned
micro-batch tables (written by ``tune.py``).
"""
