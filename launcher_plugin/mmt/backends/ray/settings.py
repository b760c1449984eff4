"""The ``hydra.launcher.*`` settings of cluster=ray, in Ray's own vocabulary, validated (pure, no I/O).

* ``address``: the cluster's dashboard, which serves the job submission API (``http://<head>:8265``); null takes
  ``RAY_API_SERVER_ADDRESS`` or ``RAY_ADDRESS``, as ``ray job submit`` does;
* what each mmt node asks of its Ray node: ``cpus_per_node``, ``gpus_per_node`` (null: the machine's) and
  ``resources_per_node`` (custom resources), one placement-group bundle per node;
* ``runtime_env``: what Ray sets up for the job's driver and node agents: ``working_dir``, ``pip``, ``env_vars``.
"""

import os
import re
from dataclasses import dataclass, field
from typing import Any, Dict, Mapping, Optional, Tuple

from omegaconf import DictConfig

from mmt.backends import settings as common
from mmt.backends.silence import DEFAULT_GRACE_S, GRACE_KEY
from mmt.core.errors import ConfigError
from mmt.core.states import StartMethod
from mmt.planning import validate as check
from mmt.planning.plan import JobPlan

# what ``ray job submit`` reads when no address is given, in its order
ADDRESS_VARS = ("RAY_API_SERVER_ADDRESS", "RAY_ADDRESS")
RUNTIME_ENV_KEYS = ("working_dir", "pip", "env_vars")
# resources with a key of their own (or none a bundle may ask for by name)
_NAMED = {"CPU": "cpus_per_node", "GPU": "gpus_per_node", "memory": None, "object_store_memory": None}
_ADDRESS = re.compile(r"^(https?://)?[A-Za-z0-9._\-\[\]:]+(:\d+)?/?$")


@dataclass(frozen=True)
class RuntimeEnv:
    """What Ray installs for the job before its driver runs (and for every actor it starts)."""

    working_dir: Optional[str] = None
    pip: Tuple[str, ...] = ()
    env_vars: Tuple[Tuple[str, str], ...] = field(default=(), repr=False)

    def to_ray(self) -> Dict[str, Any]:
        """Ray's ``runtime_env`` dict (only what is set)."""
        env: Dict[str, Any] = {}
        if self.working_dir is not None:
            env["working_dir"] = self.working_dir
        if self.pip:
            env["pip"] = list(self.pip)
        if self.env_vars:
            env["env_vars"] = dict(self.env_vars)
        return env

    @property
    def local_working_dir(self) -> bool:
        """A directory of this machine, which the client uploads (a URI, ``s3://...``, is fetched by the cluster)."""
        return self.working_dir is not None and "://" not in self.working_dir


@dataclass(frozen=True)
class RaySettings:
    """``hydra.launcher.*`` of cluster=ray, validated."""

    address: Optional[str]
    cpus_per_node: Optional[float]
    gpus_per_node: Optional[int]
    resources_per_node: Tuple[Tuple[str, float], ...]
    runtime_env: RuntimeEnv
    poll_interval_s: float
    # seconds between SIGTERM and SIGKILL when a node agent stops its ranks
    kill_grace_s: float = 1.0
    start_method: str = StartMethod.fork.value
    # seconds the cluster may not answer before its jobs are concluded lost with it (mmt.backends.silence)
    cluster_grace_s: float = DEFAULT_GRACE_S

    @classmethod
    def for_watching(cls, poll_interval_s: float = 1.0) -> "RaySettings":
        """What following jobs another process submitted needs: each job's own address is in its attempt dir."""
        return cls(
            address=None,
            cpus_per_node=None,
            gpus_per_node=None,
            resources_per_node=(),
            runtime_env=RuntimeEnv(),
            poll_interval_s=poll_interval_s,
        )

    @classmethod
    def from_config(cls, cfg: DictConfig) -> "RaySettings":
        raw = common.plain_values(cfg, (k for k in _SETTINGS if k not in _OPTIONAL), _OPTIONAL)
        limit = raw.pop("max_parallel_jobs")
        if limit is not None:
            raise ConfigError(
                "hydra.launcher.max_parallel_jobs",
                limit,
                "cluster=ray does not limit a launch's jobs at once: Ray queues each job's placement group until "
                "its nodes are free",
                "drop it; a launch takes the cluster's free nodes and its other jobs wait for them",
            )
        return cls(**common.validated(raw, _SETTINGS))

    def bundle(self, plan: JobPlan) -> Dict[str, float]:
        """What one mmt node asks of its Ray node: one placement-group bundle (CPUs, GPUs, custom resources).
        CPUs: the setting, else the machine's, else 1 (a bundle may not be empty)."""
        cpus = self.cpus_per_node if self.cpus_per_node is not None else float(plan.machine.cpus or 1)
        gpus = self.gpus_per_node if self.gpus_per_node is not None else plan.machine.gpus
        bundle = {"CPU": float(cpus)}
        if gpus:
            bundle["GPU"] = float(gpus)
        bundle.update(dict(self.resources_per_node))
        return bundle


