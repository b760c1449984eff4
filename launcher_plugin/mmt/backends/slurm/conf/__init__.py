"""cluster=slurm's config (``cluster/slurm.yaml``), on every Hydra app's search path (mmt.backends.launchers)."""
