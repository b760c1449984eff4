"""Ray jobs as registered, from any process (``mmt list``, ``mmt stop``, the SDK): their state from the job dir and
the cluster's job API, and a stop.

Which cluster and Ray job an attempt is, is in its attempt dir (``ray.json``, written before the job was submitted).
A job whose launcher was killed runs on and concludes itself (its driver writes ``result.json``); one whose driver
was killed too is concluded here from what its processes left and what Ray says, as the driver would have."""

from dataclasses import replace
from pathlib import Path
from typing import Optional, Tuple

from mmt.backends.ray.api import RayApi, RayJob, Refused, Unanswered
from mmt.backends.ray.conclusion import ended_outside
from mmt.backends.ray.task import DRIVER_CANNOT_RUN, JobRef, cannot_run, driver_log
from mmt.backends.scheduled import refresh_registered
from mmt.backends.silence import Silence
from mmt.core.errors import NotCarriedOut
from mmt.core.jobdir import Attempt, JobDir, write_atomic
from mmt.core.states import JobState
from mmt.planning.plan import JobPlan
from mmt.records.conclusion import conclude_from_outside
from mmt.records.outcome import JobOutcome
from mmt.records.payload import UnsafePayloadError, read_plan
from mmt.records.reconcile import own_result, request_stop
from mmt.records.registry import JobRecord, Registry
from mmt.records.restarts import pending_restart, recorded
from mmt.records.scheduler import SchedulerRecord, read_scheduler, write_scheduler
from mmt.records.schema import ResultRecord

# who scheduler.json names when the cluster cannot be asked
DASHBOARD = "the Ray dashboard"
# why `mmt stop` stopped a job (its driver says so in the result)
STOP_REQUESTED = "stopped on request (mmt stop)"


def attempt_of(record: JobRecord) -> Attempt:
    return JobDir(Path(record.job_dir)).attempt(record.attempt)


def running_state(attempt: Attempt, job: RayJob) -> str:
    """mmt's state of a Ray job that has not ended: RESTARTING between a failed run and the next."""
    if job.status == "PENDING":
        return JobState.PENDING.value
    return JobState.RESTARTING.value if pending_restart(attempt) is not None else JobState.RUNNING.value


def refresh(record: JobRecord, registry: Registry) -> JobRecord:
    return refresh_registered(record, registry, _find_id, _ask)


def _ask(record: JobRecord, registry: Registry) -> Tuple[str, Optional[ResultRecord]]:
    """The cluster's answer about a submitted job: its state, and its result once it has ended (concluded here as
    its driver would have, when the driver could not)."""
    attempt = attempt_of(record)
    ref = JobRef.read(attempt)
    if ref is None:
        return record.state, None
    view = read_scheduler(attempt)
    try:
        job = RayApi(ref.address).job(ref.submission_id)
    except (Unanswered, Refused) as exc:
        # the cluster cannot be asked: the state stays the last one seen, and scheduler.json says since when; past
        # the job's grace, it is lost with its cluster
        unanswered = (view or SchedulerRecord(scheduler_id=ref.submission_id)).unanswered(DASHBOARD)
        write_scheduler(attempt, unanswered, view)
        silence = Silence(f"the Ray dashboard at {ref.address}", unanswered.unreachable_since or 0.0, exc.reason)
        if not silence.over(ref.grace_s):
            return record.state, None
        lost = silence.lost(ref.grace_s, LOST_WHILE_SILENT, check(ref))
        return record.state, _conclude_lost(record, attempt, ref, silence, lost)
    if job is not None and not job.final:
        runs = len(recorded(attempt))  # restarts by its driver so far
        if runs != record.restarts:
            record.restarts = runs
            registry.update(record.name, restarts=runs)
        if view is not None:
            _answered(attempt, ref, view)
        return running_state(attempt, job), None
    if job is None and view is not None and view.unreachable_since is not None:
        # the cluster went silent while the job ran, and answers again without it: lost with it (a restarted head)
        silence = Silence(f"the Ray dashboard at {ref.address}", view.unreachable_since, "not answering")
        lost = silence.came_back_without(check(ref))
        return record.state, own_result(record) or _conclude_lost(record, attempt, ref, silence, lost)
    # its driver writes the result before it exits: read again, then conclude as it would have
    return record.state, own_result(record) or conclude_ended(record, attempt, job)


def _find_id(record: JobRecord) -> Optional[str]:
    """The Ray job of a record whose launcher died before it saved the id: ray.json names it, and the cluster
    knows it ("" when it does not, None when it cannot be asked)."""
    ref = JobRef.read(attempt_of(record))
    if ref is None:
        return ""
    try:
        job = RayApi(ref.address).job(ref.submission_id)
    except (Unanswered, Refused):
        return None
    return ref.submission_id if job is not None else ""


# what may still run of a job lost with its cluster, by how it was found lost
LOST_WHILE_SILENT = (
    "its ranks end with the cluster's nodes once these lose their head (Ray: within a minute); if only the dashboard "
    "went, they run on"
)


def _conclude_lost(
    record: JobRecord, attempt: Attempt, ref: JobRef, silence: Silence, detail: str
) -> Optional[ResultRecord]:
    """A job lost with its cluster, concluded from outside: FAILED, saying so; its duration ends when the cluster
    was last heard (the silence's start)."""
    try:
        plan = read_plan(attempt)
    except (OSError, UnsafePayloadError):  # its payload is gone or unsafe: `mmt wait` tells more
        return None
    started = record.started_at if record.started_at is not None else record.created_at
    outcome = JobOutcome(
        JobState.FAILED,
        max(0.0, silence.since - started) if started is not None else None,
        detail=detail,
        scheduler_id=ref.submission_id,
    )
    return conclude_from_outside(plan, attempt, outcome, ended_at=silence.since)


