"""The Hydra front end of the engine: each job of a sweep batch composed once, planned, launched, and returned to
the sweeper as a ``JobReturn``, in order.

* Every job's config is composed here, in the launcher process, once: ranks never re-compose (one ``${now:}``, one
  output dir), and per-job values (``num_nodes=1,2``) come from each job's own config. The launcher takes the
  config the sweeper composed to check the batch (``compose_once``) instead of composing it a second time.
* Bad input stops the whole sweep before anything starts when the sweeper planned it up front (the basic
  sweeper's grid); a sweeper that proposes trials as it goes (Optuna, Nevergrad, Ax ...) gets a FAILED JobReturn
  with the one-line message for that trial, and the other jobs of the batch still run.
* A sweeper that optimises gets a number: the job's ``optimized_metric`` (default: the recipe's
  ``summary_metric``) out of the returned dict; ``result.json`` keeps the whole dict.
"""

import os
import re
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Dict, List, Optional, Sequence

from hydra.core.singleton import Singleton
from hydra.core.utils import JobReturn, JobStatus, configure_log, setup_globals
from omegaconf import DictConfig, OmegaConf, open_dict

from mmt.backends.base import Backend, JobState
from mmt.errors import ConfigError, InvalidJobError
from mmt.jobdir import SweepDir, write_atomic
from mmt.launching import engine, ownership
from mmt.launching.compose_once import ComposeOnce, compose_job
from mmt.launching.compose_once import forget as forget_composed
from mmt.launching.console import Console
from mmt.launching.outcome import error_for
from mmt.launching.payload import JobPayload
from mmt.monitor import plots
from mmt.planning import dryrun
from mmt.planning import validate as check
from mmt.planning.plan import plan_job
from mmt.planning.redact import env_names_in, masked_config
from mmt.service.registry import Registry

if TYPE_CHECKING:  # the launcher imports this module lazily; its type is for the checker only
    from hydra_plugins.mmt_launcher.mmt_launcher import MMTLauncher

BASIC_SWEEPER = "hydra._internal.core_plugins.basic_sweeper.BasicSweeper"
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,80}$")


def make_backend(kind: str, launcher_cfg: DictConfig) -> Backend:
    common = dict(kill_grace_s=check.positive_number("hydra.launcher.kill_grace_s", launcher_cfg.kill_grace_s,
                                                     "seconds between SIGTERM and SIGKILL, e.g. 1", maximum=3600),
                  start_method=check.choice("hydra.launcher.start_method", launcher_cfg.start_method,
                                            ("fork", "spawn")))
    if kind == "local":
        from mmt.backends.local.backend import LocalBackend, LocalSettings

        return LocalBackend(LocalSettings.from_config(launcher_cfg))
    from mmt.backends.slurm.backend import SlurmBackend
    from mmt.backends.slurm.sbatch import SlurmSettings

    return SlurmBackend(SlurmSettings.from_config(launcher_cfg), **common)


def keep_composed_jobs(hydra_context: Any) -> None:
    """Called in the launcher's setup(), before the sweeper checks its first batch."""
    ComposeOnce.install(hydra_context.config_loader)


def warm_up(backend: Backend, config: DictConfig) -> None:
    """Start what every launch needs (the host agent) before it is needed."""
    if not OmegaConf.select(config, "hydra.launcher.dry_run"):
        backend.warm_up()


def start_plotter(sweep_dir: Path, job_dirs: Sequence[str]) -> None:
    """summary.png's drawer imports matplotlib while the jobs run, when the sweep will have a plot worth it."""
    if plots.sweep_may_be_drawn(sweep_dir, job_dirs):
        plots.Plotter.start()


def refuse_sweep_in_use(config: DictConfig, backend: Backend) -> None:
    """Called in the launcher's setup(), before the sweeper writes ``multirun.yaml`` into the sweep dir."""
    ownership.refuse_sweep_in_use(Path(str(config.hydra.sweep.dir)), backend.owner_active)


