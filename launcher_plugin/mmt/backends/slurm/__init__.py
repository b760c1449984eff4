"""The SLURM backend: one SLURM job per mmt job, submitted through submitit, one node agent per node."""
