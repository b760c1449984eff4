"""The restart stage (``hydra.launcher.max_restarts``): a job this process supervises that failed by itself is
started again, whole, after its back-off. The run that failed is recorded when it fails, in the attempt dir
(``earlier_runs.json``, ``restarting.json``) and the registry (``RESTARTING``), so that a job in its back-off says
so everywhere, and a job stopped then still tells why it was restarting."""

import time
from typing import Any, Optional

from mmt.backends.base import Backend, JobTracker, Submission
from mmt.core.states import JobState
from mmt.launching.conclude import conclude
from mmt.launching.console import Console
from mmt.launching.jobs import Watched
from mmt.launching.report import first_line
from mmt.records.outcome import JobOutcome, error_for
from mmt.records.registry import Registry, RegistryError
from mmt.records.restarts import clear_pending_restart, record_pending_restart, unrecord_last_run
from mmt.records.restarts import record as record_earlier_run
from mmt.records.schema import EarlierRun


def may_restart(item: Watched, outcome: JobOutcome) -> bool:
    """Only a failure restarts (a stop, Ctrl-C or the time limit never does), only while restarts are left, and only
    a job this process supervises (its claim: never a job another process watches, nor one that concludes itself)."""
    return (
        outcome.status == JobState.FAILED
        and item.claim is not None
        and not item.survives_launcher
        and len(item.earlier_runs) < item.plan.max_restarts
        and not item.claim.stop_requested()
    )


def schedule_restart(item: Watched, outcome: JobOutcome, console: Console, registry: Optional[Registry]) -> None:
    plan, restart = item.plan, len(item.earlier_runs)
    for follower in item.followers:
        follower.poll()
    error = first_line(str(error_for(plan, outcome)))
    failed = EarlierRun(
        restart=restart,
        error=error,
        started_at=item.run_started_at,
        ended_at=time.time(),
        duration_s=outcome.duration_s,
    )
    item.earlier_runs.append(failed)
    item.failed_run, item.restart_at = outcome, time.monotonic() + plan.restart_backoff_s
    attempt = item.handle.attempt
    try:
        record_earlier_run(attempt, failed)
        why = outcome.failure.brief() if outcome.failure is not None else outcome.detail or error
        record_pending_restart(attempt, failed, next_at=time.time() + plan.restart_backoff_s, why=why)
    except OSError:  # the job deleted its dir: the run is kept in memory, and in its result
        pass
    _update(registry, plan.name, console, state=JobState.RESTARTING.value, restarts=len(item.earlier_runs))
    console.write(
        f"mmt: #{plan.num} {plan.name} failed: {error}\n"
        f"mmt: #{plan.num} {plan.name}: restart {restart + 1} of {plan.max_restarts}, every rank, "
        f"in {plan.restart_backoff_s:g} s\n"
    )


def restart(item: Watched, backend: JobTracker[Any], console: Console, registry: Optional[Registry]) -> None:
    """Start the whole job again: same name, dir, attempt (its payload) and registry record; the failed run's
    process records set aside, MMT_RESTART_COUNT one higher, the time limit what the earlier runs left of it."""
    assert isinstance(backend, Backend) and item.failed_run is not None
    restart = len(item.earlier_runs)
    attempt = item.handle.attempt
    try:
        attempt.set_run_aside(restart - 1)
    except OSError as exc:  # the next run would read this run's failure as its own: give up restarting
        console.write(f"mmt: #{item.plan.num} {item.plan.name}: cannot restart: {attempt.dir}: {exc}\n")
        item.earlier_runs.pop()
        item.report = conclude(item, item.failed_run, console, registry)
        return
    used = sum(run.duration_s or 0.0 for run in item.earlier_runs)
    item.handle = backend.submit(
        Submission(plan=item.plan, attempt=attempt, copied_env=item.copied_env, restart=restart, time_used_s=used)
    )
    item.failed_run = item.restart_at = None
    item.run_started_at = time.time()
    clear_pending_restart(attempt)
    _update(registry, item.plan.name, console, state=JobState.RUNNING.value, restarts=restart)


def cancel_restart(item: Watched) -> JobOutcome:
    """A job stopped between a failed run and the next (Ctrl-C, `mmt stop`) is never restarted: the run that failed
    is its last, and its failure the job's (its result and ``mmt inspect`` tell it)."""
    assert item.failed_run is not None
    item.earlier_runs.pop()
    attempt = item.handle.attempt
    try:
        unrecord_last_run(attempt)
        clear_pending_restart(attempt)
    except OSError:  # the job deleted its dir: nothing there to correct
        pass
    return item.failed_run


def _update(registry: Optional[Registry], name: str, console: Console, **values: Any) -> None:
    if registry is None:
        return
    try:
        registry.update(name, **values)
    except RegistryError as exc:  # the job runs on; the registry learns the count at the end
        console.write(f"mmt: could not update the job registry: {exc}\n")