def check_sweep_dir(config: DictConfig) -> None:
    """A sweep dir that cannot be created or written is one line, not a traceback from the sweeper's mkdir."""
    raw = str(OmegaConf.select(config, "hydra.sweep.dir"))
    check.one_line("hydra.sweep.dir", raw, "choose a sweep dir without a newline")
    path = Path(raw).absolute()
    existing = next(p for p in [path, *path.parents] if p.exists())
    if not existing.is_dir():
        raise ConfigError("hydra.sweep.dir", raw, f"{existing} exists and is not a directory",
                          "choose another hydra.sweep.dir")
    if not os.access(existing, os.W_OK | os.X_OK):
        what = "is not writable" if existing == path else f"cannot be created: {existing} is not writable"
        raise ConfigError("hydra.sweep.dir", raw, f"the sweep dir {what}", "choose a writable hydra.sweep.dir")


@dataclass
class _HydraJob:
    prepared: engine.PreparedJob
    config: DictConfig
    optimize: Optional[str]


def check_name(key: str, name: Any) -> str:
    if not isinstance(name, str) or not _NAME.match(name):
        raise ConfigError(key, name, "expected letters, digits, '.', '-' and '_', starting with a letter or digit "
                          "(at most 81)", f"e.g. {key}=lr-sweep")
    return name


def _job_name(launcher_cfg: DictConfig, config: DictConfig, num: int) -> str:
    from hydra_plugins.mmt_launcher.config import JOB_NAME_ID

    given = OmegaConf.select(launcher_cfg, "name")
    if given is not None:
        return f"{check_name('hydra.launcher.name', given)}-{num}"
    app = re.sub(r"[^A-Za-z0-9_.-]", "_", str(config.hydra.job.name))[:40] or "job"
    return f"{app}-{JOB_NAME_ID}-{num}"


def _freeze_output_dir(config: DictConfig) -> str:
    """Resolve the job's output dir once, here, and pin it in the config every rank receives."""
    sweep_dir = str(OmegaConf.select(config, "hydra.sweep.dir"))
    subdir = str(OmegaConf.select(config, "hydra.sweep.subdir"))
    with open_dict(config):
        config.hydra.sweep.dir = sweep_dir
        config.hydra.sweep.subdir = subdir
    return os.path.abspath(os.path.join(sweep_dir, subdir))


def prepare_job(*, hydra_context: Any, master: DictConfig, task_function: Any, backend: Backend,
                overrides: Sequence[str], num: int, name: Optional[str] = None,
                amend: Optional[Callable[[DictConfig], None]] = None) -> _HydraJob:
    """Compose one job's config from the sweep's master config and its overrides, plan it, and pack its payload.
    ``name``: the job's registry name (the CLI's --name); default: from hydra.launcher.name or the launch.
    ``amend``: changes the composed config before it is planned (the CLI's env values)."""
    from hydra_plugins.mmt_launcher.config import JOB_NAME_ID

    config = compose_job(hydra_context.config_loader, master, overrides)
    if amend is not None:
        amend(config)
    target = OmegaConf.select(config, "hydra.launcher._target_")
    if target != master.hydra.launcher._target_:
        raise ConfigError("hydra/launcher", target, f"job {num} ({' '.join(overrides)}) selects another launcher "
                          "than the sweep's; a sweep runs on one backend", "run one sweep per cluster, not cluster=a,b")
    launcher_cfg = config.hydra.launcher
    name = name or _job_name(launcher_cfg, config, num)
    job_id = f"{JOB_NAME_ID}-{num}"
    with open_dict(config):
        config.hydra.job.id = job_id
        config.hydra.job.num = num
    job_dir = _freeze_output_dir(config)
    plan = plan_job(launcher_cfg, num=num, name=name, job_id=job_id, overrides=list(overrides), job_dir=job_dir,
                    limits=backend.limits, launcher_env=os.environ)
    payload = JobPayload(plan=plan, callbacks=hydra_context.callbacks, task_function=task_function,
                         config=config, singleton_state=Singleton.get_state())
    optimize = OmegaConf.select(launcher_cfg, "optimized_metric")
    return _HydraJob(prepared=engine.PreparedJob(payload=payload, copied_env={n: os.environ[n] for n in plan.env_from}),
                     config=config, optimize=optimize if isinstance(optimize, str) else None)


