"""Launcher configs, stored in Hydra's ConfigStore as ``hydra/launcher=mmt_local``, ``mmt_slurm`` and ``mmt_ray``.

Imported during Hydra's plugin discovery (by every Hydra app on this interpreter): standard library, Hydra,
OmegaConf and the standard-library-only facts of ``mmt.core`` (the launch id, the enums).

The fields of :class:`JobConf` describe *each job* and are read from the job's own composed config, never from the
launcher's constructor (which Hydra resolves once, against the master config, so ``num_nodes=1,2`` would otherwise
launch every job with one node). Their defaults point at the app's top-level keys (``num_nodes``, ``devices``,
``machine`` ...) through ``oc.select``, so an app that uses those names needs no wiring, and any other app still
runs (1 node x 1 process). Those fields are typed ``Any``: a typed field would make OmegaConf reject a bad value
while Hydra instantiates the launcher, with a traceback, instead of mmt's planner naming the key, the value, what
is allowed and a hint. Every other field carries its real type.
"""

import enum
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional

from hydra.core.config_store import ConfigStore
from omegaconf import OmegaConf

from mmt.core import launch_id
from mmt.core.states import ConsoleMode, StartMethod

# the default sweep dir is ``${mmt_launch_id:}``: unique per run of the app (Hydra executes this module again at
# every plugin scan, so each run gets a new id; see mmt.core.launch_id)
launch_id.renew()
OmegaConf.register_new_resolver("mmt_launch_id", lambda: launch_id.current().launch, replace=True)


class SlurmTasks(enum.Enum):
    per_node = "per_node"  # one task per node: the node agent, which forks the node's ranks
    per_rank = "per_rank"  # one task per rank, for sites that bind resources per task


class ContainerRuntime(enum.Enum):
    pyxis = "pyxis"
    apptainer = "apptainer"
    singularity = "singularity"
    oci = "oci"  # SLURM's own: srun --container <bundle dir>, with the cluster's oci.conf


class LocalContainerRuntime(enum.Enum):
    podman = "podman"
    docker = "docker"


@dataclass
class JobConf:
    """What each job is, and how a launch runs. Values are validated when a job is planned (mmt.planning)."""

    # nodes per job (int >= 1)
    num_nodes: Any = "${oc.select:num_nodes,1}"
    # processes per node (int >= 1); null = the machine's GPU count, 1 on CPU machines
    devices: Any = "${oc.select:devices,null}"
    # hardware of each node: a machine catalogue entry (machine=<name>); null = unspecified, no price
    machine: Any = "${oc.select:machine,null}"
    # container image every node runs in; null = this environment
    image: Any = "${oc.select:image,null}"
    # a shell command run on every node/rank instead of the task function; null = run the task function
    command: Any = "${oc.select:command,null}"
    # per_node: the command runs once per node and starts its own local ranks (Lightning, torchrun, mp.spawn);
    # per_rank: it runs once per rank with the full rank contract
    command_mode: Any = "${oc.select:command_mode,per_node}"
    # extra environment variables for every rank: {NAME: value}; values are never printed
    env: Any = "${oc.select:env,null}"
    # the recipe's batch section: global_size (+ recipe, precision, default_micro, micro, table); the plan splits
    # it into micro-batch x accumulation for each job's world and machine; null = no batch plan
    batch: Any = "${oc.select:batch,null}"
    # optimizer steps the recipe takes, for progress and ETA; null = unknown
    max_steps: Any = "${oc.select:recipe.max_steps,null}"
    # the key of the returned dict a sweeper optimises (Optuna ...): the job's value becomes that number; null =
    # summary_metric for sweepers that need a number, the whole return value for the basic sweeper
    optimized_metric: Any = "${oc.select:optimized_metric,null}"
    # wall-clock limit of one job, in minutes; when it is reached every rank is stopped and the job is TIMEOUT
    timeout_min: float = 60
    # names of variables copied from the launcher's own environment into every rank (secrets stay off the
    # command line and out of every file mmt writes), e.g. [HF_TOKEN, WANDB_API_KEY]
    env_from: List[str] = field(default_factory=list)
    # print each job's plan (ranks, env, command, machine, cost estimate) and start nothing
    dry_run: bool = False
    # key of the returned dict shown as the metric in the sweep summary; null = its first number
    summary_metric: Optional[str] = None
    # modules the node agent imports once before forking the ranks (recipes name what they import); never a
    # module that initialises CUDA on import. Empty: an app that never imports torch pays nothing for it.
    preload: List[str] = field(default_factory=list)
    # how the node agent starts ranks
    start_method: StartMethod = StartMethod.fork
    # seconds between SIGTERM and SIGKILL when a job's processes are stopped
    kill_grace_s: float = 1.0
    # whose output the console shows live, prefixed with job, node and rank
    console: ConsoleMode = ConsoleMode.rank0
    # seconds between machine-metrics samples of every node (metrics/node<n>.jsonl); 0 = off
    metrics_interval_s: float = 1.0
    # a name for the launch's jobs in the registry (mmt list): <name>-<job num>; null = <app>-<launch id>-<num>
    name: Optional[str] = None
    # submit every job and return at once; the jobs conclude themselves (SLURM: inside the allocation; local: in a
    # supervisor process that outlives the terminal). Basic sweeper only: each job's value is a handle (mmt.Job)
    detach: bool = False
    # serve the live page (mmt dashboard) for the sweep while the launch runs, and print its URL
    dashboard: bool = False
    # the framework whose own variables mmt writes for every process: none; tensorflow (each worker's TF_CONFIG,
    # its port held for it, TF's thread counts); jax (JAX_COORDINATOR_ADDRESS, JAX_NUM_PROCESSES, JAX_PROCESS_ID).
    # A recipe or app may set it (docs/frameworks.md)
    framework: str = "none"
    # restarts of a failed job (a rank raised, exited non-zero, was killed, its node lost): every rank stopped, then
    # the whole job started again in its dir, MMT_RESTART_COUNT one higher; never after Ctrl-C, mmt stop or the
    # time limit (docs/failures.md)
    max_restarts: int = 0
    # seconds between a failure and its restart
    restart_backoff_s: float = 1.0
    # minutes without progress (no new output from any rank, no training step) after which the job has hung: every
    # Python rank's stack is written to <job dir>/stacks/ and the job fails (and so may restart); null = off. The
    # top-level key is the recipe's (recipe=lm sets 10): it does not apply to a command run instead of the recipe
    hang_timeout_min: Any = "${oc.select:hang_timeout_min,null}"
    # jobs each job of the launch waits for: registered job names, or launch names (hydra.launcher.name: each of its
    # jobs <name>-<n>). A job starts once all of them COMPLETED, and ends CANCELLED when one ends otherwise
    after: List[str] = field(default_factory=list)
    # most jobs of the launch running at once (SLURM: %N on its job arrays; local: beside max_parallel_ranks);
    # null = no limit
    max_parallel_jobs: Optional[int] = None


