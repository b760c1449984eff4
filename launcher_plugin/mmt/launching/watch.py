"""The watch stage: follow every job to its end, polling its backend, following rank 0's log on the console,
acting on signals (stop every job; a second one hurries; a hangup detaches or stops) and on `mmt stop`, and
concluding each job as it ends (or restarting it)."""

import signal
import time
from dataclasses import dataclass, field
from typing import Any, List, Optional

from mmt.backends.base import JobTracker
from mmt.core.jobdir import WATCHED_FRESH_S
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
    loop = _WatchLoop(watched, backend, options, console, trap, on_hangup, on_interrupt)
    _following(watched, True)
    progress = ProgressView.for_plans(console, [item.plan for item in watched])
    while any(item.report is None and item.unconfirmed is None for item in watched):
        if deadline is not None and time.monotonic() >= deadline:
            loop.report.detached = [item.plan.name for item in watched if item.report is None]
            _following([item for item in watched if item.report is None], False)
            break
        if loop.on_signal():
            break  # detached
        loop.tick()
        progress.update({item.plan.num: loop.step(item) for item in watched})
    progress.close()
    for notice in backend.drain_notices():  # what the last poll said (how a job concluded while SLURM was silent)
        console.write(notice + "\n")
    loop.report.jobs = [item.report for item in watched if item.report is not None]
    return loop.report


@dataclass
class _WatchLoop:
    """One watch's state between its ticks: whether it was interrupted, and when its marks and stop checks are due."""

    watched: List[Watched]
    backend: JobTracker[Any]
    options: LaunchOptions
    console: Console
    trap: SignalTrap
    on_hangup: str
    on_interrupt: str
    report: LaunchReport = field(default_factory=lambda: LaunchReport(jobs=[]))
    interrupted: bool = False
    killed: bool = False
    check_stops: bool = False
    interrupted_at: float = 0.0
    next_stop_check: float = 0.0
    next_beat: float = field(default_factory=lambda: time.monotonic() + WATCHED_FRESH_S / 3)

    def on_signal(self) -> bool:
        """Act on a signal once (stop every job, or detach: then True), and on a second one (hurry)."""
        trap, watched = self.trap, self.watched
        if trap.received is not None and not self.interrupted:
            self.interrupted, self.interrupted_at = True, time.monotonic()
            self.report.interrupted_by = trap.received
            action = self.on_hangup if trap.received == signal.SIGHUP else self.on_interrupt
            if action == "detach":
                self.report.detached = [item.plan.name for item in watched if item.report is None]
                _following([item for item in watched if item.report is None], False)
                _mark_detached(self.options.registry, self.report.detached)
                return True
            for item in watched:
                if item.report is None:
                    self.backend.cancel(item.handle, f"the launcher received {trap.name}")
        if trap.urgent and not self.killed:
            self.killed = True
            for item in watched:
                if item.report is None:
                    self.backend.kill(item.handle)
        return False

    def tick(self) -> None:
        """Wait for the backend, say what it says, keep the marks of a watched job fresh, see whether stop requests
        are due to be looked for."""
        self.backend.wait(_TICK_S)
        for notice in self.backend.drain_notices():
            self.console.write(notice + "\n")
        if time.monotonic() >= self.next_beat:
            self.next_beat = time.monotonic() + WATCHED_FRESH_S / 3
            _following([item for item in self.watched if item.report is None], True)
            _beat(self.watched)
        self.check_stops = time.monotonic() >= self.next_stop_check
        if self.check_stops:
            self.next_stop_check = time.monotonic() + 0.5

    def step(self, item: Watched) -> str:
        """One job's turn: polled, followed, concluded or restarted as it ends; its state for the progress view."""
        if item.report is not None:
            return item.report.outcome.status.value
        if item.unconfirmed is not None:
            return JobState.STOPPING.value
        if item.failed_run is not None:  # between a failure and its restart
            return self._between_runs(item)
        status = self.backend.poll(item.handle)
        if status.state != JobState.PENDING and not item.running_seen:
            self._running(item)
        for follower in item.followers:
            follower.poll()
        if status.outcome is not None:
            if not self.interrupted and may_restart(item, status.outcome):
                schedule_restart(item, status.outcome, self.console, self.options.registry)
            else:
                item.report = conclude(item, status.outcome, self.console, self.options.registry)
        elif self.check_stops and item.claim is not None and item.claim.stop_requested():
            self.backend.cancel(item.handle, "stopped on request (mmt stop)")
        elif self.interrupted and status.silent is not None:
            if self.trap.urgent or time.monotonic() - self.interrupted_at >= STOP_CONFIRM_S:
                _give_up(item, status.silent, self.console, self.options.registry)
                self.report.unconfirmed.append(item.plan.name)
        return item.report.outcome.status.value if item.report else status.state.value

    def _between_runs(self, item: Watched) -> str:
        assert item.claim is not None
        if self.interrupted or (self.check_stops and item.claim.stop_requested()):
            item.report = conclude(item, cancel_restart(item), self.console, self.options.registry)
        elif item.restart_at is not None and time.monotonic() >= item.restart_at:
            restart(item, self.backend, self.console, self.options.registry)
        return item.report.outcome.status.value if item.report else JobState.RUNNING.value

    def _running(self, item: Watched) -> None:
        item.running_seen = True
        item.started_at = time.time()  # it waited in a queue until now (a throttle, a dependency, SLURM)
        item.followers = _followers(item.plan, self.options.console, self.console)
        if self.options.registry is not None:
            self.options.registry.update(item.plan.name, state=JobState.RUNNING.value, started_at=item.started_at)


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
    indices = range(plan.process_count) if mode == ConsoleMode.all else range(1)
    return [LogFollower(plan.log_path(i), _prefix(plan, i), console) for i in indices]


def _prefix(plan: JobPlan, index: int) -> str:
    """``[#3 n1 r2] ``: the job, node and rank of a followed line (with roles, the role's own numbering)."""
    place, role = plan.place(index), plan.role_at(index) if plan.roles else None
    per_node = plan.per_node if role is None else role.per_node
    return (
        f"[#{plan.num} "
        + ("" if role is None else f"{role.name} ")
        + f"n{place.node_rank}"
        + ("" if per_node else f" r{place.rank}")
        + "] "
    )
