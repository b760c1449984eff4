"""``hydra.launcher`` of cluster=slurm (``hydra/launcher=mmt_slurm``): light, imported at Hydra's plugin scan."""

import enum
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional

from mmt.backends.job_conf import JobConf


class SlurmTasks(enum.Enum):
    per_node = "per_node"  # one task per node: the node agent, which forks the node's ranks
    per_rank = "per_rank"  # one task per rank, for sites that bind resources per task


class ContainerRuntime(enum.Enum):
    pyxis = "pyxis"
    apptainer = "apptainer"
    singularity = "singularity"
    oci = "oci"  # SLURM's own: srun --container <bundle dir>, with the cluster's oci.conf


@dataclass
class SlurmLauncherConf(JobConf):
    """Each job is one SLURM job of N nodes, submitted through submitit."""

    _target_: str = "hydra_plugins.mmt_launcher.mmt_launcher.MMTSlurmLauncher"  # the name Hydra's plugin list shows
    # the backend that runs the jobs: a name in mmt.backends.registry (set by the launcher config you select)
    backend: str = "slurm"
    # submitit's folder (sbatch scripts, per-task logs, pickles); %j is the SLURM job id
    submitit_folder: str = "${hydra.sweep.dir}/.submitit/%j"
    # one task per node running the node agent (default), or one task per rank
    tasks: SlurmTasks = SlurmTasks.per_node
    # partition / account / qos / constraint (#SBATCH --partition ...); null = the site default
    partition: Optional[str] = None
    account: Optional[str] = None
    qos: Optional[str] = None
    constraint: Optional[str] = None
    # CPUs per task; null = the machine's cpus / tasks per node
    cpus_per_task: Optional[int] = None
    # memory per node in GB; null = the site default
    mem_gb: Optional[int] = None
    # GPUs per node requested with --gpus-per-node; null = the machine's GPU count
    gpus_per_node: Optional[int] = None
    # shell lines run in the sbatch script before the tasks start (module load, conda activate ...)
    setup: List[str] = field(default_factory=list)
    # any other sbatch option: {name: value} -> #SBATCH --name=value
    sbatch_extra: Dict[str, Any] = field(default_factory=dict)
    # any other srun option: ["--option=value", ...]
    srun_extra: List[str] = field(default_factory=list)
    # how a job with an `image` runs
    container_runtime: ContainerRuntime = ContainerRuntime.pyxis
    # bind mounts for the container: ["/host/path:/container/path", ...]; the project dir is always mounted
    container_mounts: List[str] = field(default_factory=list)
    # seconds before the time limit at which SLURM sends the requeue/checkpoint signal
    signal_delay_s: int = 90
    # how many times a job may be requeued after preemption or timeout
    max_requeues: int = 3
    # seconds between queries of the job state (squeue/sacct); the job dir is read every 0.1 s regardless
    poll_interval_s: float = 1.0
    # a login node reached over SSH, from a machine that shares nothing with the cluster (docs/remote.md):
    # {host, remote_root, user, port, identity_file, config_file, python, setup, grace_s, options}; empty: SLURM's
    # commands are here, and the sweep dir is on a filesystem the nodes mount
    ssh: Dict[str, Any] = field(default_factory=dict)