def check(ref: JobRef) -> str:
    """How to look at a Ray job by hand."""
    return (
        f"`ray job status --address {ref.address} {ref.submission_id}` (and `ray job stop ...`) once it answers, or "
        "`ray status` on the head"
    )


def _answered(attempt: Attempt, ref: JobRef, view: SchedulerRecord) -> None:
    """The cluster answers, and the job runs: a silence it was in is over, and a stop it could not take before (its
    launcher's Ctrl-C, `mmt stop`) is asked again now."""
    if view.stop_unconfirmed:
        try:
            RayApi(ref.address).stop(ref.submission_id)
        except (Unanswered, Refused):
            return
        view, previous = view.stop_sent(), view
        write_scheduler(attempt, view.answered(), previous)
    elif view.unreachable_since is not None:
        write_scheduler(attempt, view.answered(), view)


def conclude_ended(record: JobRecord, attempt: Attempt, job: Optional[RayJob]) -> Optional[ResultRecord]:
    """A Ray job that ended (or that the cluster no longer knows) without its driver's result: concluded from what
    its processes left, what Ray says, and why its launcher stopped it (scheduler.json)."""
    try:
        plan = read_plan(attempt)
    except (OSError, UnsafePayloadError):  # its payload is gone or unsafe: `mmt wait` tells more
        return None
    scheduler_id = str(record.scheduler_id)
    outcome = outcome_ended(plan, attempt, scheduler_id, job)
    return conclude_from_outside(plan, attempt, outcome)


def outcome_ended(plan: JobPlan, attempt: Attempt, scheduler_id: str, job: Optional[RayJob]) -> JobOutcome:
    """How a Ray job ended that its driver did not conclude (the launcher and ``mmt list`` alike)."""
    status, message = (job.status, job.message) if job is not None else ("GONE", "the cluster no longer knows it")
    outcome = ended_outside(plan, attempt, scheduler_id, status, message)
    unrunnable = _driver_cannot_run(attempt, job) if job is not None and status == "FAILED" else None
    if unrunnable is not None:
        outcome.status, outcome.failure, outcome.detail = JobState.FAILED, None, unrunnable
        return outcome
    view = read_scheduler(attempt)
    # a stop the cluster never took did not end the job: whatever did is its cause
    if outcome.status != JobState.COMPLETED and view is not None and view.stopped_because and not view.stop_unconfirmed:
        outcome.status, outcome.failure = JobState.INTERRUPTED, None
        outcome.detail = f"stopped: {view.stopped_because}"
    return outcome


# what a shell says when the entrypoint's `python` is not on its PATH
_NO_PYTHON = ("python: not found", "python: command not found")


def _driver_cannot_run(attempt: Attempt, job: RayJob) -> Optional[str]:
    """One line when the cluster could not run mmt's driver at all (the entrypoint's python lacks mmt, is of another
    version, or is not there); Ray's whole driver log is kept in the attempt dir beside it. None otherwise."""
    found = cannot_run(job.message)
    missing = any(said in job.message for said in _NO_PYTHON)
    if found is None and not missing and job.driver_exit_code != DRIVER_CANNOT_RUN:
        return None
    ref = JobRef.read(attempt)
    address = ref.address if ref is not None else "?"
    log = job.message
    if ref is not None:
        try:
            log = RayApi(ref.address).logs(ref.submission_id) or log
        except (Unanswered, Refused):
            pass
    found = found or cannot_run(log)
    kept = driver_log(attempt)
    try:
        write_atomic(kept, log.encode(errors="replace"), private=True)
        where = f"; Ray's log of it: {kept}"
    except OSError:
        where = ""
    if found is not None:
        return found.line(address) + where
    if missing:
        return (
            f"the Ray cluster at {address} cannot run mmt's driver: the job's entrypoint found no `python` on the "
            "head's PATH. HINT: start the cluster (`ray start`) from the environment that has mmt and your app "
            "(activated, or its bin dir first on the PATH), or start it from an image that has them" + where
        )
    return None


def mark_stopped(attempt: Attempt, scheduler_id: str, why: str) -> None:
    """scheduler.json says why the job is stopped, before the stop: whoever concludes it then says so."""
    view = read_scheduler(attempt)
    write_scheduler(attempt, _with_stop(view or SchedulerRecord(scheduler_id=scheduler_id), why), view)


def _with_stop(view: SchedulerRecord, why: str) -> SchedulerRecord:
    return view if view.stopped_because else replace(view, stopped_because=why)


def mark_stop_sent(attempt: Attempt) -> None:
    """scheduler.json says the cluster took the stop: nobody needs to ask again."""
    view = read_scheduler(attempt)
    if view is not None and view.stop_sent_at is None:
        write_scheduler(attempt, view.stop_sent(), view)


def stop(record: JobRecord) -> str:
    attempt = attempt_of(record)
    ref = JobRef.read(attempt)
    if not record.scheduler_id or ref is None:
        return request_stop(record)  # not submitted yet: its launcher stops it
    mark_stopped(attempt, ref.submission_id, STOP_REQUESTED)
    try:
        stopped = RayApi(ref.address).stop(ref.submission_id)
    except (Unanswered, Refused) as exc:
        raise NotCarriedOut(
            f"{record.name}: could not stop Ray job {ref.submission_id}: {exc}. The stop is recorded: `mmt list` asks "
            f"again once the cluster answers. HINT: check the cluster (`ray status` on the head), then `mmt stop "
            f"{record.name}` again"
        ) from None
    mark_stop_sent(attempt)
    if not stopped:
        return f"{record.name}: Ray job {ref.submission_id} had ended already"
    return f"{record.name}: Ray job {ref.submission_id} stopped"
