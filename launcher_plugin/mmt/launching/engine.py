"""The engine: launch planned jobs on a backend, watch them to the end, conclude and report each.

Every front end calls it: the Hydra launcher (``python train.py -m``), the ``mmt`` CLI and the SDK.

* :func:`launch` (attached):
  1. refuse what the backend cannot run, names the registry already holds, and job dirs a live launch owns, before
     anything starts;
  2. write each job's payload into a new attempt dir (nothing is ever read across attempts), register the job,
     submit it;
  3. watch: follow rank 0's log on the console, stop every job on Ctrl-C/SIGTERM (SIGKILL on a second one), stop
     local jobs and detach from SLURM jobs on SIGHUP (a lost terminal), stop a job someone asked to stop;
  4. conclude every job as it ends: ``result.json``, the attempt's payload removed, the dir released, the registry
     updated; and print and append the sweep summary, saying in one line what could not be written (a full disk).
* :func:`submit` (detached): steps 1 and 2, then return; SLURM jobs conclude themselves inside the allocation,
  local ones in a supervisor process that outlives the terminal (``mmt.launching.supervisor``).
* :func:`attach`: step 3 and 4 for jobs another process started (``mmt wait``).
"""

import atexit
import gc
import os
import re
import shutil
import signal
import socket
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

from mmt.backends.base import Backend, JobHandle, JobTracker, Submission
from mmt.core import proctree, timeline
from mmt.core.jobdir import Attempt, JobDir, SweepDir, new_attempt_id
from mmt.core.states import ConsoleMode, JobState
from mmt.launching.console import Console, LogFollower, tail
from mmt.launching.report import SummaryRow, append_summary_csv, first_line, format_summary, metric_of
from mmt.launching.signals import SignalTrap
from mmt.monitor.progress import ProgressView
from mmt.planning.plan import JobPlan
from mmt.planning.redact import env_names_in, masked_overrides
from mmt.records.outcome import (
    JobOutcome,
    error_for,
    missing_result,
    outcome_of_record,
    read_primary_return,
    read_result,
    result_record,
    return_value_of,
    write_result,
)
from mmt.records.ownership import Claim, claim
from mmt.records.payload import JobPayload, discard_payload, write_payload
from mmt.records.registry import JobRecord, Registry
from mmt.records.restarts import recorded, with_earlier_runs, with_requeues
from mmt.records.schema import EarlierRun, OwnerRecord, ResultRecord, UnknownSchemaError

_TICK_S = 0.05


@dataclass
class PreparedJob:
    """A planned job and what its processes receive."""

    payload: JobPayload
    # the values of plan.env_from, read from the launcher's environment
    copied_env: Dict[str, str] = field(default_factory=dict, repr=False)

    @property
    def plan(self) -> JobPlan:
        return self.payload.plan


@dataclass(frozen=True)
class LaunchOptions:
    sweep_dir: Path
    console: ConsoleMode = ConsoleMode.rank0  # whose output is followed live
    # a job left running when the launcher's terminal goes (SIGHUP) keeps running; the registry says so
    registry: Optional[Registry] = None


@dataclass
class JobReport:
    """How one job ended, as reported to the front end."""

    plan: JobPlan
    outcome: JobOutcome
    attempt: Attempt
    # its result.json
    record: ResultRecord
    # the primary process's JobReturn (Hydra's), when it reported one
    primary: Any = None
    # why result.json could not be written, when it could not
    write_error: Optional[str] = None


@dataclass
class LaunchReport:
    jobs: List[JobReport]
    # the signal that interrupted the launch, if one did
    interrupted_by: Optional[int] = None
    # jobs left running on purpose (SIGHUP on SLURM, Ctrl-C while re-attached): names, for `mmt wait`
    detached: List[str] = field(default_factory=list)
    # jobs never submitted: the launch was interrupted while it submitted them (job numbers)
    unsubmitted: List[int] = field(default_factory=list)


@dataclass
class Submitted:
    """A job a backend accepted, as the front end sees it."""

    plan: JobPlan
    attempt: Attempt
    backend: str
    scheduler_id: Optional[str] = None