def _secret_names(config: DictConfig, job_overrides: Sequence[Sequence[str]]) -> List[str]:
    """The env variables of the sweep's master config and of every job's overrides (before any job is planned)."""
    try:
        configured = OmegaConf.select(config, "hydra.launcher.env")
    except Exception:  # an interpolation that does not resolve: planning each job names it
        configured = None
    names = list(configured) if isinstance(configured, (dict, DictConfig)) else []
    # as written: an override's value may hold an interpolation (trainer.num_nodes=${num_nodes}) of a job's key
    task = OmegaConf.select(config, "hydra.overrides.task", default=None)
    given = OmegaConf.to_container(task, resolve=False) if task is not None else []
    return env_names_in([*map(str, given), *(o for job in job_overrides for o in job)], names)


def _protect_multirun_yaml(sweep_dir: Path, names: Sequence[str]) -> None:
    """Hydra's record of the sweep holds the env values too: masked, and readable by the owner only."""
    path = SweepDir(sweep_dir).multirun_yaml
    if not names or not path.exists():
        return
    data = OmegaConf.to_container(OmegaConf.load(path), resolve=False)
    write_atomic(path, OmegaConf.to_yaml(OmegaConf.create(masked_config(data, names))).encode(), private=True)


def _failed_return(job: _HydraJob, error: Exception, primary: Optional[JobReturn] = None) -> JobReturn:
    config, plan = job.config, job.prepared.plan
    ret = primary or JobReturn(
        overrides=list(plan.overrides),
        cfg=OmegaConf.masked_copy(config, [k for k in config.keys() if k != "hydra"]),
        hydra_cfg=OmegaConf.masked_copy(config, "hydra"),
        working_dir=plan.job_dir,
        task_name=str(config.hydra.job.name),
    )
    ret.status = JobStatus.FAILED
    ret.return_value = error
    return ret


def _optimised(job: _HydraJob, ret: JobReturn, key: Optional[str]) -> JobReturn:
    """The number a sweeper optimises, out of the job's returned dict."""
    if key is None:
        return ret
    value = ret._return_value
    number = value.get(key) if isinstance(value, dict) else value
    if isinstance(number, (int, float)) and not isinstance(number, bool):
        ret.return_value = float(number)
        return ret
    keys = ", ".join(map(str, value)) if isinstance(value, dict) else type(value).__name__
    return _failed_return(job, InvalidJobError(job.prepared.plan.label, f"the job returned no number under "
                                               f"{key!r} (it returned {keys}). HINT: set optimized_metric=<key>"), ret)


def _job_return(job: _HydraJob, report: engine.JobReport, key: Optional[str]) -> JobReturn:
    if report.outcome.status == JobState.COMPLETED:
        return _optimised(job, report.primary, key)
    return _failed_return(job, error_for(report.plan, report.outcome), report.primary)


def _dry_run(jobs: List[_HydraJob], backend: Backend) -> List[JobReturn]:
    print(f"mmt dry run: {len(jobs)} job(s) on cluster={backend.name}; nothing is started\n")
    for job in jobs:
        print(dryrun.render(job.prepared.plan, backend.describe(job.prepared.plan)) + "\n")
    return [JobReturn(overrides=list(job.prepared.plan.overrides), cfg=job.config, hydra_cfg=None,
                      working_dir=job.prepared.plan.job_dir, task_name=str(job.config.hydra.job.name),
                      status=JobStatus.COMPLETED, _return_value=None) for job in jobs]


