"""The Hydra adapter: each batch of jobs a sweeper hands the launcher is prepared, launched on the engine, and
returned to the sweeper as ``JobReturn``s, in order. (Hydra's own joblib launcher keeps its work in ``_core.py``
the same way; the launcher classes stay thin, so plugin discovery imports none of this.)

* Bad input stops the whole sweep before anything starts when the sweeper planned it up front (the basic
  sweeper's grid); a sweeper that proposes trials as it goes (Optuna, Nevergrad, Ax ...) gets a FAILED JobReturn
  with the one-line message for that trial, and the other jobs of the batch still run.
* A sweeper that optimises gets a number: the job's ``optimized_metric`` (default: the recipe's
  ``summary_metric``) out of the returned dict; ``result.json`` keeps the whole dict.
* A detached launch returns a handle per job (:class:`mmt.Job`).
"""

import sys
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Dict, List, Optional, Sequence, Tuple

from hydra.core.utils import JobReturn, JobStatus, configure_log, setup_globals
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from mmt.backends import registry
from mmt.core.errors import ConfigError, InvalidJobError
from mmt.core.jobdir import SweepDir, write_atomic
from mmt.core.states import JobState
from mmt.launching import engine, prepare
from mmt.launching.compose_once import forget as forget_composed
from mmt.launching.session import Detached, DryRun, LaunchSession, SessionSettings
from mmt.planning.redact import env_names_in, masked_config, masked_overrides
from mmt.records.outcome import error_for

if TYPE_CHECKING:  # the launcher imports this module lazily; its type is for the checker only
    from hydra_plugins.mmt_launcher.mmt_launcher import MMTLauncher

BASIC_SWEEPER = prepare.BASIC_SWEEPER


def _secret_names(config: DictConfig, job_overrides: Sequence[Sequence[str]]) -> List[str]:
    """The env variables of the sweep's master config and of every job's overrides (before any job is planned)."""
    try:
        configured = OmegaConf.select(config, "hydra.launcher.env")
    except OmegaConfBaseException:  # an interpolation that does not resolve: planning each job names it
        configured = None
    names = list(configured) if isinstance(configured, (dict, DictConfig)) else []
    # as written: an override's value may hold an interpolation (trainer.num_nodes=${num_nodes}) of a job's key
    task = OmegaConf.select(config, "hydra.overrides.task", default=None)
    given = OmegaConf.to_container(task, resolve=False) if task is not None else []
    written = [str(item) for item in given] if isinstance(given, list) else []
    return env_names_in([*written, *(o for job in job_overrides for o in job)], [str(name) for name in names])


def _protect_multirun_yaml(sweep_dir: Path, names: Sequence[str]) -> None:
    """Hydra's record of the sweep holds the env values too: masked, and readable by the owner only."""
    path = SweepDir(sweep_dir).multirun_yaml
    if not names or not path.exists():
        return
    data = OmegaConf.to_container(OmegaConf.load(path), resolve=False)
    write_atomic(path, OmegaConf.to_yaml(OmegaConf.create(masked_config(data, names))).encode(), private=True)


def _failed_return(job: prepare.HydraJob, error: Exception, primary: Optional[JobReturn] = None) -> JobReturn:
    config, plan = job.config, job.prepared.plan
    ret = primary or JobReturn(
        overrides=list(plan.overrides),
        cfg=OmegaConf.masked_copy(config, [str(k) for k in config.keys() if k != "hydra"]),
        hydra_cfg=OmegaConf.masked_copy(config, "hydra"),
        working_dir=plan.job_dir,
        task_name=str(config.hydra.job.name),
    )
    ret.status = JobStatus.FAILED
    ret.return_value = error
    # Hydra prints a failed job's overrides ("Error executing job with overrides: [...]"): its env values masked
    ret.overrides = masked_overrides(ret.overrides or plan.overrides, plan.secret_names)
    return ret


def _optimised(job: prepare.HydraJob, ret: JobReturn, key: Optional[str]) -> JobReturn:
    """The number a sweeper optimises, out of the job's returned dict."""
    if key is None:
        return ret
    value = ret._return_value
    number = value.get(key) if isinstance(value, dict) else value
    if isinstance(number, (int, float)) and not isinstance(number, bool):
        ret.return_value = float(number)
        return ret
    keys = ", ".join(map(str, value)) if isinstance(value, dict) else type(value).__name__
    return _failed_return(
        job,
        InvalidJobError(
            job.prepared.plan.label,
            f"the job returned no number under {key!r} (it returned {keys}). HINT: set optimized_metric=<key>",
        ),
        ret,
    )


