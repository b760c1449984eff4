"""SLURM jobs as registered, from any process: their state from the job dir and SLURM's queue, and scancel.

A refresh also keeps the attempt's ``scheduler.json`` (mmt.records.scheduler) saying why the job waits, or since when
SLURM does not answer, for ``mmt list`` and the live page; and a job that can never start (``pending``) is cancelled
and concluded FAILED, saying what it asks and what its partition offers, as the launcher would have."""

import functools
import json
from dataclasses import replace
from pathlib import Path
from typing import FrozenSet, List, Optional, Sequence, Tuple

from mmt.backends.scheduled import refresh_registered
from mmt.backends.slurm import pending, queue
from mmt.backends.slurm.conclusion import conclude
from mmt.backends.slurm.nodes import node_fail_kwargs
from mmt.backends.slurm.sbatch import job_name_for
from mmt.core.errors import NotCarriedOut
from mmt.core.jobdir import Attempt, JobDir, read_json, write_atomic
from mmt.core.states import JobState
from mmt.records.conclusion import conclude_from_outside
from mmt.records.outcome import JobOutcome
from mmt.records.ownership import read_owner
from mmt.records.payload import UnsafePayloadError, read_plan
from mmt.records.reconcile import request_stop
from mmt.records.registry import JobRecord, Registry
from mmt.records.restarts import recorded
from mmt.records.scheduler import SchedulerRecord, read_scheduler, write_scheduler
from mmt.records.schema import ResultRecord

# what one query told of many jobs: the ids it asked about, and its answer
Asked = Tuple[FrozenSet[str], queue.Answer]


def refresh_all(records_: Sequence[JobRecord], registry: Registry) -> List[JobRecord]:
    """Every record brought up to date with one query of SLURM for all of them (``mmt list`` of a 1,000-job sweep:
    one squeue and one sacct, not a thousand of each). A job that has concluded since it was listed is asked about
    too: one more id in the one query costs less than reading every result twice."""
    ids = frozenset(str(r.scheduler_id) for r in records_ if r.scheduler_id)
    asked = (ids, queue.query(sorted(ids), accounting=queue.accounting_available())) if ids else None
    return [refresh(record, registry, asked) for record in records_]


def refresh(record: JobRecord, registry: Registry, asked: Optional[Asked] = None) -> JobRecord:
    return refresh_registered(record, registry, _find_id, functools.partial(_ask, asked=asked))


def _ask(record: JobRecord, registry: Registry, asked: Optional[Asked]) -> Tuple[str, Optional[ResultRecord]]:
    """SLURM's answer about a submitted job (from one query of many jobs, when ``asked`` holds it): its state, and
    its result once it ended without its own last step writing it."""
    job_id = str(record.scheduler_id)
    attempt = JobDir(Path(record.job_dir)).attempt(record.attempt)
    answer = asked[1] if asked is not None and job_id in asked[0] else None
    if answer is None:
        answer = queue.query([job_id], accounting=queue.accounting_available())
    current = answer.states.get(job_id)
    view = read_scheduler(attempt)
    if current is None:
        if answer.unanswered is not None:
            # SLURM cannot be asked: the state stays the last one seen, and scheduler.json says since when
            unanswered = (view or SchedulerRecord(scheduler_id=job_id)).unanswered(answer.unanswered)
            write_scheduler(attempt, unanswered, view)
        return record.state, None
    if not current.final:
        restarted = len(recorded(attempt))  # restarts inside the allocation so far
        if restarted != record.restarts:
            record.restarts = restarted
            registry.update(record.name, restarts=restarted)
        never = _note_queue(attempt, job_id, current, view)
        if never is not None:
            queue.cancel([job_id])
            return record.state, _conclude_ended(record, "CANCELLED", never)
        if view is not None and view.stop_unconfirmed and queue.cancel([job_id]):
            # a stop slurmctld could not take when it was asked (its launcher's Ctrl-C): asked again now
            mark_stop_sent(attempt)
        return (JobState.RUNNING.value if current.state == "RUNNING" else JobState.PENDING.value), None
    # ended in SLURM without its own last step writing the result (cancelled while it waited in the queue, a node
    # lost): concluded here as that step would have, with what SLURM says
    never = view.message if view is not None and view.never_starts else None
    result = _conclude_ended(record, current.state, never, view.stopped_because if view else None)
    return (JobState.STOPPING.value if result is None else record.state), result


def mark_stop_sent(attempt: Attempt) -> None:
    """scheduler.json says slurmctld took the cancel: nobody needs to ask again."""
    view = read_scheduler(attempt)
    if view is not None and view.stop_sent_at is None:
        write_scheduler(attempt, view.stop_sent(), view)


def _note_queue(
    attempt: Attempt, job_id: str, current: queue.SlurmState, view: Optional[SchedulerRecord]
) -> Optional[str]:
    """scheduler.json brought up to date with the queue's answer; the one line of :mod:`pending` when the job waits
    for a reason that never resolves (checked when the reason is first seen, by this process or the launcher)."""
    reason = current.reason if current.state == "PENDING" else None
    seen = (view or SchedulerRecord(scheduler_id=job_id)).seen(
        current.state, reason, pending.explain(reason) if reason else None
    )
    first_seen = view is None or view.reason != reason
    message = pending.check(job_id, reason, _waits_for_jobs(attempt, reason)) if reason and first_seen else None
    if message is not None:
        # recorded before the cancel: whoever sees the job CANCELLED next concludes it FAILED, saying why
        seen = replace(seen, never_starts=True, message=message)
    write_scheduler(attempt, seen, view)
    return message


