"""Plan a job: a pure function from one job's composed launcher config to a frozen, validated ``JobPlan``.

Backends only execute plans; the dry run only renders them (plan, then submit).
"""

from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Dict, List, Mapping, Optional, Tuple

from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from mmt.core.errors import ConfigError
from mmt.core.jobdir import JobDir
from mmt.core.rank_env import (
    FRAMEWORK_NONE,
    FRAMEWORKS,
    TENSORFLOW,
    RankPlace,
    elastic_env,
    framework_port_count,
    topology_hints,
)
from mmt.core.snapshot import CodeSnapshot
from mmt.planning import validate as check
from mmt.planning.batch import BatchPlan, plan_batch
from mmt.planning.elastic import ElasticPlan, node_range, plan_elastic
from mmt.planning.machine import Machine, machine_from_config
from mmt.planning.roles import JobDefaults, RolePlan, plan_roles


@dataclass(frozen=True)
class Limits:
    """What one backend can run: a job beyond these is refused before a single rank is planned."""

    max_nodes: int
    max_devices: int
    max_world: int
    why: str
    # what to do instead, said when a job is over a limit
    hint: str = "use fewer nodes or devices"


@dataclass(frozen=True)
class JobPlan:
    """Everything needed to start one job, decided before anything starts."""

    num: int
    # the job's name in the registry (`mmt list`, `mmt logs NAME`); unique
    name: str
    # unique per launch: MMT_JOB_ID, and how every process of the job is found again
    job_id: str
    overrides: Tuple[str, ...]
    job_dir: str
    num_nodes: int
    devices: int
    machine: Machine
    image: Optional[str]
    command: Optional[str]
    command_mode: str
    # the user's variables (values are never printed) and the names copied from the launcher's environment
    env: Mapping[str, str]
    timeout_s: float
    dry_run: bool = False
    env_from: Tuple[str, ...] = ()
    summary_metric: Optional[str] = None
    preload: Tuple[str, ...] = field(default_factory=tuple)
    # the recipe's global batch split over this job's ranks; None without batch.global_size, and for commands
    batch: Optional[BatchPlan] = None
    # optimizer steps the recipe will take, for progress and ETA (null: unknown)
    max_steps: Optional[int] = None
    # seconds between machine-metrics samples of each node; 0 = none
    metrics_interval_s: float = 0.0
    # the framework whose own variables mmt writes (TF_CONFIG, JAX's coordinator): none, tensorflow or jax
    framework: str = FRAMEWORK_NONE
    # the key a sweeper optimises (hydra.launcher.optimized_metric, the template's top-level optimized_metric): an
    # app that returns a number returns that key's value, so the summary calls the number by that key
    optimized_metric: Optional[str] = None
    # a failed job (a rank raised, exited non-zero, was killed, its node lost) starts again this many times at most,
    # all of its ranks, in the same job dir (the recipes resume from their last checkpoint); never after a stop
    max_restarts: int = 0
    # seconds between a failure and the restart
    restart_backoff_s: float = 1.0
    # a job whose ranks show no progress (no new output, no step) for this long has hung: it fails (and so may
    # restart), every Python rank's stack written first; None = never
    hang_timeout_s: Optional[float] = None
    # the jobs it waits for (hydra.launcher.after), as given: registered job names, or launch names
    after: Tuple[str, ...] = ()
    # its roles (roles.<name>.*), the primary first; () for a job whose nodes are all alike. With roles, num_nodes
    # counts every role's nodes, and the topology, command and env of the job's fields are the primary role's
    roles: Tuple[RolePlan, ...] = ()
    # num_nodes=MIN:MAX (None: a fixed count): num_nodes is the world's node count now (MAX at the start), and
    # generation how many times the world was formed again after a node was lost or joined (MMT_WORLD_GENERATION)
    elastic: Optional[ElasticPlan] = None
    generation: int = 0
    # the launch's copy of the project that every process of the job imports from (None: the live tree)
    snapshot: Optional[CodeSnapshot] = None

    @property
    def label(self) -> str:
        return f"job {self.num}"

    @property
    def world_size(self) -> int:
        if self.roles:
            return sum(role.world_size for role in self.roles)
        return self.num_nodes * self.devices

    @property
    def per_node(self) -> bool:
        """True when a command runs once per node and starts the node's ranks itself."""
        return self.command is not None and self.command_mode == "per_node"

    @property
    def processes_per_node(self) -> int:
        """Processes the launcher starts per node: one in per-node command mode, else one per device."""
        return 1 if self.per_node else self.devices

    @property
    def process_count(self) -> int:
        if self.roles:
            return sum(role.process_count for role in self.roles)
        return self.num_nodes * self.processes_per_node

    @property
    def topology(self) -> str:
        """``2 x 2``; with roles, each role's: ``trainer 2 x 2 + scorer 1 x 1``."""
        if self.roles:
            return " + ".join(f"{role.name} {role.num_nodes} x {role.devices}" for role in self.roles)
        return f"{self.num_nodes} x {self.devices}"

    @property
    def images(self) -> Tuple[str, ...]:
        """Every image the job's nodes run in (with roles, each role's, once); () when all run in this environment."""
        if self.roles:
            return tuple(dict.fromkeys(role.image for role in self.roles if role.image is not None))
        return () if self.image is None else (self.image,)

    # ------------------------------------------------------------------------------------------ roles

    def role_at(self, index: int) -> Optional[RolePlan]:
        """The role of process ``index``; None for a job without roles."""
        return next((role for role in self.roles if index in role.indices), None)

    def role_named(self, name: str) -> RolePlan:
        return next(role for role in self.roles if role.name == name)

    def for_role(self, role: RolePlan) -> "JobPlan":
        """The role as a job of its own: its topology, command and env (on top of the job's), so that its
        processes get the rank contract of their own world. The recipe's batch plan is the primary role's."""
        return replace(
            self,
            num_nodes=role.num_nodes,
            devices=role.devices,
            machine=role.machine,
            image=role.image,
            command=role.command,
            command_mode=role.command_mode,
            env={**self.env, **role.env},
            batch=self.batch if role.primary else None,
            preload=self.preload if role.command is None else (),
            roles=(),
        )

    def log_path(self, index: int) -> Path:
        """Process ``index``'s log: ``logs/node<n>.rank<r>.log``; with roles, in ``logs/<role>/``."""
        job_dir, place = JobDir(Path(self.job_dir)), self.place(index)
        role = self.role_at(index) if self.roles else None
        if role is None:
            return job_dir.log(place.node_rank, place.rank, self.per_node)
        return job_dir.role_log(role.name, place.node_rank, place.rank, role.per_node)

    @property
    def secret_names(self) -> Tuple[str, ...]:
        """Every variable whose value mmt hides: the user's env and the copied names."""
        return tuple(self.env) + tuple(name for role in self.roles for name in role.env) + self.env_from

    def extra_env(self) -> Dict[str, str]:
        """What every process gets on top of the rank contract.

        The batch plan; and for a command run per rank, the topology in Lightning's names, so that a Trainer or
        Fabric script that hard-codes nothing sees the whole world (per-node commands get it from the contract).
        """
        env = self.batch.env() if self.batch is not None else {}
        if self.command is not None and self.command_mode == "per_rank":
            env.update(topology_hints(self.num_nodes, self.devices))
        if self.elastic is not None:
            env.update(elastic_env(self.generation, self.elastic.min_nodes, self.elastic.max_nodes))
        return env

    def at_world(self, nodes: int, generation: int) -> "JobPlan":
        """The elastic job's plan for its world of ``nodes`` nodes, formed for the ``generation``-th time: the same
        global batch, split for that world."""
        assert self.elastic is not None
        return replace(self, num_nodes=nodes, batch=self.elastic.batch_for(nodes), generation=generation)

    @property
    def framework_port_count(self) -> int:
        """Ports held for the framework besides MASTER_PORT: one per TensorFlow worker, one for JAX's coordinator."""
        return framework_port_count(self.framework, self.process_count)

    def framework_port_indices(self, node_rank: int) -> List[int]:
        """Which of the framework ports node ``node_rank`` holds: its own workers' (TensorFlow), or the
        coordinator's on node 0 (JAX)."""
        if self.framework == TENSORFLOW:
            return list(self.node_indices(node_rank))
        return [0] if self.framework_port_count and node_rank == 0 else []

    def place(self, index: int) -> RankPlace:
        """Process ``index`` (the global rank; per-node mode: the node) as a place in the job; with roles, in its
        role's own world."""
        role = self.role_at(index) if self.roles else None
        if role is not None:
            node, local = divmod(index - role.first_index, role.processes_per_node)
            return RankPlace(node_rank=node, local_rank=local, num_nodes=role.num_nodes, local_world_size=role.devices)
        node, local = divmod(index, self.processes_per_node)
        return RankPlace(node_rank=node, local_rank=local, num_nodes=self.num_nodes, local_world_size=self.devices)

    def places(self) -> List[RankPlace]:
        """The processes the launcher starts, in rank order (per-node mode: local_rank 0 stands for the node)."""
        return [self.place(index) for index in range(self.process_count)]

    def node_indices(self, node_rank: int) -> range:
        """The process indices that run on node ``node_rank`` (with roles: the job's node index)."""
        for role in self.roles:
            if node_rank in role.nodes:
                first = role.first_index + (node_rank - role.first_node) * role.processes_per_node
                return range(first, first + role.processes_per_node)
        return range(node_rank * self.processes_per_node, (node_rank + 1) * self.processes_per_node)

    def describe_place(self, place: RankPlace) -> str:
        return f"node {place.node_rank}" if self.per_node else f"rank {place.rank} (node {place.node_rank})"

    def describe_process(self, index: int) -> str:
        """Process ``index`` in words: ``rank 3 (node 1)``; with roles, ``role scorer rank 0 (node 0)``."""
        role = self.role_at(index) if self.roles else None
        if role is None:
            return self.describe_place(self.place(index))
        own = self.for_role(role)
        return f"role {role.name} {own.describe_place(self.place(index))}"

    def cost_estimate(self) -> Optional[float]:
        """Upper bound in USD: nodes x price per node-hour x time limit; None when the price is unknown."""
        if self.machine.price_per_hour is None:
            return None
        if self.roles:
            prices = [(role.num_nodes, role.machine.price_per_hour) for role in self.roles]
            if any(price is None for _, price in prices):
                return None
            return sum(nodes * (price or 0.0) for nodes, price in prices) * self.timeout_s / 3600.0
        return self.num_nodes * self.machine.price_per_hour * self.timeout_s / 3600.0