def _job_return(job: prepare.HydraJob, report: engine.JobReport, key: Optional[str]) -> JobReturn:
    if report.outcome.status == JobState.COMPLETED:
        return _optimised(job, report.primary, key)
    return _failed_return(job, error_for(report.plan, report.outcome), report.primary)


def _dry_run(jobs: List[prepare.HydraJob], outcome: DryRun) -> List[JobReturn]:
    print(f"mmt dry run: {len(jobs)} job(s) on cluster={outcome.backend}; nothing is started\n")
    for render in outcome.renders:
        print(render + "\n")
    return [
        JobReturn(
            overrides=list(job.prepared.plan.overrides),
            cfg=job.config,
            hydra_cfg=None,
            working_dir=job.prepared.plan.job_dir,
            task_name=str(job.config.hydra.job.name),
            status=JobStatus.COMPLETED,
            _return_value=None,
        )
        for job in jobs
    ]


def launch(
    launcher: "MMTLauncher", job_overrides: Sequence[Sequence[str]], initial_job_idx: int
) -> Sequence[JobReturn]:
    assert launcher.hydra_context is not None  # set by the launcher's setup()
    try:
        return _launch(launcher, job_overrides, initial_job_idx)
    finally:
        forget_composed(launcher.hydra_context.config_loader)


def _launch(
    launcher: "MMTLauncher", job_overrides: Sequence[Sequence[str]], initial_job_idx: int
) -> Sequence[JobReturn]:
    setup_globals()
    config, context, backend = launcher.config, launcher.hydra_context, launcher.backend
    assert config is not None and context is not None and backend is not None  # set by the launcher's setup()
    configure_log(config.hydra.hydra_logging, config.hydra.verbose)
    sweep_dir = Path(str(config.hydra.sweep.dir))
    up_front = OmegaConf.select(config, "hydra.sweeper._target_") == BASIC_SWEEPER
    # Hydra wrote the sweep's record (multirun.yaml) before calling us: the env values in it go, whatever follows
    _protect_multirun_yaml(sweep_dir, _secret_names(config, job_overrides))
    if launcher.remote is not None:
        launcher.remote.ready()  # the cluster checked and the code there: a refusal is one line, before any job
    else:
        prepare.warm_up(backend, config, launcher.snapshot)  # again, should the agent have gone since the last batch
    jobs, refused = _prepare_batch(launcher, job_overrides, initial_job_idx, up_front)
    settings = replace(SessionSettings.of(config.hydra.launcher, sweep_dir), plot_awaited_at_exit=True)  # a next batch
    if settings.detach and not up_front and not any(job.prepared.plan.dry_run for job in jobs.values()):
        sweeper = OmegaConf.select(config, "hydra.sweeper._target_")
        raise ConfigError(
            "hydra.launcher.detach",
            True,
            f"the sweeper {sweeper} decides its next trials from the "
            "jobs' return values, and a detached launch returns before any job has one",
            "run it attached (detach=false); the basic sweeper's grid can be detached",
        )
    not_started = [
        engine.NotStarted(num, job_overrides[num - initial_job_idx], str(error.reason))
        for num, error in refused.items()
    ]
    prepared = [job.prepared for job in jobs.values()]
    if launcher.remote is not None:  # the jobs are submitted by the cluster's side, over SSH
        outcome = launcher.remote.run(prepared, backend, settings, not_started)
    else:
        outcome = LaunchSession(backend, settings).run(prepared, not_started)
    if isinstance(outcome, DryRun):
        return _dry_run(list(jobs.values()), outcome)
    if isinstance(outcome, Detached):
        return _detached(config, list(jobs.values()), outcome, refused, job_overrides, initial_job_idx)
    report = outcome.report
    configure_log(config.hydra.hydra_logging, config.hydra.verbose)
    by_num = {job.plan.num: job for job in report.jobs}
    returns = []
    for i, overrides in enumerate(job_overrides):
        num = initial_job_idx + i
        if num in refused:
            returns.append(_refused_return(config, overrides, refused[num]))
            continue
        job = jobs[num]
        # the basic sweeper takes the value as it is; one that optimises gets a number (optimized_metric, or else
        # the recipe's summary_metric)
        key = None if up_front else (job.optimize or job.prepared.plan.summary_metric)
        if num in by_num:
            returns.append(_job_return(job, by_num[num], key))
        elif num in report.unsubmitted:
            returns.append(
                _failed_return(job, InvalidJobError(f"job {num}", "not submitted: the launch was interrupted first"))
            )
        elif job.prepared.plan.name in report.unconfirmed:
            why = "asked to stop, not confirmed: its cluster does not answer"
            returns.append(_failed_return(job, InvalidJobError(f"job {num}", why)))
        else:  # left running (detached on SIGHUP): no result yet
            returns.append(_failed_return(job, InvalidJobError(f"job {num}", "detached: still running")))
    if report.interrupted_by is not None:
        sys.exit(128 + report.interrupted_by)
    return returns