def _waits_for_jobs(attempt: Attempt, reason: str) -> bool:
    """Whether the job waits for other mmt jobs (its plan, read only for a dependency that failed)."""
    if pending.reason_code(reason) != pending.DEPENDENCY_FAILED:
        return False
    try:
        return bool(read_plan(attempt).after)
    except (OSError, UnsafePayloadError):
        return False


def _conclude_ended(
    record: JobRecord, slurm_state: str, never: Optional[str] = None, stopped_because: Optional[str] = None
) -> Optional[ResultRecord]:
    """``never``: the job was cancelled because it could never start (FAILED, with that line); ``stopped_because``:
    its launcher cancelled it, and why."""
    attempt = JobDir(Path(record.job_dir)).attempt(record.attempt)
    try:
        plan = read_plan(attempt)
    except (OSError, UnsafePayloadError):  # its payload is gone or unsafe: `mmt wait` tells more
        return None
    if never is not None:
        outcome = JobOutcome(JobState.FAILED, None, detail=never, scheduler_id=str(record.scheduler_id))
    else:
        scheduler_id = str(record.scheduler_id)
        outcome = conclude(
            plan,
            attempt,
            scheduler_id=scheduler_id,
            duration_s=None,
            slurm_state=slurm_state,
            stopped_because=stopped_because,
            **node_fail_kwargs(scheduler_id, slurm_state),
        )
    return conclude_from_outside(plan, attempt, outcome)


def _find_id(record: JobRecord) -> Optional[str]:
    """The SLURM job of a record whose launcher died before it saved the id: after sbatch, owner.json or SLURM's queue
    has it ("" when neither does, None when SLURM cannot be asked)."""
    return _scheduler_id_in_owner(record) or _scheduler_id_in_queue(record)


def _scheduler_id_in_owner(record: JobRecord) -> Optional[str]:
    """The id the launcher wrote into the job dir's owner.json right after sbatch, for this attempt."""
    owner = read_owner(Path(record.job_dir))
    if owner is None or owner.attempt != record.attempt or not owner.scheduler_id:
        return None
    return owner.scheduler_id


def _scheduler_id_in_queue(record: JobRecord) -> Optional[str]:
    """The SLURM job of this record's name submitted since the record was created ("" when there is none, None
    when SLURM did not answer). The name is the backend's: unique while registered. A job array's task: the task of
    its index in the array of the name its attempt dir records."""
    task = read_array_task(JobDir(Path(record.job_dir)).attempt(record.attempt))
    if task is None:
        return queue.latest_job_named(job_name_for(record.name), submitted_since=record.created_at)
    name, index = task
    found = queue.latest_job_named(name, submitted_since=record.created_at)
    return f"{found}_{index}" if found else found


def array_task_file(attempt: Attempt) -> Path:
    """Which task of a job array runs the job (the array's job name, the task's index), written before sbatch: how a
    launcher killed before it saved the SLURM id is followed by a job that is found again."""
    return attempt.dir / "array_task.json"


def write_array_task(attempt: Attempt, array_name: str, index: int) -> None:
    write_atomic(array_task_file(attempt), json.dumps({"job_name": array_name, "index": index}).encode())


def read_array_task(attempt: Attempt) -> Optional[Tuple[str, int]]:
    """The job array's name and the task's index, where the job went out as a job array's task."""
    task = read_json(array_task_file(attempt))
    try:
        return (str(task["job_name"]), int(task["index"])) if task is not None else None
    except (KeyError, TypeError, ValueError):
        return None


def stop(record: JobRecord) -> str:
    if record.scheduler_id:
        if not queue.cancel([record.scheduler_id]):
            raise NotCarriedOut(_not_cancelled(record.name, [str(record.scheduler_id)]))
        return f"{record.name}: SLURM job {record.scheduler_id} cancelled"
    return request_stop(record)


def _not_cancelled(what: str, ids: Sequence[str]) -> str:
    return (
        f"{what}: slurmctld did not take the cancel of SLURM job(s) {' '.join(ids)} (scancel failed or timed out). "
        f"HINT: check `squeue -j {','.join(ids)}`, then `mmt stop` again (or `scancel {' '.join(ids)}`)"
    )


def stop_all(records: Sequence[JobRecord]) -> List[str]:
    """One scancel for every job that has a SLURM id (a job array's tasks named as ranges: ``456_[0-999]``)."""
    submitted = [record for record in records if record.scheduler_id]
    lines = [request_stop(record) for record in records if not record.scheduler_id]
    if submitted:
        ids = queue.compact_ids([str(record.scheduler_id) for record in submitted])
        names = submitted[0].name if len(submitted) == 1 else f"{len(submitted)} jobs"
        if not queue.cancel(ids):
            raise NotCarriedOut(_not_cancelled(names, ids), tuple(lines))
        lines.insert(0, f"{names}: SLURM job(s) {' '.join(ids)} cancelled")
    return lines