def _role_machine(key: str, value: Any) -> Machine:
    """A role's own machine: a catalogue entry composed into the role, as the job's is."""
    if not isinstance(value, (dict, DictConfig)):
        role = key.split(".")[1]
        raise ConfigError(
            key,
            value,
            "expected a machine catalogue entry composed into the role, not its name",
            f"compose it: - /machine@{role}.machine: <name> in the roles config's defaults, "
            f"or +machine@roles.{role}.machine=<name> on the command line",
        )
    return machine_from_config(value)


def _devices(value: Any, machine: Machine, key: str = "devices") -> int:
    if value is None:
        return machine.default_devices
    devices = check.whole_number(key, value, 1, f"processes per node, e.g. {key}=2")
    if machine.gpus and devices > machine.gpus:
        raise ConfigError(
            key,
            devices,
            f"machine {machine.name!r} has {machine.gpus} GPUs per node",
            f"use devices<={machine.gpus} and more nodes (num_nodes=...), or a larger machine",
        )
    return devices


def _within(limits: Limits, num_nodes: int, devices: int) -> None:
    if num_nodes > limits.max_nodes:
        raise ConfigError(
            "num_nodes",
            num_nodes,
            f"at most {limits.max_nodes:,} nodes per job ({limits.why})",
            "use fewer nodes, or another cluster",
        )
    if devices > limits.max_devices:
        raise ConfigError(
            "devices",
            devices,
            f"at most {limits.max_devices:,} processes per node ({limits.why})",
            "use fewer devices per node",
        )
    if num_nodes * devices > limits.max_world:
        raise ConfigError(
            "num_nodes",
            num_nodes,
            f"{num_nodes:,} nodes x {devices:,} devices is more than the "
            f"{limits.max_world:,} processes per job this backend runs ({limits.why})",
            limits.hint,
        )