def _prepare_batch(
    launcher: "MMTLauncher", job_overrides: Sequence[Sequence[str]], initial_job_idx: int, up_front: bool
) -> Tuple[Dict[int, prepare.HydraJob], Dict[int, InvalidJobError]]:
    """Each job of the batch prepared (composed, planned, packed with the launch's snapshot), or refused: the whole
    grid at once when the sweeper planned it up front, else that trial alone."""
    assert launcher.config is not None and launcher.hydra_context is not None and launcher.backend is not None
    jobs: Dict[int, prepare.HydraJob] = {}
    refused: Dict[int, InvalidJobError] = {}
    singleton_state = prepare.hydra_state()  # the same for every job of the batch
    remote = launcher.remote
    # over SSH, each job's dir is in the cluster's remote root, and its code the snapshot synced there
    amend = remote.relocator(Path(str(launcher.config.hydra.sweep.dir))) if remote is not None else None
    snapshot = remote.snapshot if remote is not None else (launcher.snapshot.snapshot if launcher.snapshot else None)
    for i, overrides in enumerate(job_overrides):
        num = initial_job_idx + i
        try:
            job = prepare.prepare_job(
                hydra_context=launcher.hydra_context,
                master=launcher.config,
                task_function=launcher.task_function,
                backend=launcher.backend,
                overrides=overrides,
                num=num,
                singleton_state=singleton_state,
                snapshot=snapshot,
                amend=amend,
            )
            if not job.prepared.plan.dry_run:
                engine.refuse_unrunnable(launcher.backend, [job.prepared.plan])
            jobs[num] = job
        except ConfigError as exc:
            if up_front:
                raise  # the whole grid is known: refuse it before anything starts
            refused[num] = InvalidJobError(f"job {num}", str(exc))
    return jobs, refused


def _detached(
    config: DictConfig,
    jobs: List[prepare.HydraJob],
    outcome: Detached,
    refused: Dict[int, InvalidJobError],
    job_overrides: Sequence[Sequence[str]],
    initial_job_idx: int,
) -> List[JobReturn]:
    """Each detached job's value is a handle (:class:`mmt.Job`)."""
    from mmt.sdk import Job  # the handles returned; the SDK loads only for a detached launch

    for item in outcome.submitted:
        where = registry.scheduler_job(item.backend, item.scheduler_id) if item.scheduler_id else "a local supervisor"
        print(f"mmt: detached job {item.plan.num} {item.plan.name} ({where}): {item.plan.job_dir}", flush=True)
    print(
        f"mmt: {len(outcome.submitted)} job(s) run detached; each job's value is a handle (mmt.Job): follow them "
        "with `mmt list`, `mmt logs NAME -f`, `mmt wait NAME`",
        flush=True,
    )
    returns, by_num = [], {item.plan.num: item for item in outcome.submitted}
    jobs_by_num = {job.prepared.plan.num: job for job in jobs}
    for i, overrides in enumerate(job_overrides):
        num = initial_job_idx + i
        if num in refused:
            returns.append(_refused_return(config, overrides, refused[num]))
            continue
        job, item = jobs_by_num[num], by_num[num]
        returns.append(
            JobReturn(
                overrides=list(item.plan.overrides),
                cfg=job.config,
                hydra_cfg=None,
                working_dir=item.plan.job_dir,
                task_name=str(job.config.hydra.job.name),
                status=JobStatus.COMPLETED,
                _return_value=Job(item.plan.name),
            )
        )
    return returns


def _refused_return(config: DictConfig, overrides: Sequence[str], error: Exception) -> JobReturn:
    return JobReturn(
        overrides=masked_overrides(overrides, env_names_in(overrides)),
        cfg=None,
        hydra_cfg=None,
        working_dir="",
        task_name=str(config.hydra.job.name),
        status=JobStatus.FAILED,
        _return_value=error,
    )
