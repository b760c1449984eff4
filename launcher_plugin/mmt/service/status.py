"""A registered job as it is now, from any process: its state reconciled with its job dir and its scheduler, the
status names Lightning uses, and a handle to re-attach to it (``mmt wait``)."""

import time
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple

from mmt.backends.base import Backend, JobHandle, JobState
from mmt.jobdir import JobDir, read_json
from mmt.launching.ownership import lock_is_held
from mmt.launching.payload import read_plan
from mmt.planning.plan import JobPlan
from mmt.service.registry import JobRecord, Registry

# Lightning's job states (lightning_sdk.status.Status) for mmt's
LIGHTNING_STATUS = {
    JobState.PENDING: "Pending",
    JobState.RUNNING: "Running",
    JobState.STOPPING: "Stopping",
    JobState.COMPLETED: "Completed",
    JobState.FAILED: "Failed",
    JobState.TIMEOUT: "Failed",
    JobState.INTERRUPTED: "Stopped",
}


def lightning_status(state: str) -> str:
    return LIGHTNING_STATUS[JobState(state)]


def _own_result(record: JobRecord) -> Optional[Dict[str, Any]]:
    result = read_json(JobDir(Path(record.job_dir)).result)
    return result if result is not None and result.get("attempt") == record.attempt else None


def refresh(record: JobRecord, registry: Registry) -> JobRecord:
    """The record, its state brought up to date from the job dir (and SLURM's queue); saved when it changed."""
    if JobState(record.state).final:
        return record
    if record.backend == "local":
        held = lock_is_held(Path(record.job_dir))  # before reading the result: the lock is released after it
        result = _own_result(record)
        if result is None and not held:
            result = {"status": JobState.FAILED.value, "error": f"{record.name}: its supervisor (pid "
                      f"{record.supervisor_pid}) ended without concluding it (killed?)"}
        state = JobState.RUNNING.value if result is None and JobDir(Path(record.job_dir)).logs.exists() \
            else record.state
    else:
        result = _own_result(record)
        state = record.state
        if result is None and record.scheduler_id:
            from mmt.backends.slurm import queue

            seen = queue.job_states([record.scheduler_id], accounting=queue.accounting_available())
            current = seen.get(record.scheduler_id)
            if current is not None and not current.final:
                state = JobState.RUNNING.value if current.state == "RUNNING" else JobState.PENDING.value
            elif current is not None:
                state = JobState.STOPPING.value  # ended in SLURM; its result comes with re-attaching (mmt wait)
    if result is not None:
        record.state, record.result, record.ended_at = result["status"], result, result.get("ended_at", time.time())
        registry.update(record.name, state=record.state, result=result, ended_at=record.ended_at)
    elif state != record.state:
        record.state = state
        registry.update(record.name, state=state)
    return record


def summary_row(record: JobRecord) -> Tuple[Any, str]:
    """The summary line of an ended job and its metric's name, from its record (what `mmt wait` prints for a job
    that ended before)."""
    from mmt.launching.report import SummaryRow, first_line, metric_of

    result = record.result or {}
    metric = metric_of(result.get("return_value"), result.get("summary_metric"))
    note = "" if record.state == JobState.COMPLETED.value else first_line(result.get("error") or "")
    row = SummaryRow(job=int(result.get("job", 0)), name=record.name, overrides=" ".join(record.overrides),
                     status=record.state, num_nodes=record.num_nodes, devices=record.devices,
                     duration_s=result.get("duration_s"), metric=metric["value"], note=note.split(": ", 1)[-1])
    return row, metric["name"]


def plan_of(record: JobRecord) -> JobPlan:
    return read_plan(JobDir(Path(record.job_dir)).attempt(record.attempt))


def reattach(records: List[JobRecord], poll_interval_s: float = 1.0) -> Tuple[Backend, List[JobHandle]]:
    """A backend watching these jobs (all of one backend) from this process, and their handles."""
    kinds = {record.backend for record in records}
    assert len(kinds) == 1, f"one backend at a time: {sorted(kinds)}"
    if kinds == {"local"}:
        from mmt.backends.local.watch import LocalWatcher

        watcher = LocalWatcher()
        return watcher, [watcher.attach(plan_of(r), JobDir(Path(r.job_dir)).attempt(r.attempt), r.supervisor_pid)
                         for r in records]
    from mmt.backends.slurm.backend import SlurmBackend
    from mmt.backends.slurm.sbatch import SlurmSettings

    slurm = SlurmBackend(SlurmSettings.for_watching(poll_interval_s), kill_grace_s=1.0, start_method="fork")
    return slurm, [slurm.attach(plan_of(r), JobDir(Path(r.job_dir)).attempt(r.attempt), str(r.scheduler_id))
                   for r in records]


def stop(record: JobRecord) -> str:
    """Stop a job from any process: scancel for SLURM, a stop request to the local supervisor."""
    if JobState(record.state).final:
        return f"{record.name} has already ended ({record.state})"
    attempt = JobDir(Path(record.job_dir)).attempt(record.attempt)
    if record.backend == "slurm" and record.scheduler_id:
        from mmt.backends.slurm import queue

        queue.cancel([record.scheduler_id])
        return f"{record.name}: SLURM job {record.scheduler_id} cancelled"
    if attempt.dir.exists():
        attempt.stop_request.touch()
        return f"{record.name}: asked its supervisor (pid {record.supervisor_pid}) to stop it"
    return f"{record.name}: nothing to stop (its attempt dir is gone)"