def plan_job(
    launcher_cfg: DictConfig,
    *,
    num: int,
    name: str,
    job_id: str,
    overrides: List[str],
    job_dir: str,
    limits: Limits,
    launcher_env: Mapping[str, str],
) -> JobPlan:
    """Validate one job's values (``hydra.launcher`` of its composed config) into a ``JobPlan``.

    ``launcher_env``: the launcher's own environment, where ``env_from`` names are looked up.
    """
    job_dir = check.one_line("hydra.sweep.dir", job_dir, "choose a sweep dir without a newline")
    machine = machine_from_config(launcher_cfg.machine)
    command = _command(launcher_cfg.command)
    num_nodes, elastic_range = _num_nodes(launcher_cfg.num_nodes)
    devices = _devices(launcher_cfg.devices, machine)
    framework, command_mode = _framework_and_mode(launcher_cfg, command, devices)
    image = _image("image", launcher_cfg.image)
    roles = _roles(launcher_cfg, JobDefaults(num_nodes, devices, machine, command, command_mode, image), framework)
    env = check.env_vars("env", launcher_cfg.env)
    if roles:  # the job's own fields become the primary role's; its node count, every role's
        primary = roles[0]
        num_nodes, devices, machine, image, command, command_mode = (
            sum(role.num_nodes for role in roles),
            primary.devices,
            primary.machine,
            primary.image,
            primary.command,
            primary.command_mode,
        )
        _roles_within(limits, roles)
    else:
        _within(limits, num_nodes, devices)  # before anything is planned per rank
    preload = OmegaConf.select(launcher_cfg, "preload", default=None)
    max_steps = OmegaConf.select(launcher_cfg, "max_steps", default=None)
    interval = _metrics_interval(launcher_cfg)
    batch_nodes = roles[0].num_nodes if roles else num_nodes
    elastic = _elastic(launcher_cfg, elastic_range, roles, machine, devices, command)
    if elastic is not None:
        batch = elastic.batch_for(num_nodes)
    else:  # the batch section belongs to the recipe; a command replaces the recipe
        batch = None if command is not None else _batch(launcher_cfg, machine, batch_nodes, devices)
    return JobPlan(
        num=num,
        name=name,
        job_id=job_id,
        overrides=tuple(overrides),
        job_dir=job_dir,
        num_nodes=num_nodes,
        devices=devices,
        machine=machine,
        image=image,
        command=command,
        command_mode=command_mode,
        env=env,
        env_from=tuple(
            check.env_names("hydra.launcher.env_from", OmegaConf.select(launcher_cfg, "env_from"), launcher_env)
        ),
        timeout_s=_timeout_s(launcher_cfg),
        dry_run=bool(launcher_cfg.dry_run),
        summary_metric=launcher_cfg.summary_metric,
        preload=_preload(preload, command),
        batch=batch,
        max_steps=_max_steps(max_steps),
        metrics_interval_s=float(interval),
        framework=framework,
        optimized_metric=_optimized_metric(launcher_cfg),
        **_restart_policy(launcher_cfg, recipe_runs=command is None),
        after=_after(launcher_cfg),
        roles=roles,
        elastic=elastic,
    )


