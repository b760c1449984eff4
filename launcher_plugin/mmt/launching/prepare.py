"""Preparing jobs for the engine from Hydra configs, for every front end (the Hydra launcher, the ``mmt`` CLI, the
SDK): each job's config composed once from the sweep's master config and its overrides, its output dir frozen, its
plan made, its payload packed; plus what comes before that (the backend, the local agent warmed with what the jobs
will preload, the sweep dir checked and claimed). What a launch does with prepared jobs is the launch session's.

* Every job's config is composed here, in the launcher process, once: ranks never re-compose (one ``${now:}``, one
  output dir), and per-job values (``num_nodes=1,2``) come from each job's own config. The launcher takes the
  config the sweeper composed to check the batch (``compose_once``) instead of composing it a second time.
"""

import os
import re
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Callable, Optional, Sequence, Tuple

from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.core.singleton import Singleton
from hydra.errors import HydraException
from omegaconf import DictConfig, OmegaConf, open_dict
from omegaconf.errors import OmegaConfBaseException

from mmt.backends.base import Backend
from mmt.backends.registry import UnknownBackendError, backend_class
from mmt.backends.registry import names as backend_names
from mmt.core import launch_id
from mmt.core.errors import ConfigError
from mmt.core.snapshot import CodeSnapshot
from mmt.launching import snapshot as code_snapshot
from mmt.launching.compose_once import ComposeOnce, compose_job
from mmt.launching.jobs import PreparedJob
from mmt.launching.snapshot import LaunchSnapshot
from mmt.planning import validate as check
from mmt.planning.conflicts import check_strategies
from mmt.planning.plan import JobPlan, plan_job
from mmt.records import ownership
from mmt.records.payload import JobPayload

_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,80}$")
# Hydra's own grid sweeper: every job of the launch is known up front, from the command line's overrides
BASIC_SWEEPER = "hydra._internal.core_plugins.basic_sweeper.BasicSweeper"


def make_backend(launcher_cfg: DictConfig) -> Backend[Any]:
    """The launch's backend, by the launcher config's ``backend`` name, built from its validated settings."""
    name = OmegaConf.select(launcher_cfg, "backend")
    try:
        cls = backend_class(str(name))
    except UnknownBackendError:
        raise ConfigError(
            "hydra.launcher.backend",
            name,
            f"expected one of [{', '.join(backend_names())}]",
            f"select a launcher with cluster=<name> (hydra/launcher={'|'.join(f'mmt_{n}' for n in backend_names())})",
        ) from None
    return cls.from_config(launcher_cfg)


def keep_composed_jobs(hydra_context: Any) -> None:
    """Called in the launcher's setup(), before the sweeper checks its first batch."""
    ComposeOnce.install(hydra_context.config_loader)


# what decides a job's preload: when a sweep varies one of these config groups or values, the jobs may preload
# something else (a value inside the recipe, recipe.lr, does not)
_PRELOAD_GROUPS = ("recipe", "cluster", "hydra/launcher")
_PRELOAD_VALUES = ("command", "image", "hydra.launcher.preload", "hydra.launcher.command", "hydra.launcher.image")


def warm_up(backend: Backend[Any], config: DictConfig, snapshot: Optional[LaunchSnapshot] = None) -> None:
    """Start what every launch needs (the host agent) before it is needed, importing the launch's preload meanwhile
    (the master config's, unless the sweep varies what decides it: then the first job's start imports it), from the
    launch's snapshot of the project."""
    if backend.warms_up and not OmegaConf.select(config, "hydra.launcher.dry_run"):
        backend.warm_up(expected_preload(config), snapshot.snapshot if snapshot is not None else None)


def take_snapshot(config: DictConfig, task_function: Any) -> Optional[LaunchSnapshot]:
    """The launch's snapshot of the project (None: off, or an installed app); a dry run's is identified only."""
    return code_snapshot.take(config, task_function, dry_run=bool(OmegaConf.select(config, "hydra.launcher.dry_run")))


