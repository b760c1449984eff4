"""The launch of one batch of sweep jobs, whatever the backend: compose, plan, (dry run | submit), report.

1. compose every job's config in this process, once (ranks never re-compose: one ``${now:}``, one output dir);
2. plan every job from its own config and validate it, so bad input stops the sweep before anything starts;
3. write each job's payload, run the jobs on the backend, turn outcomes into ``JobReturn``s in order;
4. write ``result.json`` per job and print and save the sweep summary.
"""

import csv
import logging
import os
import signal
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, List, Sequence

from hydra.core.singleton import Singleton
from hydra.core.utils import JobReturn, JobStatus, configure_log, filter_overrides, setup_globals
from omegaconf import DictConfig, OmegaConf, open_dict

from . import _dryrun, _payload
from ._console import SummaryRow, format_summary, metric_of
from ._outcome import JobOutcome, discard_payload, to_job_return, write_result
from ._plan import JobPlan, plan_job
from .errors import ConfigError

log = logging.getLogger(__name__)


@dataclass
class PreparedJob:
    plan: JobPlan
    config: DictConfig


def _freeze_output_dir(config: DictConfig) -> str:
    """Resolve the job's output dir once, here, and pin it in the config every rank receives."""
    sweep_dir = str(OmegaConf.select(config, "hydra.sweep.dir"))
    subdir = str(OmegaConf.select(config, "hydra.sweep.subdir"))
    with open_dict(config):
        config.hydra.sweep.dir = sweep_dir
        config.hydra.sweep.subdir = subdir
    return os.path.abspath(os.path.join(sweep_dir, subdir))


def prepare(launcher: Any, overrides: Sequence[str], num: int) -> PreparedJob:
    config = launcher.hydra_context.config_loader.load_sweep_config(launcher.config, list(overrides))
    target = OmegaConf.select(config, "hydra.launcher._target_")
    if target != launcher.config.hydra.launcher._target_:
        raise ConfigError("hydra/launcher", target, f"job {num} ({' '.join(overrides)}) selects another launcher "
                          "than the sweep's; a sweep runs on one backend", "run one sweep per cluster, not cluster=a,b")
    job_id = f"{launcher.BACKEND}-{os.getpid()}-{num}"
    with open_dict(config):
        config.hydra.job.id = job_id
        config.hydra.job.num = num
    job_dir = _freeze_output_dir(config)
    plan = plan_job(config.hydra.launcher, num=num, job_id=job_id, overrides=list(overrides), job_dir=job_dir)
    return PreparedJob(plan=plan, config=config)


def _dry_run_return(job: PreparedJob) -> JobReturn:
    return JobReturn(overrides=list(job.plan.overrides), cfg=job.config, hydra_cfg=None,
                     working_dir=job.plan.job_dir, task_name=str(job.config.hydra.job.name),
                     status=JobStatus.COMPLETED, _return_value=None)


def launch(launcher: Any, job_overrides: Sequence[Sequence[str]], initial_job_idx: int) -> Sequence[JobReturn]:
    setup_globals()
    config = launcher.config
    configure_log(config.hydra.hydra_logging, config.hydra.verbose)
    sweep_dir = Path(str(config.hydra.sweep.dir))
    backend = launcher.make_backend(config.hydra.launcher)

    jobs = [prepare(launcher, overrides, initial_job_idx + i) for i, overrides in enumerate(job_overrides)]
    if any(job.plan.dry_run for job in jobs):
        print(f"mmt dry run: {len(jobs)} job(s) on cluster={backend.name}; nothing is started\n")
        for job in jobs:
            print(_dryrun.render(job.plan, backend.describe(job.plan)) + "\n")
        return [_dry_run_return(job) for job in jobs]
    backend.preflight([job.plan for job in jobs])

    sweep_dir.mkdir(parents=True, exist_ok=True)
    log.info(f"mmt: launching {len(jobs)} job(s) on cluster={backend.name}, sweep dir {sweep_dir}")
    state = Singleton.get_state()
    for job in jobs:
        log.info(f"\t#{job.plan.num} : {' '.join(filter_overrides(job.plan.overrides))} "
                 f"({job.plan.num_nodes} x {job.plan.devices})")
        _payload.write_payload(job.plan.job_dir, _payload.JobPayload(
            hydra_context=launcher.hydra_context, task_function=launcher.task_function, config=job.config,
            singleton_state=state, command=job.plan.command, command_mode=job.plan.command_mode))

    outcomes = backend.run([job.plan for job in jobs])
    returns = [_report(job, outcome) for job, outcome in zip(jobs, outcomes)]
    _summarise(sweep_dir, jobs, outcomes, returns)
    configure_log(config.hydra.hydra_logging, config.hydra.verbose)
    if backend.interrupted_by is not None:  # after everything is stopped and written down
        name = signal.Signals(backend.interrupted_by).name
        print(f"mmt: {name} received; every rank of every job was stopped", file=sys.stderr, flush=True)
        sys.exit(128 + backend.interrupted_by)
    return returns


def _report(job: PreparedJob, outcome: JobOutcome) -> JobReturn:
    ret = to_job_return(job.plan, job.config, outcome)
    write_result(job.plan, outcome, ret)
    discard_payload(job.plan)
    return ret


def _first_line(error: object, job_name: str) -> str:
    line = str(error).splitlines()[0] if str(error) else type(error).__name__
    return line.removeprefix(f"{job_name}: ")


def _summarise(sweep_dir: Path, jobs: List[PreparedJob], outcomes: List[JobOutcome],
               returns: List[JobReturn]) -> None:
    rows, metric_name = [], "metric"
    for job, outcome, ret in zip(jobs, outcomes, returns):
        value = ret._return_value if ret.status == JobStatus.COMPLETED else None
        metric = metric_of(value, job.plan.summary_metric)
        metric_name = metric["name"] if metric["value"] != "-" else metric_name
        note = "" if ret.status == JobStatus.COMPLETED else _first_line(ret._return_value, job.plan.name)
        rows.append(SummaryRow(job=job.plan.num, overrides=" ".join(job.plan.overrides), status=outcome.status,
                               topology=f"{job.plan.num_nodes} x {job.plan.devices}",
                               duration_s=outcome.duration_s, metric=metric["value"], note=note))
    print("\n" + format_summary(f"mmt summary ({sweep_dir})", rows, metric_name) + "\n", flush=True)
    summary = sweep_dir / "summary.csv"
    new = not summary.exists()
    with open(summary, "a", newline="") as handle:
        writer = csv.writer(handle)
        if new:
            writer.writerow(["job", "overrides", "status", "num_nodes", "devices", "duration_s", metric_name, "note"])
        for row, job in zip(rows, jobs):
            writer.writerow([row.job, row.overrides, row.status, job.plan.num_nodes, job.plan.devices,
                             "" if row.duration_s is None else f"{row.duration_s:.2f}", row.metric, row.note])
