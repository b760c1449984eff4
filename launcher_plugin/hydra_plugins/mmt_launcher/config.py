"""Launcher configs, stored in Hydra's ConfigStore as ``hydra/launcher=mmt_local`` and ``mmt_slurm``.

Imported during Hydra's plugin discovery (by every Hydra app on this interpreter): standard library, Hydra and
OmegaConf only.

The fields of :class:`JobConf` describe *each job* and are read from the job's own composed config, never from the
launcher's constructor (which Hydra resolves once, against the master config, so ``num_nodes=1,2`` would otherwise
launch every job with one node). Their defaults point at the app's top-level keys (``num_nodes``, ``devices``,
``machine`` ...) through ``oc.select``, so an app that uses those names needs no wiring, and any other app still
runs (1 node x 1 process).
"""

from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional

from hydra.core.config_store import ConfigStore


@dataclass
class JobConf:
    """What each job is. Values are validated when the job is planned (see ``_validate.py``)."""

    # nodes per job (int >= 1)
    num_nodes: Any = "${oc.select:num_nodes,1}"
    # processes per node (int >= 1); null = the machine's GPU count, 1 on CPU machines
    devices: Any = "${oc.select:devices,null}"
    # hardware of each node: a machine catalogue entry (conf/machine/*.yaml); null = unspecified, no price
    machine: Any = "${oc.select:machine,null}"
    # container image every node runs in; null = this environment
    image: Any = "${oc.select:image,null}"
    # a shell command run on every node/rank instead of the task function; null = run the task function
    command: Any = "${oc.select:command,null}"
    # per_node: the command runs once per node and starts its own local ranks (Lightning, torchrun, mp.spawn);
    # per_rank: it runs once per rank with the full rank contract
    command_mode: Any = "${oc.select:command_mode,per_node}"
    # extra environment variables for every rank: {NAME: value}
    env: Any = "${oc.select:env,null}"
    # the recipe's batch section: global_size (+ recipe, precision, default_micro, micro, table); the plan splits
    # it into micro-batch x accumulation for each job's world and machine (see _batch.py); null = no batch plan
    batch: Any = "${oc.select:batch,null}"
    # wall-clock limit of one job, in minutes; when it is reached every rank is stopped and the job is TIMEOUT
    timeout_min: Any = 60
    # print each job's plan (ranks, env, command, machine, cost estimate) and start nothing
    dry_run: bool = False
    # key of the returned dict shown as the metric in the sweep summary; null = its first number
    summary_metric: Optional[str] = None
    # local backend: modules its agent imports once before forking the ranks (recipes name what they import);
    # never a module that initialises CUDA on import. Other backends ignore it.
    preload: List[str] = field(default_factory=lambda: ["torch"])


@dataclass
class LocalLauncherConf(JobConf):
    """The embedded default: every job runs as N simulated nodes x M processes on this host."""

    _target_: str = "hydra_plugins.mmt_launcher.mmt_launcher.MMTLocalLauncher"
    # most ranks running at once over the jobs of a sweep; a job larger than this still runs, alone.
    # null = max(4, CPU cores of this host)
    max_parallel_ranks: Optional[int] = None
    # address of node 0 (all simulated nodes share this host's loopback)
    master_addr: str = "127.0.0.1"
    # fork: ranks are forked from a per-host agent that imported `preload` once (fast start);
    # spawn: every rank is a fresh interpreter (slower, for code that is not fork-safe)
    start_method: str = "fork"
    # seconds between SIGTERM and SIGKILL when ranks are stopped
    kill_grace_s: float = 1.0
    # whose output the console shows live, prefixed with job, node and rank: rank0 | all | none
    console: str = "rank0"


@dataclass
class SlurmLauncherConf(JobConf):
    """Each job is one SLURM job of N nodes x M tasks, submitted through submitit."""

    _target_: str = "hydra_plugins.mmt_launcher.mmt_launcher.MMTSlurmLauncher"
    # submitit's folder (sbatch scripts, per-task logs, pickles); %j is the SLURM job id
    submitit_folder: str = "${hydra.sweep.dir}/.submitit/%j"
    # partition / account / qos / constraint (#SBATCH --partition ...); null = the site default
    partition: Optional[str] = None
    account: Optional[str] = None
    qos: Optional[str] = None
    constraint: Optional[str] = None
    # CPUs per task (one task per rank); null = machine cpus // devices
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
    # how a job with an `image` runs: pyxis (srun --container-image) | apptainer | singularity
    container_runtime: str = "pyxis"
    # bind mounts for the container: ["/host/path:/container/path", ...]; the project dir is always mounted
    container_mounts: List[str] = field(default_factory=list)
    # seconds before the time limit at which SLURM sends the requeue/checkpoint signal
    signal_delay_s: int = 90
    # how many times a job may be requeued after preemption or timeout
    max_requeues: int = 3
    # seconds between queries of the job state (squeue/sacct); the job dir is read every 0.1 s regardless
    poll_interval_s: float = 1.0


ConfigStore.instance().store(
    group="hydra/launcher", name="mmt_local", node=LocalLauncherConf, provider="mmt_launcher"
)
ConfigStore.instance().store(
    group="hydra/launcher", name="mmt_slurm", node=SlurmLauncherConf, provider="mmt_launcher"
)