def host_preload(plan: JobPlan) -> Tuple[str, ...]:
    """What the backend's agent here imports for this job: its preload, or nothing when its ranks run in an image
    (each node's agent there imports it in the image's Python)."""
    return () if plan.image is not None else plan.preload


def expected_preload(config: DictConfig) -> Tuple[str, ...]:
    """What the launch's jobs will preload here, as far as the master config says: its recipe's ``preload``, unless a
    command replaces the recipe, its ranks run in an image, or the sweep (its overrides, or a sweeper's own params)
    may change either."""
    launcher = config.hydra.launcher
    try:
        preload = OmegaConf.select(launcher, "preload", default=None)
        if preload is None or OmegaConf.select(launcher, "command", default=None) is not None:
            return ()
        if OmegaConf.select(launcher, "image", default=None) is not None:
            return ()  # the ranks are forked in their containers, from the image's Python
        if OmegaConf.select(config, "hydra.sweeper._target_") != BASIC_SWEEPER:
            params = OmegaConf.select(config, "hydra.sweeper.params", default=None)
            if params is None or any(_decides_preload(str(key)) for key in params):
                return ()
        task = OmegaConf.select(config, "hydra.overrides.task", default=None)
        typed = [str(o) for o in task] if OmegaConf.is_list(task) else []
        swept = OverridesParser.create().parse_overrides(typed)
        if any(o.is_sweep_override() and _decides_preload(o.key_or_group) for o in swept):
            return ()
        return tuple(str(name) for name in OmegaConf.to_container(preload) or ())
    except (OmegaConfBaseException, HydraException):  # an interpolation that does not resolve yet: the job says
        return ()


def _decides_preload(key: str) -> bool:
    key = key.lstrip("+~").split("@")[0]
    return key in _PRELOAD_GROUPS or any(key == name or key.startswith(f"{name}.") for name in _PRELOAD_VALUES)


def claim_sweep(config: DictConfig, backend: Backend[Any]) -> ownership.SweepClaim:
    """Called in the launcher's setup(), before the sweeper writes ``multirun.yaml`` into the sweep dir: the sweep
    dir is this launch's (an flock, held until the launcher goes), or the launch is refused, naming who has it."""
    return ownership.claim_sweep(Path(str(config.hydra.sweep.dir)), backend.owner_active)


def check_sweep_dir(config: DictConfig) -> None:
    """A sweep dir that cannot be created or written is one line, not a traceback from the sweeper's mkdir."""
    raw = str(OmegaConf.select(config, "hydra.sweep.dir"))
    check.one_line("hydra.sweep.dir", raw, "choose a sweep dir without a newline")
    path = Path(raw).absolute()
    existing = next(p for p in [path, *path.parents] if p.exists())
    if not existing.is_dir():
        raise ConfigError(
            "hydra.sweep.dir", raw, f"{existing} exists and is not a directory", "choose another hydra.sweep.dir"
        )
    if not os.access(existing, os.W_OK | os.X_OK):
        what = "is not writable" if existing == path else f"cannot be created: {existing} is not writable"
        raise ConfigError("hydra.sweep.dir", raw, f"the sweep dir {what}", "choose a writable hydra.sweep.dir")


@dataclass
class HydraJob:
    prepared: PreparedJob
    config: DictConfig
    optimize: Optional[str]


def check_name(key: str, name: Any) -> str:
    if not isinstance(name, str) or not _NAME.match(name):
        raise ConfigError(
            key,
            name,
            "expected letters, digits, '.', '-' and '_', starting with a letter or digit (at most 81)",
            f"e.g. {key}=lr-sweep",
        )
    return name


def _job_name(launcher_cfg: DictConfig, config: DictConfig, num: int) -> str:
    given = OmegaConf.select(launcher_cfg, "name")
    if given is not None:
        return f"{check_name('hydra.launcher.name', given)}-{num}"
    app = re.sub(r"[^A-Za-z0-9_.-]", "_", str(config.hydra.job.name))[:40] or "job"
    return f"{app}-{launch_id.current().job_names}-{num}"


