"""SLURM jobs as registered, from any process: their state from the job dir and SLURM's queue, and scancel."""

import time
from pathlib import Path
from typing import Optional

from mmt.backends.slurm import queue
from mmt.backends.slurm.conclusion import conclude
from mmt.backends.slurm.sbatch import job_name_for
from mmt.core.jobdir import JobDir
from mmt.core.states import JobState
from mmt.records.outcome import read_primary_return, result_record, return_value_of, write_result
from mmt.records.ownership import lock_is_held, read_owner
from mmt.records.payload import UnsafePayloadError, discard_payload, read_plan
from mmt.records.reconcile import conclude_orphan, own_result, request_stop, save
from mmt.records.registry import JobRecord, Registry
from mmt.records.schema import ResultRecord


def refresh(record: JobRecord, registry: Registry) -> JobRecord:
    result = own_result(record)
    if result is None and not record.scheduler_id:
        record = _unsubmitted(record, registry)
        if JobState(record.state).final or not record.scheduler_id:
            return record
    state = record.state
    if result is None and record.scheduler_id:
        seen = queue.job_states([record.scheduler_id], accounting=queue.accounting_available())
        current = seen.get(record.scheduler_id)
        if current is not None and not current.final:
            state = JobState.RUNNING.value if current.state == "RUNNING" else JobState.PENDING.value
        elif current is not None:
            # ended in SLURM without its own last step writing the result (cancelled while it waited in the queue,
            # a node lost): concluded here as that step would have, with what SLURM says
            result = _conclude_ended(record, current.state)
            state = JobState.STOPPING.value if result is None else state
    return save(record, registry, state, result)


def _conclude_ended(record: JobRecord, slurm_state: str) -> Optional[ResultRecord]:
    attempt = JobDir(Path(record.job_dir)).attempt(record.attempt)
    try:
        plan = read_plan(attempt)
    except (OSError, UnsafePayloadError):  # its payload is gone or unsafe: `mmt wait` tells more
        return None
    outcome = conclude(plan, attempt, scheduler_id=str(record.scheduler_id), duration_s=None, slurm_state=slurm_state)
    value = return_value_of(read_primary_return(attempt))
    result = result_record(plan, outcome, value, attempt.id, ended_at=time.time())
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
    return conclude_orphan(current, registry, f"its launcher (pid {current.supervisor_pid} on "
                           f"{current.supervisor_host}) ended before the job was submitted (killed?)")


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