def _roles(launcher_cfg: DictConfig, defaults: JobDefaults, framework: str) -> Tuple[RolePlan, ...]:
    roles = plan_roles(
        OmegaConf.select(launcher_cfg, "roles", default=None),
        defaults,
        devices_of=lambda key, value, machine: _devices(value, machine, key),
        command_of=lambda key, value: _command(value, key),
        env_of=check.env_vars,
        machine_of=_role_machine,
        image_of=_image,
    )
    if roles and framework != FRAMEWORK_NONE:
        raise ConfigError(
            "hydra.launcher.framework",
            framework,
            "a job with roles writes each role's own rank contract; a framework's variables span one world",
            "set TF_CONFIG or JAX's coordinator in the role's script from its MMT_ROLE_* variables",
        )
    return roles


def _roles_within(limits: Limits, roles: Tuple[RolePlan, ...]) -> None:
    """Every role's nodes and processes together, within what the backend runs."""
    _within(limits, sum(role.num_nodes for role in roles), max(role.devices for role in roles))
    if sum(role.world_size for role in roles) > limits.max_world:
        raise ConfigError(
            "roles",
            ", ".join(role.name for role in roles),
            f"{sum(role.world_size for role in roles):,} processes in all is more than the "
            f"{limits.max_world:,} this backend runs ({limits.why})",
            limits.hint,
        )