def launch(launcher: "MMTLauncher", job_overrides: Sequence[Sequence[str]],
           initial_job_idx: int) -> Sequence[JobReturn]:
    try:
        return _launch(launcher, job_overrides, initial_job_idx)
    finally:
        forget_composed(launcher.hydra_context.config_loader)


def _launch(launcher: "MMTLauncher", job_overrides: Sequence[Sequence[str]],
            initial_job_idx: int) -> Sequence[JobReturn]:
    setup_globals()
    config = launcher.config
    configure_log(config.hydra.hydra_logging, config.hydra.verbose)
    backend: Backend = launcher.backend
    sweep_dir = Path(str(config.hydra.sweep.dir))
    up_front = OmegaConf.select(config, "hydra.sweeper._target_") == BASIC_SWEEPER
    # Hydra wrote the sweep's record (multirun.yaml) before calling us: the env values in it go, whatever follows
    _protect_multirun_yaml(sweep_dir, _secret_names(config, job_overrides))
    warm_up(backend, config)  # again, should the agent have gone since the last batch
    jobs: Dict[int, _HydraJob] = {}
    refused: Dict[int, Exception] = {}
    for i, overrides in enumerate(job_overrides):
        num = initial_job_idx + i
        try:
            job = prepare_job(hydra_context=launcher.hydra_context, master=config, task_function=launcher.task_function,
                              backend=backend, overrides=overrides, num=num)
            if not job.prepared.plan.dry_run:
                engine.refuse_unrunnable(backend, [job.prepared.plan])
            jobs[num] = job
        except ConfigError as exc:
            if up_front:
                raise  # the whole grid is known: refuse it before anything starts
            refused[num] = InvalidJobError(f"job {num}", str(exc))
    if any(job.prepared.plan.dry_run for job in jobs.values()):
        return _dry_run(list(jobs.values()), backend)
    mode = check.choice("hydra.launcher.console", config.hydra.launcher.console, engine.CONSOLE_MODES)
    options = engine.LaunchOptions(sweep_dir=sweep_dir, console=mode, registry=open_registry())
    if bool(OmegaConf.select(config, "hydra.launcher.detach")):
        return _detach(launcher, list(jobs.values()), backend, options, up_front, refused, job_overrides,
                       initial_job_idx)
    start_plotter(sweep_dir, [job.prepared.plan.job_dir for job in jobs.values()])
    console = Console()
    page = start_dashboard(config.hydra.launcher, sweep_dir, console)
    not_started = [engine.NotStarted(num, job_overrides[num - initial_job_idx], str(error.reason))
                   for num, error in refused.items()]
    try:
        if jobs:
            report = engine.launch([job.prepared for job in jobs.values()], backend, options, console,
                                   not_started=not_started)
        else:
            report = None
            engine.summarise(sweep_dir, engine.LaunchReport(jobs=[]), console, not_started=not_started)
    finally:
        if page is not None:
            page.close()
        console.close()
    configure_log(config.hydra.hydra_logging, config.hydra.verbose)
    by_num = {job.plan.num: job for job in report.jobs} if report else {}
    returns = []
    for i, overrides in enumerate(job_overrides):
        num = initial_job_idx + i
        if num in refused:
            returns.append(_refused_return(launcher, overrides, refused[num]))
            continue
        job = jobs[num]
        # the basic sweeper takes the value as it is; one that optimises gets a number (optimized_metric, or else
        # the recipe's summary_metric)
        key = None if up_front else (job.optimize or job.prepared.plan.summary_metric)
        if num in by_num:
            returns.append(_job_return(job, by_num[num], key))
        elif report is not None and num in report.unsubmitted:
            returns.append(_failed_return(job, InvalidJobError(f"job {num}", "not submitted: the launch was "
                                                               "interrupted first")))
        else:  # left running (detached on SIGHUP): no result yet
            returns.append(_failed_return(job, InvalidJobError(f"job {num}", "detached: still running")))
    if report is not None and report.interrupted_by is not None:
        sys.exit(128 + report.interrupted_by)
    return returns