@dataclass
class _Watched:
    plan: JobPlan
    handle: JobHandle
    claim: Optional[Claim]
    started_at: float
    # its backend's jobs outlive the launcher: their records stay after concluding (see Backend.survives_launcher)
    survives_launcher: bool = False
    followers: List[LogFollower] = field(default_factory=list)
    running_seen: bool = False
    report: Optional[JobReport] = None
    # restarts (plan.max_restarts; only for jobs this process supervises): the values its processes need again, the
    # runs that failed so far, and the failed run's outcome while the back-off runs
    copied_env: Dict[str, str] = field(default_factory=dict, repr=False)
    earlier_runs: List[EarlierRun] = field(default_factory=list)
    run_started_at: float = 0.0
    restart_at: Optional[float] = None
    failed_run: Optional[JobOutcome] = None


# ------------------------------------------------------------------------------------------------ before anything


def refuse_unrunnable(backend: Backend[Any], plans: Sequence[JobPlan]) -> None:
    for plan in plans:
        problems = backend.problems(plan)
        if problems:
            raise problems[0]


def _refuse_taken_names(registry: Optional[Registry], plans: Sequence[JobPlan]) -> None:
    if registry is None:
        return
    from mmt.core.errors import UsageError

    taken = registry.names_taken([plan.name for plan in plans])
    if taken:
        raise UsageError(
            f"the registry already holds a job named {taken[0]!r}. HINT: choose another name "
            f"(hydra.launcher.name / --name), or `mmt delete {taken[0]}` first"
        )


def _claim_all(plans: Sequence[JobPlan], backend: Backend[Any], attempts: Dict[int, Attempt]) -> Dict[int, Claim]:
    claims: Dict[int, Claim] = {}
    try:
        for plan in plans:
            owner = OwnerRecord.of_this_process(
                attempt=attempts[plan.num].id, name=plan.name, backend=backend.name, job_id=plan.job_id
            )
            claims[plan.num] = claim(JobDir(Path(plan.job_dir)), owner, backend.owner_active)
    except BaseException:
        for held in claims.values():
            held.release(forget=False)
        raise
    return claims


def _record(plan: JobPlan, attempt: Attempt, backend: str, sweep_dir: Path, detached: bool) -> JobRecord:
    return JobRecord(
        name=plan.name,
        job_id=plan.job_id,
        backend=backend,
        job_dir=plan.job_dir,
        sweep_dir=str(sweep_dir.absolute()),
        attempt=attempt.id,
        num_nodes=plan.num_nodes,
        devices=plan.devices,
        machine=plan.machine.name,
        command=plan.command,
        command_mode=plan.command_mode,
        overrides=masked_overrides(plan.overrides, plan.secret_names),
        state=JobState.PENDING.value,
        supervisor_pid=os.getpid(),
        supervisor_host=socket.gethostname(),
        supervisor_start=proctree.start_time(os.getpid()),
        detached=detached,
        created_at=time.time(),
    )


def _start(
    jobs: Sequence[PreparedJob],
    backend: Backend[Any],
    options: LaunchOptions,
    console: Console,
    detached: bool,
    trap: Optional[SignalTrap] = None,
) -> Tuple[List[_Watched], List[JobPlan]]:
    """Refuse, claim, write payloads, register and submit every job; on any failure nothing is left behind.

    A signal caught by ``trap`` stops the submitting: the jobs not submitted yet are given up (their claims, payloads
    and records go) and returned second; the ones submitted are the caller's to stop."""
    plans = [job.plan for job in jobs]
    refuse_unrunnable(backend, plans)
    _refuse_taken_names(options.registry, plans)
    attempts = {plan.num: JobDir(Path(plan.job_dir)).attempt(new_attempt_id()) for plan in plans}
    earlier = {plan.num: _last_attempt(plan) for plan in plans}  # before the claim names this one the owner
    claims = _claim_all(plans, backend, attempts)
    watched: List[_Watched] = []
    launcher_started = timeline.process_start_time()
    try:
        for job in jobs:
            write_payload(attempts[job.plan.num], job.payload)
        if options.registry is not None:
            options.registry.add(
                [_record(p, attempts[p.num], backend.name, options.sweep_dir, detached) for p in plans]
            )
        console.write(f"mmt: launching {len(jobs)} job(s) on cluster={backend.name}, sweep dir {options.sweep_dir}\n")
        for job in jobs:
            if trap is not None and trap.received is not None:
                break
            plan = job.plan
            console.write(
                f"\t#{plan.num} {plan.name}: {' '.join(masked_overrides(plan.overrides, plan.secret_names))}"
                f" ({plan.num_nodes} x {plan.devices})\n"
            )
            aside = _set_earlier_logs_aside(plan, earlier[plan.num])
            if aside is not None:
                console.write(f"\t   (the earlier run's logs are in {aside})\n")
            _new_timeline(attempts[plan.num], launcher_started)
            handle = backend.submit(Submission(plan=plan, attempt=attempts[plan.num], copied_env=job.copied_env))
            timeline.mark_at(attempts[plan.num].timeline, timeline.SUBMITTED)
            watched.append(
                _Watched(
                    plan=plan,
                    handle=handle,
                    claim=claims[plan.num],
                    started_at=time.time(),
                    survives_launcher=backend.survives_launcher,
                    copied_env=dict(job.copied_env),
                    run_started_at=time.time(),
                )
            )
            scheduler_id = backend.poll(handle).scheduler_id
            if scheduler_id:
                claims[plan.num].update(scheduler_id=scheduler_id)
                if options.registry is not None:
                    options.registry.update(plan.name, scheduler_id=scheduler_id)
    except BaseException as exc:
        # a launch is all or nothing: the jobs it submitted before one was refused are cancelled, saying why
        why = f"the launch failed: {first_line(str(exc)) or type(exc).__name__}"
        for item in watched:
            backend.cancel(item.handle, why)
        if watched:
            jobs_text = ", ".join(f"#{item.plan.num} ({item.plan.name})" for item in watched)
            console.write(f"mmt: cancelled the job(s) this launch had submitted, {jobs_text}: {why}\n")
        _give_up(_unsubmitted(plans, watched), attempts, claims, backend, options.registry)
        raise
    unsubmitted = _unsubmitted(plans, watched)
    _give_up(unsubmitted, attempts, claims, backend, options.registry)
    return watched, unsubmitted


