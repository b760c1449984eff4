"""The SLURM backend: one SLURM job per mmt job, submitted through submitit, one node agent per node."""

import dataclasses

from mmt.backends.spec import BackendSpec

HELP = "one SLURM job of N nodes per sweep job, through sbatch (submitit)"
SPEC = dataclasses.replace(
    BackendSpec.of_package(__name__, "SlurmBackend", "SlurmLauncherConf", noun="SLURM job", help=HELP),
    cluster_check=f"{__name__}.over_ssh:cluster_problem",  # squeue answers on the login node (docs/remote.md)
)
