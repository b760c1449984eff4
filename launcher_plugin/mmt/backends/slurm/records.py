"""SLURM jobs as registered, from any process: their state from the job dir and SLURM's queue, and scancel.

A refresh also keeps the attempt's ``scheduler.json`` (mmt.records.scheduler) saying why the job waits, or since when
SLURM does not answer, for ``mmt list`` and the live page; and a job that can never start (``pending``) is cancelled
and concluded FAILED, saying what it asks and what its partition offers, as the launcher would have."""

import time
from dataclasses import replace
from pathlib import Path
from typing import Optional

from mmt.backends.slurm import pending, queue
from mmt.backends.slurm.conclusion import conclude
from mmt.backends.slurm.nodes import node_fail_kwargs
from mmt.backends.slurm.sbatch import job_name_for
from mmt.core.jobdir import Attempt, JobDir
from mmt.core.states import JobState
from mmt.records.outcome import JobOutcome, read_primary_return, result_record, return_value_of, write_result
from mmt.records.ownership import lock_is_held, read_owner
from mmt.records.payload import UnsafePayloadError, discard_payload, read_plan
from mmt.records.reconcile import conclude_orphan, own_result, request_stop, save
from mmt.records.registry import JobRecord, Registry
from mmt.records.restarts import recorded, with_earlier_runs, with_requeues
from mmt.records.scheduler import SchedulerRecord, read_scheduler, write_scheduler
from mmt.records.schema import ResultRecord


def refresh(record: JobRecord, registry: Registry) -> JobRecord:
    result = own_result(record)
    if result is None and not record.scheduler_id:
        record = _unsubmitted(record, registry)
        if JobState(record.state).final or not record.scheduler_id:
            return record
    state = record.state
    if result is None and record.scheduler_id:
        job_id = str(record.scheduler_id)
        attempt = JobDir(Path(record.job_dir)).attempt(record.attempt)
        answer = queue.query([job_id], accounting=queue.accounting_available())
        current = answer.states.get(job_id)
        view = read_scheduler(attempt)
        if current is None and answer.unanswered is not None:
            # SLURM cannot be asked: the state stays the last one seen, and scheduler.json says since when
            write_scheduler(attempt, (view or SchedulerRecord(scheduler_id=job_id)).unanswered(answer.unanswered), view)
        elif current is not None and not current.final:
            state = JobState.RUNNING.value if current.state == "RUNNING" else JobState.PENDING.value
            restarted = len(recorded(attempt))  # restarts inside the allocation so far
            if restarted != record.restarts:
                record.restarts = restarted
                registry.update(record.name, restarts=restarted)
            never = _note_queue(attempt, job_id, current, view)
            if never is not None:
                queue.cancel([job_id])
                result = _conclude_ended(record, "CANCELLED", never)
        elif current is not None:
            # ended in SLURM without its own last step writing the result (cancelled while it waited in the queue,
            # a node lost): concluded here as that step would have, with what SLURM says
            never = view.message if view is not None and view.never_starts else None
            result = _conclude_ended(record, current.state, never, view.stopped_because if view else None)
            state = JobState.STOPPING.value if result is None else state
    return save(record, registry, state, result)


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
    message = pending.check(job_id, reason) if reason and first_seen else None
    if message is not None:
        # recorded before the cancel: whoever sees the job CANCELLED next concludes it FAILED, saying why
        seen = replace(seen, never_starts=True, message=message)
    write_scheduler(attempt, seen, view)
    return message


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
    value = return_value_of(read_primary_return(attempt))
    result = with_earlier_runs(result_record(plan, outcome, value, attempt.id, ended_at=time.time()), recorded(attempt))
    result = with_requeues(result, attempt)
    try:
        write_result(plan, result)
    except OSError:
        pass  # the registry keeps it; the job dir cannot be written from here
    discard_payload(attempt)
    return result


def _unsubmitted(record: JobRecord, registry: Registry) -> JobRecord:
    """A record without a SLURM job id: its launcher is submitting it (it holds the job dir's lock), or died before
    it saved the id: after sbatch (the job is found again, in owner.json or SLURM's queue) or before (FAILED)."""
    if lock_is_held(Path(record.job_dir)):
        return record
    current = registry.get(record.name)  # read again: the launcher may have saved the id and ended since
    if current is None or current.attempt != record.attempt or current.scheduler_id or JobState(current.state).final:
        return current or record
    found = _scheduler_id_in_owner(current) or _scheduler_id_in_queue(current)
    if found is None:
        return current  # SLURM cannot be asked now: nothing can be concluded
    if found:
        registry.update(current.name, scheduler_id=found)
        current.scheduler_id = found
        return current
    return conclude_orphan(
        current,
        registry,
        f"its launcher (pid {current.supervisor_pid} on "
        f"{current.supervisor_host}) ended before the job was submitted (killed?)",
    )


def _scheduler_id_in_owner(record: JobRecord) -> Optional[str]:
    """The id the launcher wrote into the job dir's owner.json right after sbatch, for this attempt."""
    owner = read_owner(Path(record.job_dir))
    if owner is None or owner.attempt != record.attempt or not owner.scheduler_id:
        return None
    return owner.scheduler_id


def _scheduler_id_in_queue(record: JobRecord) -> Optional[str]:
    """The SLURM job of this record's name submitted since the record was created ("" when there is none, None
    when SLURM did not answer). The name is the backend's: unique while registered."""
    return queue.latest_job_named(job_name_for(record.name), submitted_since=record.created_at)


def stop(record: JobRecord) -> str:
    if record.scheduler_id:
        queue.cancel([record.scheduler_id])
        return f"{record.name}: SLURM job {record.scheduler_id} cancelled"
    return request_stop(record)