def cluster_address(value: Any, environ: Mapping[str, str]) -> Optional[str]:
    """The dashboard's address (``http://host:port``): the setting, else ``ray job submit``'s variables; None when
    neither names one (said by the backend's problems, so that a dry run still prints the plan)."""
    key = "hydra.launcher.address"
    if value is None:
        value = next((environ[name] for name in ADDRESS_VARS if environ.get(name)), None)
        key = next((name for name in ADDRESS_VARS if environ.get(name)), key)
        if value is None:
            return None
    value = check.plain(value)
    if not isinstance(value, str) or not _ADDRESS.match(value.strip()) or value.startswith(("ray://", "auto")):
        raise ConfigError(
            key,
            value,
            "expected the Ray dashboard's address, which serves the job submission API: http://<head>:8265",
            "e.g. hydra.launcher.address=http://127.0.0.5:8265 (the test cluster: "
            'eval "$(scripts/ray_cluster.sh env)")',
        )
    value = value.strip().rstrip("/")
    return value if "://" in value else f"http://{value}"


def _resources(value: Any) -> Tuple[Tuple[str, float], ...]:
    key = "hydra.launcher.resources_per_node"
    if value is None:
        return ()
    if not isinstance(value, Mapping):
        raise ConfigError(key, value, "expected a mapping of Ray resource names to amounts", f"e.g. {key}.TPU=4")
    found = []
    for name, amount in value.items():
        if name in _NAMED:
            own = _NAMED[name]
            raise ConfigError(
                f"{key}.{name}",
                amount,
                f"{name} is not a custom resource"
                + (f": it has a key of its own, hydra.launcher.{own}" if own else ": mmt asks for none"),
                f"use hydra.launcher.{own}" if own else f"drop {name}",
            )
        number = check.plain(amount)
        if isinstance(number, bool) or not isinstance(number, (int, float)) or number < 0:
            raise ConfigError(f"{key}.{name}", amount, "expected an amount >= 0", f"e.g. {key}.{name}=1")
        found.append((str(name), float(number)))
    return tuple(sorted(found))


def _runtime_env(value: Any) -> RuntimeEnv:
    key = "hydra.launcher.runtime_env"
    if value is None:
        return RuntimeEnv()
    if not isinstance(value, Mapping):
        raise ConfigError(key, value, f"expected a mapping with {', '.join(RUNTIME_ENV_KEYS)}", f"e.g. {key}.pip=[x]")
    unknown = sorted(str(k) for k in value if k not in RUNTIME_ENV_KEYS)
    if unknown:
        raise ConfigError(
            f"{key}.{unknown[0]}",
            value[unknown[0]],
            "mmt passes working_dir, pip and env_vars to Ray's runtime env",
            "set the cluster's image or its own runtime env for anything else",
        )
    working_dir = check.optional_text(
        f"{key}.working_dir", value.get("working_dir"), "a directory or a URI", f"e.g. {key}.working_dir=."
    )
    pip = value.get("pip") or []
    if isinstance(pip, str):
        pip = [pip]
    if not isinstance(pip, list) or not all(isinstance(p, str) and p.strip() for p in pip):
        raise ConfigError(f"{key}.pip", pip, "expected a list of pip requirements", f"e.g. {key}.pip=[requests]")
    if working_dir is not None and "://" not in working_dir:  # a directory here, which the client uploads
        working_dir = os.path.abspath(check.one_line(f"{key}.working_dir", working_dir))
        if not os.path.isdir(working_dir):
            raise ConfigError(
                f"{key}.working_dir",
                working_dir,
                "no such directory on this machine (Ray uploads it from here)",
                f"name a directory, e.g. {key}.working_dir=., or a URI the cluster can fetch (s3://...)",
            )
    env_vars = check.env_vars(f"{key}.env_vars", value.get("env_vars"))
    return RuntimeEnv(
        working_dir=working_dir,
        pip=tuple(check.one_line(f"{key}.pip", p) for p in pip),
        env_vars=tuple(sorted(env_vars.items())),
    )


# hydra.launcher.* of cluster=ray -> its check, in the order they are checked (the fields of RaySettings)
_SETTINGS: Dict[str, common.Check] = {
    "address": lambda value: cluster_address(value, os.environ),
    "cpus_per_node": common.unless_none(
        lambda value: check.positive_number(common.key("cpus_per_node"), value, "e.g. hydra.launcher.cpus_per_node=4")
    ),
    "gpus_per_node": common.unless_none(
        lambda value: check.whole_number(common.key("gpus_per_node"), value, 0, "e.g. hydra.launcher.gpus_per_node=8")
    ),
    "resources_per_node": _resources,
    "runtime_env": _runtime_env,
    "poll_interval_s": common.poll_interval_s,
    "kill_grace_s": common.kill_grace_s,
    "start_method": common.start_method,
    "cluster_grace_s": lambda value: check.positive_number(
        GRACE_KEY, value, "seconds the cluster may not answer before its jobs are lost, e.g. 300", maximum=86400
    ),
}
# what an older config may lack, and its value then; max_parallel_jobs is refused (Ray queues the jobs itself)
_OPTIONAL = {"cluster_grace_s": DEFAULT_GRACE_S, "max_parallel_jobs": None}