def _freeze_output_dir(config: DictConfig) -> str:
    """Resolve the job's output dir once, here, and pin it in the config every rank receives."""
    sweep_dir = str(OmegaConf.select(config, "hydra.sweep.dir"))
    subdir = str(OmegaConf.select(config, "hydra.sweep.subdir"))
    with open_dict(config):
        config.hydra.sweep.dir = sweep_dir
        config.hydra.sweep.subdir = subdir
    return os.path.abspath(os.path.join(sweep_dir, subdir))


def hydra_state() -> Any:
    """Hydra's global state, as ``Singleton.get_state`` gives it for a job's process to restore, without its deep
    copies (8 ms a batch, most of it Hydra's config store): the payload's pickle, made in the same launch before Hydra
    runs again, is the copy."""
    from hydra.core.plugins import Plugins
    from omegaconf.basecontainer import BaseContainer

    # the plugin registry is left out, as get_state leaves it: a process builds its own (worker.restore_singletons)
    instances = {kind: instance for kind, instance in Singleton._instances.items() if kind is not Plugins}
    return {"instances": instances, "omegaconf_resolvers": dict(BaseContainer._resolvers)}


def prepare_job(
    *,
    hydra_context: Any,
    master: DictConfig,
    task_function: Any,
    backend: Backend[Any],
    overrides: Sequence[str],
    num: int,
    name: Optional[str] = None,
    amend: Optional[Callable[[DictConfig], None]] = None,
    singleton_state: Any = None,
    snapshot: Optional[CodeSnapshot] = None,
) -> HydraJob:
    """Compose one job's config from the sweep's master config and its overrides, plan it, and pack its payload.
    ``name``: the job's registry name (the CLI's --name); default: from hydra.launcher.name or the launch.
    ``amend``: changes the composed config before it is planned (the CLI's env values).
    ``singleton_state``: Hydra's global state the job's process restores, taken once for a batch of jobs (the same
    for each); default: taken now. ``snapshot``: the launch's copy of the project, which the job runs."""
    config = compose_job(hydra_context.config_loader, master, overrides)
    if amend is not None:
        amend(config)
    target = OmegaConf.select(config, "hydra.launcher._target_")
    if target != master.hydra.launcher._target_:
        raise ConfigError(
            "hydra/launcher",
            target,
            f"job {num} ({' '.join(overrides)}) selects another launcher than the sweep's; a sweep runs on one backend",
            "run one sweep per cluster, not cluster=a,b",
        )
    launcher_cfg = config.hydra.launcher
    name = name or _job_name(launcher_cfg, config, num)
    job_id = f"{launch_id.current().job_names}-{num}"
    with open_dict(config):
        config.hydra.job.id = job_id
        config.hydra.job.num = num
    job_dir = _freeze_output_dir(config)
    plan = plan_job(
        launcher_cfg,
        num=num,
        name=name,
        job_id=job_id,
        overrides=list(overrides),
        job_dir=job_dir,
        limits=backend.limits,
        launcher_env=os.environ,
    )
    if snapshot is not None:
        plan = replace(plan, snapshot=snapshot)
    if plan.command is None:  # the task function runs this config (a command runs what it says)
        check_strategies(config)
    payload = JobPayload(
        plan=plan,
        callbacks=hydra_context.callbacks,
        task_function=task_function,
        config=config,
        singleton_state=hydra_state() if singleton_state is None else singleton_state,
    )
    optimize = OmegaConf.select(launcher_cfg, "optimized_metric")
    return HydraJob(
        prepared=PreparedJob(payload=payload, copied_env={n: os.environ[n] for n in plan.env_from}),
        config=config,
        optimize=optimize if isinstance(optimize, str) else None,
    )
