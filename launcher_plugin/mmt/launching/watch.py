"""The watch stage: follow every job to its end, polling its backend, following rank 0's log on the console,
acting on signals (stop every job; a second one hurries; a hangup detaches or stops) and on `mmt stop`, and
concluding each job as it ends (or restarting it)."""

import signal
import time
from pathlib import Path
from typing import Any, Dict, List, Optional

from mmt.backends.base import JobTracker
from mmt.core.jobdir import WATCHED_FRESH_S, JobDir
from mmt.core.states import ConsoleMode, JobState
from mmt.launching.conclude import conclude
from mmt.launching.console import Console, LogFollower
from mmt.launching.jobs import LaunchOptions, LaunchReport, Watched
from mmt.launching.restart import cancel_restart, may_restart, restart, schedule_restart
from mmt.launching.signals import SignalTrap
from mmt.monitor.progress import ProgressView
from mmt.planning.plan import JobPlan
from mmt.records.registry import Registry

_TICK_S = 0.05
# after a Ctrl-C or SIGTERM, how long a stop the job's cluster does not answer is waited for (a second signal: not at
# all); then the launcher records it as asked and not confirmed, and ends
STOP_CONFIRM_S = 3.0


def watch(
    watched: List[Watched],
    backend: JobTracker[Any],
    options: LaunchOptions,
    console: Console,
    trap: SignalTrap,
    *,
    on_hangup: str,
    on_interrupt: str,
    deadline: Optional[float] = None,
) -> LaunchReport:
    report = LaunchReport(jobs=[])
    _following(watched, True)
    next_beat = time.monotonic() + WATCHED_FRESH_S / 3
    interrupted = killed = False
    interrupted_at = 0.0
    next_stop_check = 0.0
    progress = ProgressView.for_plans(console, [item.plan for item in watched])
    while any(item.report is None and item.unconfirmed is None for item in watched):
        if deadline is not None and time.monotonic() >= deadline:
            report.detached = [item.plan.name for item in watched if item.report is None]
            _following([item for item in watched if item.report is None], False)
            break
        if trap.received is not None and not interrupted:
            interrupted, interrupted_at = True, time.monotonic()
            report.interrupted_by = trap.received
            action = on_hangup if trap.received == signal.SIGHUP else on_interrupt
            if action == "detach":
                report.detached = [item.plan.name for item in watched if item.report is None]
                _following([item for item in watched if item.report is None], False)
                _mark_detached(options.registry, report.detached)
                break
            for item in watched:
                if item.report is None:
                    backend.cancel(item.handle, f"the launcher received {trap.name}")
        if trap.urgent and not killed:
            killed = True
            for item in watched:
                if item.report is None:
                    backend.kill(item.handle)
        backend.wait(_TICK_S)
        for notice in backend.drain_notices():
            console.write(notice + "\n")
        if time.monotonic() >= next_beat:
            next_beat = time.monotonic() + WATCHED_FRESH_S / 3
            _following([item for item in watched if item.report is None], True)
            _beat(watched)
        check_stops = time.monotonic() >= next_stop_check
        if check_stops:
            next_stop_check = time.monotonic() + 0.5
        states: Dict[int, str] = {}
        for item in watched:
            if item.report is not None:
                states[item.plan.num] = item.report.outcome.status.value
                continue
            if item.unconfirmed is not None:
                states[item.plan.num] = JobState.STOPPING.value
                continue
            if item.failed_run is not None:  # between a failure and its restart
                assert item.claim is not None
                if interrupted or (check_stops and item.claim.stop_requested()):
                    item.report = conclude(item, cancel_restart(item), console, options.registry)
                elif item.restart_at is not None and time.monotonic() >= item.restart_at:
                    restart(item, backend, console, options.registry)
                states[item.plan.num] = item.report.outcome.status.value if item.report else JobState.RUNNING.value
                continue
            status = backend.poll(item.handle)
            if status.state != JobState.PENDING and not item.running_seen:
                item.running_seen = True
                item.started_at = time.time()  # it waited in a queue until now (a throttle, a dependency, SLURM)
                item.followers = _followers(item.plan, options.console, console)
                if options.registry is not None:
                    options.registry.update(item.plan.name, state=JobState.RUNNING.value, started_at=item.started_at)
            for follower in item.followers:
                follower.poll()
            if status.outcome is not None:
                if not interrupted and may_restart(item, status.outcome):
                    schedule_restart(item, status.outcome, console, options.registry)
                else:
                    item.report = conclude(item, status.outcome, console, options.registry)
            elif check_stops and item.claim is not None and item.claim.stop_requested():
                backend.cancel(item.handle, "stopped on request (mmt stop)")
            elif interrupted and status.silent is not None:
                if trap.urgent or time.monotonic() - interrupted_at >= STOP_CONFIRM_S:
                    _give_up(item, status.silent, console, options.registry)
                    report.unconfirmed.append(item.plan.name)
            states[item.plan.num] = item.report.outcome.status.value if item.report else status.state.value
        progress.update(states)
    progress.close()
    for notice in backend.drain_notices():  # what the last poll said (how a job concluded while SLURM was silent)
        console.write(notice + "\n")
    report.jobs = [item.report for item in watched if item.report is not None]
    return report


def _following(watched: List[Watched], following: bool) -> None:
    """Say in each attempt dir whether this launcher follows the job to its end (``Attempt.watched``, touched again
    every WATCHED_FRESH_S / 3: a SLURM job that ends well then starts no interpreter of its own to conclude itself).
    Best effort: without a fresh mark, the job concludes itself as a detached one does. Only jobs that outlive
    their launcher can conclude themselves: a local job is never marked."""
    for item in (item for item in watched if item.survives_launcher):
        try:
            if following:
                item.handle.attempt.watched.touch()
            else:
                item.handle.attempt.watched.unlink(missing_ok=True)
        except OSError:
            pass


def _beat(watched: List[Watched]) -> None:
    """Each watched attempt's supervisor is alive now (its beacon's time): a supervisor that dies is concluded by
    whoever finds it dead as ended at its last beat, not when it was found."""
    for item in watched:
        if item.report is None and item.claim is not None and item.claim.beacon is not None:
            item.claim.beacon.beat()


def _give_up(item: Watched, silent: str, console: Console, registry: Optional[Registry]) -> None:
    """A stop the job's cluster does not take: recorded as asked (its backend's record of the stop), left to whoever
    finds the cluster answering again; the launcher ends without it."""
    item.unconfirmed = silent
    _following([item], False)
    console.write(
        f"mmt: job {item.plan.num} ({item.plan.name}): its stop could not be confirmed: {silent}. It may still run; "
        f"the stop is recorded and `mmt list` asks again once the cluster answers\n"
    )
    _mark_detached(registry, [item.plan.name])


def _mark_detached(registry: Optional[Registry], names: List[str]) -> None:
    if registry is not None:
        for name in names:
            registry.update(name, detached=True)


def _followers(plan: JobPlan, mode: ConsoleMode, console: Console) -> List[LogFollower]:
    if mode == ConsoleMode.none:
        return []
    job_dir = JobDir(Path(plan.job_dir))
    places = plan.places() if mode == ConsoleMode.all else plan.places()[:1]
    return [
        LogFollower(
            job_dir.log(p.node_rank, p.rank, plan.per_node),
            f"[#{plan.num} n{p.node_rank}" + ("" if plan.per_node else f" r{p.rank}") + "] ",
            console,
        )
        for p in places
    ]