def _new_timeline(attempt: Attempt, launcher_started: Optional[float]) -> None:
    """The job dir's timeline is the new attempt's from now on: it starts with the launcher's own start."""
    attempt.timeline.unlink(missing_ok=True)
    timeline.mark_at(attempt.timeline, timeline.LAUNCHER_START, launcher_started)
    timeline.mark_at(attempt.timeline, timeline.SUBMIT)


_SAFE_LABEL = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,80}$")


def _last_attempt(plan: JobPlan) -> Optional[str]:
    """The attempt that last ran in the job dir, if one did: owner.json names the last launch that has not released
    the dir (killed, or a SLURM job's, which stays), result.json the last one that concluded."""
    job_dir = JobDir(Path(plan.job_dir))
    for read in (lambda: OwnerRecord.read(job_dir.owner), lambda: read_result(job_dir.root)):
        try:
            record = read()
        except (UnknownSchemaError, OSError, ValueError):
            continue
        attempt = getattr(record, "attempt", None) if record is not None else None
        if isinstance(attempt, str) and _SAFE_LABEL.match(attempt):
            return attempt
    return None


def _set_earlier_logs_aside(plan: JobPlan, attempt_id: Optional[str]) -> Optional[Path]:
    """A new attempt's logs start empty: the console follows them from their start, and a failing rank's last lines
    are this attempt's, never an earlier run's (a rerun into the same dir: a fixed hydra.sweep.dir, a name reused
    after `mmt delete`, a resume from last.ckpt). The earlier run's logs go to logs/previous/<its attempt>/. A SLURM
    requeue is the same attempt run again: it never comes here, and its ranks append."""
    job_dir = JobDir(Path(plan.job_dir))
    label = attempt_id
    if label is None:  # no record says which run wrote them: when they were last written
        try:
            newest = max(p.stat().st_mtime for p in job_dir.logs.iterdir())
        except (OSError, ValueError):
            newest = time.time()
        label = time.strftime("%Y%m%dT%H%M%S", time.localtime(newest)) + "-earlier"
    try:
        return job_dir.set_logs_aside(label)
    except OSError:  # they stay where they are; the job runs all the same
        return None


def _unsubmitted(plans: Sequence[JobPlan], watched: Sequence[_Watched]) -> List[JobPlan]:
    submitted = {item.plan.num for item in watched}
    return [plan for plan in plans if plan.num not in submitted]


def _give_up(
    plans: Sequence[JobPlan],
    attempts: Dict[int, Attempt],
    claims: Dict[int, Claim],
    backend: Backend[Any],
    registry: Optional[Registry],
) -> None:
    """Jobs that were never submitted leave nothing behind: no attempt, no claim, no record."""
    for plan in plans:
        shutil.rmtree(attempts[plan.num].dir, ignore_errors=True)
        claims[plan.num].release(forget=not backend.survives_launcher)
        if registry is not None:
            registry.delete(plan.name, attempt=attempts[plan.num].id)  # only what this launch inserted