def start_dashboard(launcher_cfg: DictConfig, sweep_dir: Path, console: Console) -> Any:
    """The live page for this launch, when ``hydra.launcher.dashboard`` asks for it (it ends with the launch)."""
    if not OmegaConf.select(launcher_cfg, "dashboard"):
        return None
    from mmt.dashboard.background import BackgroundDashboard

    page = BackgroundDashboard([sweep_dir])
    console.write(f"mmt: live page: {page.url or 'could not start (see the log above)'}  (later: mmt dashboard "
                  f"{sweep_dir})\n")
    return page


def open_registry() -> Optional[Registry]:
    """The job registry; a launch still runs (its job dirs are the truth) where the registry cannot be opened."""
    registry = Registry()
    try:
        registry.names_taken([])
    except Exception as exc:
        print(f"mmt: WARNING the job registry {registry.path} cannot be used ({exc}); jobs run unregistered",
              file=sys.stderr)
        return None
    return registry


def detached_submit(jobs: List[engine.PreparedJob], backend: Backend, options: engine.LaunchOptions
                    ) -> List[engine.Submitted]:
    """Start jobs that outlive this process: SLURM's conclude themselves; local ones get a supervisor."""
    from hydra_plugins.mmt_launcher.config import LAUNCH_ID

    if options.registry is None:
        raise ConfigError("hydra.launcher.detach", True, "detached jobs are found again through the job registry, "
                          "which cannot be opened here", "fix MMT_HOME (or ~/.mmt), or run attached")
    if backend.survives_launcher:
        return engine.submit(jobs, backend, options)
    from mmt.launching import supervisor

    return supervisor.start(jobs, backend.settings, options, LAUNCH_ID)


def _detach(launcher: "MMTLauncher", jobs: List[_HydraJob], backend: Backend, options: engine.LaunchOptions,
            up_front: bool, refused: Dict[int, Exception], job_overrides: Sequence[Sequence[str]],
            initial_job_idx: int) -> List[JobReturn]:
    if not up_front:
        sweeper = OmegaConf.select(launcher.config, "hydra.sweeper._target_")
        raise ConfigError("hydra.launcher.detach", True, f"the sweeper {sweeper} decides its next trials from the "
                          "jobs' return values, and a detached launch returns before any job has one",
                          "run it attached (detach=false); the basic sweeper's grid can be detached")
    from mmt.sdk import Job

    submitted = detached_submit([job.prepared for job in jobs], backend, options)
    for item in submitted:
        where = f"SLURM job {item.scheduler_id}" if item.scheduler_id else "a local supervisor"
        print(f"mmt: detached job {item.plan.num} {item.plan.name} ({where}): {item.plan.job_dir}", flush=True)
    print(f"mmt: {len(submitted)} job(s) run detached; each job's value is a handle (mmt.Job): follow them with "
          "`mmt list`, `mmt logs NAME -f`, `mmt wait NAME`", flush=True)
    returns, by_num = [], {item.plan.num: item for item in submitted}
    jobs_by_num = {job.prepared.plan.num: job for job in jobs}
    for i, overrides in enumerate(job_overrides):
        num = initial_job_idx + i
        if num in refused:
            returns.append(_refused_return(launcher, overrides, refused[num]))
            continue
        job, item = jobs_by_num[num], by_num[num]
        returns.append(JobReturn(overrides=list(item.plan.overrides), cfg=job.config, hydra_cfg=None,
                                 working_dir=item.plan.job_dir, task_name=str(job.config.hydra.job.name),
                                 status=JobStatus.COMPLETED, _return_value=Job(item.plan.name)))
    return returns


def _refused_return(launcher: "MMTLauncher", overrides: Sequence[str], error: Exception) -> JobReturn:
    return JobReturn(overrides=list(overrides), cfg=None, hydra_cfg=None, working_dir="",
                     task_name=str(launcher.config.hydra.job.name), status=JobStatus.FAILED, _return_value=error)