@dataclass
class LocalLauncherConf(JobConf):
    """The embedded default: every job runs as N simulated nodes x M processes on this host."""

    _target_: str = "hydra_plugins.mmt_launcher.mmt_launcher.MMTLocalLauncher"
    # the backend that runs the jobs: a name in mmt.backends.registry (set by the launcher config you select)
    backend: str = "local"
    # most ranks running at once over the jobs of a sweep; a job larger than this still runs, alone.
    # null = max(4, CPU cores of this host)
    max_parallel_ranks: Optional[int] = None
    # address of node 0 (all simulated nodes share this host's loopback)
    master_addr: str = "127.0.0.1"
    # the container CLI that runs each simulated node of a job with an `image` in a container of its own
    container_runtime: LocalContainerRuntime = LocalContainerRuntime.podman
    # bind mounts for the containers: ["/host/path:/container/path", ...]; the job dir and project dir always are
    container_mounts: List[str] = field(default_factory=list)


@dataclass
class SlurmLauncherConf(JobConf):
    """Each job is one SLURM job of N nodes, submitted through submitit."""

    _target_: str = "hydra_plugins.mmt_launcher.mmt_launcher.MMTSlurmLauncher"
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


@dataclass
class RayLauncherConf(JobConf):
    """Each job is one Ray job, submitted through Ray's job submission API; its nodes one placement group."""

    _target_: str = "hydra_plugins.mmt_launcher.mmt_launcher.MMTRayLauncher"
    # the backend that runs the jobs: a name in mmt.backends.registry (set by the launcher config you select)
    backend: str = "ray"
    # the Ray dashboard, which serves the job submission API: http://<head>:8265; null = $RAY_API_SERVER_ADDRESS,
    # else $RAY_ADDRESS (as `ray job submit`)
    address: Optional[str] = None
    # CPUs of each node's placement-group bundle (its Ray node's); null = the machine's cpus
    cpus_per_node: Optional[float] = None
    # GPUs of each node's bundle; null = the machine's GPU count
    gpus_per_node: Optional[int] = None
    # custom Ray resources of each node's bundle: {name: amount}
    resources_per_node: Dict[str, float] = field(default_factory=dict)
    # Ray's runtime env of the job's driver and node agents: working_dir (a directory here, uploaded, or a URI;
    # null = the launcher's working dir, on a filesystem every node shares), pip (requirements), env_vars
    runtime_env: Dict[str, Any] = field(default_factory=lambda: {"working_dir": None, "pip": [], "env_vars": {}})
    # seconds between questions to Ray's job API; the job dir is read every 0.1 s regardless
    poll_interval_s: float = 1.0
    # seconds the cluster (its dashboard) may not answer before its jobs are concluded FAILED, lost with it
    cluster_grace_s: float = 300.0


ConfigStore.instance().store(group="hydra/launcher", name="mmt_local", node=LocalLauncherConf, provider="mmt_launcher")
ConfigStore.instance().store(group="hydra/launcher", name="mmt_slurm", node=SlurmLauncherConf, provider="mmt_launcher")
ConfigStore.instance().store(group="hydra/launcher", name="mmt_ray", node=RayLauncherConf, provider="mmt_launcher")
