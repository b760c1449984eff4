"""The engine: launch planned jobs on a backend, watch them to the end, conclude and report each. Its stages are
modules of their own, in the order a job meets them:

1. ``submit``: refuse what the backend cannot run, names the registry already holds, and job dirs a live launch
   owns, before anything starts; write each job's payload into a new attempt dir, register it, submit it;
2. ``watch``: follow rank 0's log on the console, stop every job on Ctrl-C/SIGTERM (SIGKILL on a second one), stop
   local jobs and detach from SLURM jobs on SIGHUP (a lost terminal), stop a job someone asked to stop;
3. ``restart``: a job that failed by itself starts again, whole, while it may (``max_restarts``);
4. ``conclude``: each job as it ends, its records written in one call (mmt.records.conclusion);
5. ``report``: the sweep summary printed and appended, ``summary.png`` drawn.

Three entry points, each a sequence of those stages; the launch session (``mmt.launching.session``) is what the
front ends call, and it calls these:

* :func:`launch` (attached): all five stages;
* :func:`submit` (detached): the first, then return; SLURM jobs conclude themselves inside the allocation, local
  ones in a supervisor process that outlives the terminal (``mmt.launching.supervisor``);
* :func:`attach`: watch, conclude and report jobs another process started (``mmt wait``).
"""

import atexit
import gc
import time
from typing import Any, Callable, List, Optional, Sequence

from mmt.backends.base import Backend, JobHandle, JobTracker
from mmt.core import timeline
from mmt.launching.console import Console
from mmt.launching.jobs import (
    JobReport,
    LaunchOptions,
    LaunchReport,
    NotStarted,
    PreparedJob,
    Submitted,
    Watched,
)
from mmt.launching.report import summarise
from mmt.launching.signals import SignalTrap
from mmt.launching.submit import refuse_unrunnable, start_jobs
from mmt.launching.watch import watch
from mmt.planning.redact import masked_overrides

__all__ = [
    "JobReport",
    "LaunchOptions",
    "LaunchReport",
    "NotStarted",
    "PreparedJob",
    "Submitted",
    "attach",
    "launch",
    "refuse_unrunnable",
    "submit",
    "summarise",
]


def launch(
    jobs: Sequence[PreparedJob],
    backend: Backend[Any],
    options: LaunchOptions,
    console: Optional[Console] = None,
    accepted: Optional[Callable[[List[Submitted]], None]] = None,
    not_started: Sequence[NotStarted] = (),
) -> LaunchReport:
    """Run ``jobs`` on ``backend`` until every one has ended (or the launch is detached); conclude each and print the
    summary. ``accepted``: called once every job is registered and submitted (a detached supervisor tells its
    launcher)."""
    own, console = console is None, console or Console()
    _no_last_collection()
    try:
        report = _launch(jobs, backend, options, console, accepted, not_started)
    finally:
        if own:
            console.close()
    for job in report.jobs:
        timeline.mark_at(job.attempt.timeline, timeline.LAUNCHER_RETURN)
    return report


def _launch(
    jobs: Sequence[PreparedJob],
    backend: Backend[Any],
    options: LaunchOptions,
    console: Console,
    accepted: Optional[Callable[[List[Submitted]], None]],
    not_started: Sequence[NotStarted],
) -> LaunchReport:
    # from the first submission to the last line of the summary, a signal is a flag (the first stops every job, a
    # second hurries): a Ctrl-C or a hangup while jobs are being submitted still ends with every result written
    with SignalTrap() as trap:
        watched, unsubmitted = start_jobs(jobs, backend, options, console, detached=False, trap=trap)
        try:
            if accepted is not None:
                accepted([_submitted(item, backend) for item in watched])
            report = watch(
                watched,
                backend,
                options,
                console,
                trap,
                on_hangup="detach" if backend.survives_launcher else "stop",
                on_interrupt="stop",
            )
        except BaseException:
            # a bug, or an exception from the backend: nothing may be left running or unreported
            for item in watched:
                if item.report is None:
                    backend.cancel(item.handle, "the launcher failed")
            raise
        finally:
            for item in watched:
                if item.claim is not None and item.claim.fd >= 0:
                    item.claim.release(forget=False)
        report.unsubmitted = [plan.num for plan in unsubmitted]
        why = f"the launcher received {trap.name} before it was submitted"
        not_started = [
            *not_started,
            *(NotStarted(plan.num, masked_overrides(plan.overrides, plan.secret_names), why) for plan in unsubmitted),
        ]
        summarise(options.sweep_dir, report, console, not_started=not_started)
    return report


def _submitted(item: Watched, backend: Backend[Any]) -> Submitted:
    return Submitted(item.plan, item.handle.attempt, backend.name, backend.poll(item.handle).scheduler_id)


def _no_last_collection() -> None:
    """At the launcher's exit, Python's last garbage collection walks every object the launch left (Hydra's configs,
    the payloads): a tenth of a second here between the summary and the prompt, for garbage that needs no collecting
    (the launch has closed its files). Objects frozen at exit are skipped; anything made after is collected."""
    if not _FREEZE_AT_EXIT:
        atexit.register(gc.freeze)
        _FREEZE_AT_EXIT.append(True)


_FREEZE_AT_EXIT: List[bool] = []


def submit(
    jobs: Sequence[PreparedJob], backend: Backend[Any], options: LaunchOptions, console: Optional[Console] = None
) -> List[Submitted]:
    """Start ``jobs`` and return at once; they conclude themselves (a backend whose jobs outlive the launcher)."""
    assert backend.survives_launcher, f"cluster={backend.name} jobs need a supervisor to outlive the launcher"
    own, console = console is None, console or Console()
    try:
        watched, _ = start_jobs(jobs, backend, options, console, detached=True)
    finally:
        if own:
            console.close()
    for item in watched:
        if item.claim is not None:
            item.claim.release(forget=False)  # owner.json stays: a rerun asks SLURM whether the job still runs
    return [_submitted(item, backend) for item in watched]


def attach(
    handles: Sequence[JobHandle],
    backend: JobTracker[Any],
    options: LaunchOptions,
    console: Optional[Console] = None,
    timeout_s: Optional[float] = None,
) -> LaunchReport:
    """Watch jobs another process started until they end (``mmt wait``); Ctrl-C stops watching, not the jobs;
    so does ``timeout_s``."""
    own, console = console is None, console or Console()
    watched = [Watched(plan=h.plan, handle=h, claim=None, started_at=time.time()) for h in handles]
    deadline = None if timeout_s is None else time.monotonic() + timeout_s
    try:
        with SignalTrap() as trap:
            report = watch(
                watched, backend, options, console, trap, on_hangup="detach", on_interrupt="detach", deadline=deadline
            )
            summarise(options.sweep_dir, report, console, write_csv=False)
    finally:
        if own:
            console.close()
    return report
