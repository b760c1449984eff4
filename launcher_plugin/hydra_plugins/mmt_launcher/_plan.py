"""Plan a job: a pure function from one job's composed config to a frozen, validated ``JobPlan``.

Backends only execute plans; the dry run only renders them (plan, then submit).
"""

from dataclasses import dataclass, field
from typing import Any, Dict, List, Mapping, Optional, Tuple

from omegaconf import DictConfig, OmegaConf

from mmt.rank_env import RankPlace, topology_hints

from . import _validate as check
from ._batch import BatchPlan, plan_batch
from .errors import ConfigError

_MACHINE_KEYS = ("name", "accelerator", "gpus", "cpus")


@dataclass(frozen=True)
class Machine:
    """Hardware of one node, from the machine catalogue (conf/machine/<name>.yaml)."""

    name: str
    accelerator: str
    gpus: int
    cpus: Optional[int] = None
    memory_gb: Optional[float] = None
    gpu_type: Optional[str] = None
    gpu_memory_gb: Optional[float] = None
    instance_type: Optional[str] = None
    price_per_hour: Optional[float] = None
    price_source: Optional[str] = None

    @property
    def default_devices(self) -> int:
        return self.gpus if self.gpus > 0 else 1


#: the machine of an app that names none: this host, one process per node, no price
UNSPECIFIED_MACHINE = Machine(name="unspecified", accelerator="cpu", gpus=0)


@dataclass(frozen=True)
class JobPlan:
    """Everything needed to start one job, decided before anything starts."""

    num: int
    job_id: str
    overrides: Tuple[str, ...]
    job_dir: str
    num_nodes: int
    devices: int
    machine: Machine
    image: Optional[str]
    command: Optional[str]
    command_mode: str
    env: Mapping[str, str]
    timeout_s: float
    dry_run: bool
    summary_metric: Optional[str] = None
    preload: Tuple[str, ...] = field(default_factory=tuple)
    # the recipe's global batch split over this job's ranks; None without batch.global_size, and for commands
    batch: Optional[BatchPlan] = None

    @property
    def name(self) -> str:
        return f"job {self.num}"

    @property
    def world_size(self) -> int:
        return self.num_nodes * self.devices

    @property
    def per_node(self) -> bool:
        """True when a command runs once per node and starts the node's ranks itself."""
        return self.command is not None and self.command_mode == "per_node"

    @property
    def processes_per_node(self) -> int:
        """Processes the launcher starts per node: one in per-node command mode, else one per device."""
        return 1 if self.per_node else self.devices

    def extra_env(self) -> Dict[str, str]:
        """What every process gets on top of the rank contract: pass it as ``extra`` to rank_env / node_env.

        The batch plan; and for a command run per rank, the topology in Lightning's names, so that a Trainer or
        Fabric script that hard-codes nothing sees the whole world (per-node commands get it from node_env).
        """
        env = self.batch.env() if self.batch is not None else {}
        if self.command is not None and self.command_mode == "per_rank":
            env.update(topology_hints(self.num_nodes, self.devices))
        return env

    def places(self) -> List[RankPlace]:
        """The processes the launcher starts, in rank order (per-node mode: local_rank 0 stands for the node)."""
        return [
            RankPlace(node_rank=n, local_rank=l, num_nodes=self.num_nodes, local_world_size=self.devices)
            for n in range(self.num_nodes)
            for l in range(self.processes_per_node)
        ]

    def log_name(self, place: RankPlace) -> str:
        """The file in ``<job dir>/logs`` that one process writes (every backend, the same name)."""
        return process_log_name(place.node_rank, place.rank, self.per_node)

    def cost_estimate(self) -> Optional[float]:
        """Upper bound in USD: nodes x price per node-hour x time limit; None when the price is unknown."""
        if self.machine.price_per_hour is None:
            return None
        return self.num_nodes * self.machine.price_per_hour * self.timeout_s / 3600.0


def process_log_name(node_rank: int, rank: int, per_node: bool) -> str:
    """``node<n>.log`` for a per-node command, ``node<n>.rank<r>.log`` for a rank."""
    return f"node{node_rank}.log" if per_node else f"node{node_rank}.rank{rank}.log"


