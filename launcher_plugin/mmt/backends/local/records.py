"""Local jobs as registered, from any process: their state from the job dir, and a stop request. A local job is
running while its supervisor (the launcher, or a detached supervisor) is alive: it holds the attempt's beacon in the
run dir (mmt.records.liveness), which the job cannot delete, unlike its job dir."""

from pathlib import Path

from mmt.agent import containers
from mmt.core.jobdir import JobDir
from mmt.core.states import JobState
from mmt.records.liveness import supervisor_alive
from mmt.records.reconcile import conclude_orphan, own_result, save
from mmt.records.registry import JobRecord, Registry
from mmt.records.restarts import pending_restart


def refresh(record: JobRecord, registry: Registry) -> JobRecord:
    alive = supervisor_alive(record)  # before reading the result: the beacon is released after it is written
    result = own_result(record)
    job_dir = JobDir(Path(record.job_dir))
    if result is None and not alive:
        if record.attempt:  # a job with an image: its nodes' containers, by their label
            containers.remove_recorded(job_dir.attempt(record.attempt), record.job_id)
        return conclude_orphan(record, registry, _orphan_reason(record))
    state = record.state
    if result is None and pending_restart(job_dir.attempt(record.attempt)) is not None:
        state = JobState.RESTARTING.value  # between a failed run and the next: its supervisor says when
    elif result is None and job_dir.logs.exists():
        state = JobState.RUNNING.value
    return save(record, registry, state, result)


def _orphan_reason(record: JobRecord) -> str:
    if record.started_at is not None or JobDir(Path(record.job_dir)).logs.exists():
        return f"its supervisor (pid {record.supervisor_pid}) ended without concluding it (killed?)"
    return f"its launcher (pid {record.supervisor_pid}) ended before the job was started (killed?)"
