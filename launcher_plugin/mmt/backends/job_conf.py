"""What every backend's ``hydra.launcher`` config holds: :class:`JobConf`, the fields that describe each job and how a
launch runs. Each backend's own config (its package's ``config`` module) is a dataclass on it, named by its
:class:`mmt.backends.spec.BackendSpec`, and stored in Hydra's ConfigStore as ``hydra/launcher=mmt_<name>``.

Imported during Hydra's plugin discovery (by every Hydra app on this interpreter): standard library, OmegaConf's
interpolations as strings, and the standard-library-only enums of ``mmt.core``.

The fields of :class:`JobConf` describe *each job* and are read from the job's own composed config, never from the
launcher's constructor (which Hydra resolves once, against the master config, so ``num_nodes=1,2`` would otherwise
launch every job with one node). Their defaults point at the app's top-level keys (``num_nodes``, ``devices``,
``machine`` ...) through ``oc.select``, so an app that uses those names needs no wiring, and any other app still
runs (1 node x 1 process). Those fields are typed ``Any``: a typed field would make OmegaConf reject a bad value
while Hydra instantiates the launcher, with a traceback, instead of mmt's planner naming the key, the value, what
is allowed and a hint. Every other field carries its real type.
"""

from dataclasses import dataclass, field
from typing import Any, List, Optional

from mmt.backends.spec import LAUNCHER_TARGET
from mmt.core.states import ConsoleMode, StartMethod


@dataclass
class JobConf:
    """What each job is, and how a launch runs. Values are validated when a job is planned (mmt.planning)."""

    # the Hydra launcher: one class for every backend (mmt.backends.spec)
    _target_: str = LAUNCHER_TARGET

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
    # the job's roles: {name: {num_nodes, devices, machine, command, command_mode, env, primary, early_exit}}, each
    # its own world; null = every node alike (docs/roles.md)
    roles: Any = "${oc.select:roles,null}"
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
    # the code every job runs: the project that holds the app, copied once per launch before the first job is
    # submitted, so an edit after the launch reaches no job (a queued one, a restart, a requeue). {enabled,
    # exclude (globs), max_mb, dir (the store; null = $MMT_HOME/snapshots)}; false = the live tree
    # (docs/snapshots.md). Typed Any: mmt's own check names a bad value in one line
    snapshot: Any = field(default_factory=lambda: {"enabled": True, "exclude": [], "max_mb": 200, "dir": None})
