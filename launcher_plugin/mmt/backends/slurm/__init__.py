"""The SLURM backend: one SLURM job per mmt job, submitted through submitit, one node agent per node."""

from mmt.backends.spec import BackendSpec

HELP = "one SLURM job of N nodes per sweep job, through sbatch (submitit)"
SPEC = BackendSpec.of_package(__name__, "SlurmBackend", "SlurmLauncherConf", noun="SLURM job", help=HELP)