def machine_from_config(value: Any) -> Machine:
    if value is None:
        return UNSPECIFIED_MACHINE
    raw = OmegaConf.to_container(value, resolve=True) if isinstance(value, DictConfig) else value
    if not isinstance(raw, dict):
        raise ConfigError("machine", raw, "expected a machine catalogue entry (conf/machine/<name>.yaml)",
                          "pick one with machine=<name>; `python train.py --info defaults` lists the groups")
    missing = [k for k in _MACHINE_KEYS if raw.get(k) is None]
    if missing:
        raise ConfigError("machine", raw.get("name", raw), f"the catalogue entry lacks {', '.join(missing)}",
                          "every conf/machine/*.yaml needs name, accelerator, gpus and cpus")
    name = str(raw["name"])
    accelerator = check.choice(f"machine[{name}].accelerator", raw["accelerator"], ("cpu", "gpu"))
    gpus = check.whole_number(f"machine[{name}].gpus", raw["gpus"], 0, "GPUs per node, 0 on CPU machines")
    if (accelerator == "gpu") != (gpus > 0):
        raise ConfigError(f"machine[{name}].gpus", gpus, f"a {accelerator} machine has "
                          f"{'at least one GPU' if accelerator == 'gpu' else 'no GPUs'}", "fix the catalogue entry")
    price = raw.get("price_per_hour")
    if price is not None:
        price = check.positive_number(f"machine[{name}].price_per_hour", price, "USD per node-hour, or null")
    return Machine(
        name=name,
        accelerator=accelerator,
        gpus=gpus,
        cpus=check.whole_number(f"machine[{name}].cpus", raw["cpus"], 1, "vCPUs per node"),
        memory_gb=raw.get("memory_gb"),
        gpu_type=raw.get("gpu_type"),
        gpu_memory_gb=raw.get("gpu_memory_gb"),
        instance_type=raw.get("instance_type"),
        price_per_hour=price,
        price_source=raw.get("price_source"),
    )


def _devices(value: Any, machine: Machine) -> int:
    if value is None:
        return machine.default_devices
    devices = check.whole_number("devices", value, 1, "processes per node, e.g. devices=2")
    if machine.gpus and devices > machine.gpus:
        raise ConfigError(
            "devices", devices, f"machine {machine.name!r} has {machine.gpus} GPUs per node",
            f"use devices<={machine.gpus} and more nodes (num_nodes=...), or a larger machine",
        )
    return devices


def plan_job(launcher_cfg: DictConfig, *, num: int, job_id: str, overrides: List[str], job_dir: str) -> JobPlan:
    """Validate one job's values (``hydra.launcher`` of its composed config) into a ``JobPlan``."""
    machine = machine_from_config(launcher_cfg.machine)
    command = launcher_cfg.command
    if command is not None and (not isinstance(command, str) or not command.strip()):
        raise ConfigError("command", command, "expected a non-empty shell command, or null to run the recipe",
                          "e.g. command='python my_script.py --epochs 2'")
    preload = OmegaConf.select(launcher_cfg, "preload", default=None)
    num_nodes = check.whole_number("num_nodes", launcher_cfg.num_nodes, 1, "nodes per job, e.g. num_nodes=2")
    devices = _devices(launcher_cfg.devices, machine)
    return JobPlan(
        num=num,
        job_id=job_id,
        overrides=tuple(overrides),
        job_dir=job_dir,
        num_nodes=num_nodes,
        devices=devices,
        machine=machine,
        image=check.optional_text("image", launcher_cfg.image, "a container image name",
                                  "e.g. image=nvcr.io/nvidia/pytorch:24.05-py3"),
        command=command,
        command_mode=check.choice("command_mode", launcher_cfg.command_mode, check.COMMAND_MODES),
        env=check.env_vars("env", launcher_cfg.env),
        timeout_s=60.0 * check.positive_number("hydra.launcher.timeout_min", launcher_cfg.timeout_min,
                                               "minutes per job, e.g. hydra.launcher.timeout_min=30"),
        dry_run=bool(launcher_cfg.dry_run),
        summary_metric=launcher_cfg.summary_metric,
        # a command starts its own interpreters: preloading the recipe's modules would only delay it
        preload=tuple(OmegaConf.to_container(preload)) if preload is not None and command is None else (),
        # the batch section belongs to the recipe; a command replaces the recipe
        batch=None if command is not None else plan_batch(OmegaConf.select(launcher_cfg, "batch", default=None),
                                                          machine=machine, num_nodes=num_nodes, devices=devices),
    )