def _num_nodes(value: Any) -> Tuple[int, Optional[Tuple[int, int]]]:
    """``num_nodes``: a count, or ``MIN:MAX`` (an elastic job starts with up to MAX nodes): (nodes, the range)."""
    elastic_range = node_range(value)
    if elastic_range is not None:
        return elastic_range[1], elastic_range
    return check.whole_number("num_nodes", value, 1, "nodes per job, e.g. num_nodes=2"), None


def _elastic(
    launcher_cfg: DictConfig,
    node_counts: Optional[Tuple[int, int]],
    roles: Tuple[RolePlan, ...],
    machine: Machine,
    devices: int,
    command: Optional[str],
) -> Optional[ElasticPlan]:
    """``num_nodes=MIN:MAX``: the batch plan of every world from MIN to MAX nodes (None: a fixed node count)."""
    if node_counts is None:
        return None
    low, high = node_counts
    if roles:
        raise ConfigError(
            "num_nodes",
            f"{low}:{high}",
            "a job with roles is not elastic: each role has its own node count",
            "give num_nodes a count, e.g. num_nodes=2",
        )
    return plan_elastic(
        low,
        high,
        devices,
        lambda nodes: None if command is not None else _batch(launcher_cfg, machine, nodes, devices),
        OmegaConf.select(launcher_cfg, "batch.global_size", default=None),
    )


def _image(key: str, value: Any) -> Optional[str]:
    return check.optional_text(key, value, "a container image name", f"e.g. {key}=nvcr.io/nvidia/pytorch:24.05-py3")


def _command(command: Any, key: str = "command") -> Optional[str]:
    """The job's shell command, or None to run the recipe."""
    if command is not None and (not isinstance(command, str) or not command.strip()):
        raise ConfigError(
            key,
            command,
            "expected a non-empty shell command, or null to run the recipe",
            f"e.g. {key}='python my_script.py --epochs 2'",
        )
    return command


def _metrics_interval(launcher_cfg: DictConfig) -> float:
    """Seconds between machine-metrics samples: 0 (off), or at least 0.1."""
    interval = OmegaConf.select(launcher_cfg, "metrics_interval_s", default=0.0) or 0.0
    if interval:
        interval = check.positive_number(
            "hydra.launcher.metrics_interval_s",
            interval,
            "seconds between samples, >= 0.1, or 0 for none",
            maximum=3600,
        )
        if interval < 0.1:
            raise ConfigError(
                "hydra.launcher.metrics_interval_s",
                interval,
                "expected 0 (off) or at least 0.1 s",
                "e.g. hydra.launcher.metrics_interval_s=1",
            )
    return interval


