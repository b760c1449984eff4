"""Local jobs as registered, from any process: their state from the job dir, and a stop request. A local job is
running while its supervisor (the launcher, or a detached supervisor) holds the job dir's lock."""

from pathlib import Path

from mmt.core.jobdir import JobDir
from mmt.core.states import JobState
from mmt.records.ownership import lock_is_held
from mmt.records.reconcile import conclude_orphan, own_result, save
from mmt.records.registry import JobRecord, Registry


def refresh(record: JobRecord, registry: Registry) -> JobRecord:
    held = lock_is_held(Path(record.job_dir))  # before reading the result: the lock is released after it
    result = own_result(record)
    if result is None and not held:
        return conclude_orphan(record, registry, _orphan_reason(record))
    started = JobDir(Path(record.job_dir)).logs.exists()
    return save(record, registry, JobState.RUNNING.value if result is None and started else record.state, result)


def _orphan_reason(record: JobRecord) -> str:
    if JobDir(Path(record.job_dir)).logs.exists():
        return f"its supervisor (pid {record.supervisor_pid}) ended without concluding it (killed?)"
    return f"its launcher (pid {record.supervisor_pid}) ended before the job was started (killed?)"