# ------------------------------------------------------------------------------------------------ entry points


@dataclass(frozen=True)
class NotStarted:
    """A job of the batch that was refused (an invalid trial a sweeper proposed): a row of the summary too."""

    num: int
    overrides: Sequence[str]
    reason: str


def launch(
    jobs: Sequence[PreparedJob],
    backend: Backend[Any],
    options: LaunchOptions,
    console: Optional[Console] = None,
    accepted: Optional[Callable[[List[Submitted]], None]] = None,
    not_started: Sequence[NotStarted] = (),
) -> LaunchReport:
    """Run ``jobs`` on ``backend`` until every one has ended (or the launch is detached); conclude each.

    ``accepted``: called once every job is registered and submitted (a detached supervisor tells its launcher).
    """
    own, console = console is None, console or Console()
    _no_last_collection()
    try:
        return _launch(jobs, backend, options, console, accepted, not_started)
    finally:
        if own:
            console.close()


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
        watched, unsubmitted = _start(jobs, backend, options, console, detached=False, trap=trap)
        try:
            if accepted is not None:
                accepted(
                    [
                        Submitted(w.plan, w.handle.attempt, backend.name, backend.poll(w.handle).scheduler_id)
                        for w in watched
                    ]
                )
            report = _watch(
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
    for job in report.jobs:
        timeline.mark_at(job.attempt.timeline, timeline.LAUNCHER_RETURN)
    return report


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
        watched, _ = _start(jobs, backend, options, console, detached=True)
    finally:
        if own:
            console.close()
    submitted = []
    for item in watched:
        if item.claim is not None:
            item.claim.release(forget=False)  # owner.json stays: a rerun asks SLURM whether the job still runs
        scheduler_id = backend.poll(item.handle).scheduler_id
        submitted.append(Submitted(item.plan, item.handle.attempt, backend.name, scheduler_id))
    return submitted


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
    watched = [_Watched(plan=h.plan, handle=h, claim=None, started_at=time.time()) for h in handles]
    deadline = None if timeout_s is None else time.monotonic() + timeout_s
    try:
        with SignalTrap() as trap:
            report = _watch(
                watched, backend, options, console, trap, on_hangup="detach", on_interrupt="detach", deadline=deadline
            )
            summarise(options.sweep_dir, report, console, write_csv=False)
    finally:
        if own:
            console.close()
    return report


# ------------------------------------------------------------------------------------------------ watching


def _watch(
    watched: List[_Watched],
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
    interrupted = killed = False
    next_stop_check = 0.0
    progress = ProgressView.for_plans(console, [item.plan for item in watched])
    while any(item.report is None for item in watched):
        if deadline is not None and time.monotonic() >= deadline:
            report.detached = [item.plan.name for item in watched if item.report is None]
            break
        if trap.received is not None and not interrupted:
            interrupted = True
            report.interrupted_by = trap.received
            action = on_hangup if trap.received == signal.SIGHUP else on_interrupt
            if action == "detach":
                report.detached = [item.plan.name for item in watched if item.report is None]
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
        check_stops = time.monotonic() >= next_stop_check
        if check_stops:
            next_stop_check = time.monotonic() + 0.5
        states: Dict[int, str] = {}
        for item in watched:
            if item.report is not None:
                states[item.plan.num] = item.report.outcome.status.value
                continue
            if item.failed_run is not None:  # between a failure and its restart
                assert item.claim is not None
                if interrupted or (check_stops and item.claim.stop_requested()):
                    item.earlier_runs.pop()  # never restarted: the run that failed is the job's last
                    item.report = _conclude(item, item.failed_run, console, options.registry)
                elif item.restart_at is not None and time.monotonic() >= item.restart_at:
                    _restart(item, backend, console, options.registry)
                states[item.plan.num] = JobState.RUNNING.value
                continue
            status = backend.poll(item.handle)
            if status.state != JobState.PENDING and not item.running_seen:
                item.running_seen = True
                item.followers = _followers(item.plan, options.console, console)
                if options.registry is not None:
                    options.registry.update(item.plan.name, state=JobState.RUNNING.value, started_at=time.time())
            for follower in item.followers:
                follower.poll()
            if status.outcome is not None:
                if not interrupted and _may_restart(item, status.outcome):
                    _schedule_restart(item, status.outcome, console)
                else:
                    item.report = _conclude(item, status.outcome, console, options.registry)
            elif check_stops and item.claim is not None and item.claim.stop_requested():
                backend.cancel(item.handle, "stopped on request (mmt stop)")
            states[item.plan.num] = item.report.outcome.status.value if item.report else status.state.value
        progress.update(states)
    progress.close()
    for notice in backend.drain_notices():  # what the last poll said (how a job concluded while SLURM was silent)
        console.write(notice + "\n")
    report.jobs = [item.report for item in watched if item.report is not None]
    return report


# ------------------------------------------------------------------------------------------------ restarts


def _may_restart(item: _Watched, outcome: JobOutcome) -> bool:
    """Only a failure restarts (a stop, Ctrl-C or the time limit never does), only while restarts are left, and only
    a job this process supervises (its claim: never a job another process watches, nor one that concludes itself)."""
    return (
        outcome.status == JobState.FAILED
        and item.claim is not None
        and not item.survives_launcher
        and len(item.earlier_runs) < item.plan.max_restarts
        and not item.claim.stop_requested()
    )


def _schedule_restart(item: _Watched, outcome: JobOutcome, console: Console) -> None:
    plan, restart = item.plan, len(item.earlier_runs)
    for follower in item.followers:
        follower.poll()
    error = first_line(str(error_for(plan, outcome)))
    item.earlier_runs.append(
        EarlierRun(
            restart=restart,
            error=error,
            started_at=item.run_started_at,
            ended_at=time.time(),
            duration_s=outcome.duration_s,
        )
    )
    item.failed_run, item.restart_at = outcome, time.monotonic() + plan.restart_backoff_s
    console.write(
        f"mmt: #{plan.num} {plan.name} failed: {error}\n"
        f"mmt: #{plan.num} {plan.name}: restart {restart + 1} of {plan.max_restarts}, every rank, "
        f"in {plan.restart_backoff_s:g} s\n"
    )


def _restart(item: _Watched, backend: JobTracker[Any], console: Console, registry: Optional[Registry]) -> None:
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
        item.report = _conclude(item, item.failed_run, console, registry)
        return
    used = sum(run.duration_s or 0.0 for run in item.earlier_runs)
    item.handle = backend.submit(
        Submission(plan=item.plan, attempt=attempt, copied_env=item.copied_env, restart=restart, time_used_s=used)
    )
    item.failed_run = item.restart_at = None
    item.run_started_at = time.time()
    if registry is not None:
        try:
            registry.update(item.plan.name, restarts=restart)
        except Exception as exc:  # the job runs on; the registry learns the count at the end
            console.write(f"mmt: could not update the job registry: {exc}\n")


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


def _conclude(item: _Watched, outcome: JobOutcome, console: Console, registry: Optional[Registry]) -> JobReport:
    plan, attempt = item.plan, item.handle.attempt
    for follower in item.followers:
        follower.finish()
    primary = read_primary_return(attempt)
    existing = _existing_result(plan) if item.claim is None else None
    write_error = None
    if existing is not None and existing.concludes(attempt.id):
        # re-attached to a job that concluded itself: its result is the truth
        record, outcome = existing, outcome_of_record(existing)
    else:
        if outcome.status == JobState.COMPLETED and primary is None:
            outcome.status, outcome.failure = JobState.FAILED, missing_result(plan)
        record = result_record(
            plan, outcome, return_value_of(primary), attempt.id, started_at=item.started_at, ended_at=time.time()
        )
        # the runs this process restarted, else those a restart inside a SLURM allocation recorded
        record = with_requeues(with_earlier_runs(record, item.earlier_runs or recorded(attempt)), attempt)
        try:
            write_result(plan, record)
            timeline.mark_at(attempt.timeline, timeline.CONCLUDED, by="launcher")
        except OSError as exc:
            write_error = f"{JobDir(Path(plan.job_dir)).result}: {exc.strerror or exc}"
    report = JobReport(
        plan=plan, outcome=outcome, attempt=attempt, primary=primary, record=record, write_error=write_error
    )
    if outcome.failure is not None and outcome.failure.rank != 0 and not outcome.failure.missing_result:
        _show_tail(plan, outcome, console)
    # the registry first, then the claim: while its supervisor holds the attempt's beacon, a job is never taken for
    # an orphan, even one whose job dir (and so whose result.json) is gone
    if registry is not None:
        try:
            registry.update(
                plan.name,
                state=outcome.status.value,
                ended_at=time.time(),
                result=record.to_dict(),
                restarts=record.restarts,
            )
        except Exception as exc:  # the job dir has the result; the registry reconciles from it later
            console.write(f"mmt: could not update the job registry: {exc}\n")
    if item.claim is not None:
        _discard(item)
    return report


def _existing_result(plan: JobPlan) -> Optional[ResultRecord]:
    """The job dir's result.json, when this mmt can read it (one a newer mmt wrote concludes another attempt)."""
    try:
        return read_result(Path(plan.job_dir))
    except UnknownSchemaError:
        return None


def _show_tail(plan: JobPlan, outcome: JobOutcome, console: Console) -> None:
    failure = outcome.failure
    assert failure is not None
    label = f"[#{plan.num} n{failure.node_rank}" + ("" if plan.per_node else f" r{failure.rank}") + "]"
    lines = tail(Path(failure.log))
    if lines:
        console.write(f"{label} --- last lines of {failure.log} ---\n" + "".join(f"{label} {line}\n" for line in lines))


def _discard(item: _Watched) -> None:
    """The attempt's pickled code, config and secrets go; where jobs outlive the launcher (SLURM) its records stay
    (the job's own last step may still read them) and so does owner.json (a rerun asks whether that job still
    runs)."""
    assert item.claim is not None
    attempt = item.handle.attempt
    local = not item.survives_launcher
    try:
        if local:
            shutil.rmtree(attempt.dir, ignore_errors=True)
        else:
            discard_payload(attempt)
            attempt.concluded.touch()
    finally:
        item.claim.release(forget=local)


# ------------------------------------------------------------------------------------------------ the summary


def summarise(
    sweep_dir: Path,
    report: LaunchReport,
    console: Console,
    write_csv: bool = True,
    not_started: Sequence[NotStarted] = (),
) -> None:
    rows, metric_name = [], "metric"
    for job in report.jobs:
        plan, outcome = job.plan, job.outcome
        # the key the number is under, as result.json records it (a returned number: the app's optimized_metric)
        metric = metric_of(job.record.return_value, job.record.summary_metric)
        metric_name = metric["name"] if metric["value"] != "-" else metric_name
        note = "" if outcome.status == JobState.COMPLETED else first_line(job.record.error or "")
        note = note.removeprefix(f"{plan.label}: ")
        if job.record.restarts and outcome.status == JobState.COMPLETED:
            note = f"completed after {job.record.restarts} restart(s): " + "; ".join(
                f"run {run.restart}: {run.error.removeprefix(f'{plan.label}: ')}" for run in job.record.earlier_runs
            )
        rows.append(
            SummaryRow(
                job=plan.num,
                name=plan.name,
                overrides=" ".join(masked_overrides(plan.overrides, plan.secret_names)),
                status=outcome.status.value,
                num_nodes=plan.num_nodes,
                devices=plan.devices,
                duration_s=outcome.duration_s,
                metric=metric["value"],
                note=note,
            )
        )
    for refused in not_started:
        rows.append(
            SummaryRow(
                job=refused.num,
                name="-",
                overrides=" ".join(masked_overrides(refused.overrides, env_names_in(refused.overrides))),
                status="FAILED",
                num_nodes=0,
                devices=0,
                duration_s=None,
                metric="-",
                note=f"not started: {first_line(refused.reason)}",
            )
        )
    rows.sort(key=lambda row: row.job)
    if rows:
        console.write("\n" + format_summary(f"mmt summary ({sweep_dir})", rows, metric_name) + "\n\n")
    unwritten = [job.write_error for job in report.jobs if job.write_error is not None]
    if rows and write_csv:
        try:
            append_summary_csv(SweepDir(sweep_dir).summary_csv, rows, metric_name)
        except OSError as exc:
            unwritten.append(f"{SweepDir(sweep_dir).summary_csv}: {exc.strerror or exc}")
        try:
            from mmt.monitor.plots import Plotter

            Plotter.draw(sweep_dir)
        except OSError as exc:
            unwritten.append(f"{SweepDir(sweep_dir).summary_png}: {exc.strerror or exc}")
    if unwritten:
        console.write(
            f"mmt: could not write {len(unwritten)} file(s); the summary above is complete: "
            + "; ".join(unwritten)
            + "\n"
        )
    if report.detached:
        console.write(
            f"mmt: {len(report.detached)} job(s) run on, detached: {', '.join(report.detached)}. "
            "Follow them with `mmt wait NAME`, `mmt logs NAME -f` or `mmt list`\n"
        )
    elif report.interrupted_by is not None:
        console.write(
            f"mmt: {signal.Signals(report.interrupted_by).name} received; every rank of every job was stopped\n"
        )