def _framework_and_mode(launcher_cfg: DictConfig, command: Optional[str], devices: int) -> Tuple[str, str]:
    """The framework whose variables mmt writes, and the command mode, which must agree."""
    framework = check.choice(
        "hydra.launcher.framework", OmegaConf.select(launcher_cfg, "framework", default=FRAMEWORK_NONE), FRAMEWORKS
    )
    command_mode = check.choice("command_mode", launcher_cfg.command_mode, check.COMMAND_MODES)
    if framework == TENSORFLOW and command is not None and command_mode == "per_node" and devices > 1:
        raise ConfigError(
            "hydra.launcher.framework",
            framework,
            f"a TensorFlow worker is one process, and "
            f"command_mode=per_node starts one command per node for {devices} devices",
            "add command_mode=per_rank (one worker per rank), or use devices=1",
        )
    return framework, command_mode


def _timeout_s(launcher_cfg: DictConfig) -> float:
    return 60.0 * check.positive_number(
        "hydra.launcher.timeout_min",
        launcher_cfg.timeout_min,
        "minutes per job, e.g. hydra.launcher.timeout_min=30",
        maximum=check.MAX_TIMEOUT_MIN,
    )


def _preload(preload: Any, command: Optional[str]) -> Tuple[str, ...]:
    # a command starts its own interpreters: preloading the recipe's modules would only delay it
    if preload is None or command is not None:
        return ()
    return tuple(map(str, OmegaConf.to_container(preload) or ()))


def _batch(launcher_cfg: DictConfig, machine: Machine, num_nodes: int, devices: int) -> Optional[BatchPlan]:
    return plan_batch(
        OmegaConf.select(launcher_cfg, "batch", default=None), machine=machine, num_nodes=num_nodes, devices=devices
    )


def _max_steps(max_steps: Any) -> Optional[int]:
    """The recipe's optimizer steps, for progress and ETA; None: unknown."""
    if isinstance(max_steps, int) and not isinstance(max_steps, bool) and max_steps > 0:
        return max_steps
    return None


def _after(launcher_cfg: DictConfig) -> Tuple[str, ...]:
    return tuple(
        check.names_list(
            "hydra.launcher.after",
            OmegaConf.select(launcher_cfg, "after", default=None),
            "registered job names or launch names, e.g. hydra.launcher.after=[prep]",
        )
    )


def _restart_policy(launcher_cfg: DictConfig, recipe_runs: bool) -> Dict[str, Any]:
    """max_restarts, restart_backoff_s and hang_timeout_s, validated (absent keys: an older config, the defaults).
    A hang timeout the recipe set (the top-level key, not ``hydra.launcher.hang_timeout_min`` itself) is the recipe's
    and is left out when a command runs instead: a silent command is not a silent training loop."""
    restarts = OmegaConf.select(launcher_cfg, "max_restarts", default=0)
    backoff = OmegaConf.select(launcher_cfg, "restart_backoff_s", default=1.0)
    from_recipe = "hang_timeout_min" in launcher_cfg and OmegaConf.is_interpolation(launcher_cfg, "hang_timeout_min")
    hang = None if from_recipe and not recipe_runs else OmegaConf.select(launcher_cfg, "hang_timeout_min", default=None)
    return {
        "max_restarts": check.whole_number(
            "hydra.launcher.max_restarts", restarts, 0, "restarts after a failure, e.g. 3 (0: none)", maximum=1000
        ),
        "restart_backoff_s": 0.0
        if backoff == 0
        else check.positive_number(
            "hydra.launcher.restart_backoff_s", backoff, "seconds before a restart, e.g. 5 (0: at once)", 3600
        ),
        "hang_timeout_s": None
        if hang is None
        else 60.0
        * check.positive_number(
            "hydra.launcher.hang_timeout_min",
            hang,
            "minutes without progress before a job counts as hung, e.g. 10 (null: off)",
            maximum=check.MAX_TIMEOUT_MIN,
        ),
    }


def _optimized_metric(launcher_cfg: DictConfig) -> Optional[str]:
    try:
        key = OmegaConf.select(launcher_cfg, "optimized_metric", default=None)
    except OmegaConfBaseException:  # an interpolation that does not resolve: the sweeper's own check names it
        return None
    return key if isinstance(key, str) and key else None
