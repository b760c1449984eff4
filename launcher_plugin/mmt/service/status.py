"""A registered job as it is now, from any process: its state reconciled with its job dir and its scheduler, the
status names Lightning uses, and a handle to re-attach to it (``mmt wait``)."""

import time
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple

from mmt.backends.base import Backend, JobHandle, JobState, ProcessState
from mmt.jobdir import JobDir, read_json
from mmt.launching.ownership import lock_is_held, read_owner
from mmt.launching.outcome import process_state
from mmt.launching.payload import UnsafePayloadError, discard_payload, read_plan
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


def process_states(record: JobRecord, node: int) -> "frozenset[ProcessState]":
    """Where the processes of node ``node`` of a running job are, by the records in its attempt dir."""
    attempt = JobDir(Path(record.job_dir)).attempt(record.attempt)
    per_node = record.command is not None and record.command_mode == "per_node"
    indices = [node] if per_node else range(node * record.devices, (node + 1) * record.devices)
    return frozenset(process_state(attempt, index) for index in indices)


def refresh(record: JobRecord, registry: Registry) -> JobRecord:
    """The record, its state brought up to date from the job dir (and SLURM's queue); saved when it changed.

    A job whose launcher died between registering it and handing it to its scheduler (SIGKILL mid-submit) will never
    run: it is concluded FAILED here, once its launcher is known to be gone (the job dir's lock is free)."""
    if JobState(record.state).final:
        return record
    if record.backend == "local":
        return _refresh_local(record, registry)
    return _refresh_slurm(record, registry)


def _refresh_local(record: JobRecord, registry: Registry) -> JobRecord:
    held = lock_is_held(Path(record.job_dir))  # before reading the result: the lock is released after it
    result = _own_result(record)
    if result is None and not held:
        return _conclude_orphan(record, registry, _local_orphan_reason(record))
    started = JobDir(Path(record.job_dir)).logs.exists()
    return _save(record, registry, JobState.RUNNING.value if result is None and started else record.state, result)


def _local_orphan_reason(record: JobRecord) -> str:
    if JobDir(Path(record.job_dir)).logs.exists():
        return f"its supervisor (pid {record.supervisor_pid}) ended without concluding it (killed?)"
    return f"its launcher (pid {record.supervisor_pid}) ended before the job was started (killed?)"


def _refresh_slurm(record: JobRecord, registry: Registry) -> JobRecord:
    result = _own_result(record)
    if result is None and not record.scheduler_id:
        record = _unsubmitted_slurm_job(record, registry)
        if JobState(record.state).final or not record.scheduler_id:
            return record
    state = record.state
    if result is None and record.scheduler_id:
        from mmt.backends.slurm import queue

        seen = queue.job_states([record.scheduler_id], accounting=queue.accounting_available())
        current = seen.get(record.scheduler_id)
        if current is not None and not current.final:
            state = JobState.RUNNING.value if current.state == "RUNNING" else JobState.PENDING.value
        elif current is not None:
            # ended in SLURM without its own last step writing the result (cancelled while it waited in the queue,
            # a node lost): concluded here as that step would have, with what SLURM says
            result = _conclude_ended_slurm_job(record, current.state)
            state = JobState.STOPPING.value if result is None else state
    return _save(record, registry, state, result)


def _conclude_ended_slurm_job(record: JobRecord, slurm_state: str) -> Optional[Dict[str, Any]]:
    from mmt.backends.slurm.conclusion import conclude
    from mmt.launching.outcome import read_primary_return, result_record, return_value_of, write_result

    attempt = JobDir(Path(record.job_dir)).attempt(record.attempt)
    try:
        plan = read_plan(attempt)
    except (OSError, UnsafePayloadError):  # its payload is gone or unsafe: `mmt wait` tells more
        return None
    outcome = conclude(plan, attempt, scheduler_id=str(record.scheduler_id), duration_s=None, slurm_state=slurm_state)
    value = return_value_of(read_primary_return(attempt))
    result = result_record(plan, outcome, value, attempt.id, timing={"ended_at": time.time()})
    try:
        write_result(plan, result)
    except OSError:
        pass  # the registry keeps it; the job dir cannot be written from here
    discard_payload(attempt)
    return result


def _unsubmitted_slurm_job(record: JobRecord, registry: Registry) -> JobRecord:
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
    return _conclude_orphan(current, registry, f"its launcher (pid {current.supervisor_pid} on "
                            f"{current.supervisor_host}) ended before the job was submitted (killed?)")


def _scheduler_id_in_owner(record: JobRecord) -> Optional[str]:
    """The id the launcher wrote into the job dir's owner.json right after sbatch, for this attempt."""
    owner = read_owner(Path(record.job_dir)) or {}
    return str(owner["scheduler_id"]) if owner.get("attempt") == record.attempt and owner.get("scheduler_id") else None


def _scheduler_id_in_queue(record: JobRecord) -> Optional[str]:
    """The SLURM job of this record's name submitted since the record was created ("" when there is none, None
    when SLURM did not answer). The name is the backend's: unique while registered."""
    from mmt.backends.slurm import queue
    from mmt.backends.slurm.backend import job_name_for

    return queue.latest_job_named(job_name_for(record.name), submitted_since=record.created_at)


def _conclude_orphan(record: JobRecord, registry: Registry, reason: str) -> JobRecord:
    """FAILED, with ``reason``, unless another process got there first (then its record)."""
    result = {"status": JobState.FAILED.value, "error": f"{record.name}: {reason}", "attempt": record.attempt,
              "job": _job_num(record), "ended_at": time.time()}
    if registry.conclude_orphan(record.name, record.attempt, result):
        record.state, record.result, record.ended_at = result["status"], result, result["ended_at"]
        # nothing will run it: its pickled config and copied secrets go (the records stay, for what they tell)
        discard_payload(JobDir(Path(record.job_dir)).attempt(record.attempt))
        return record
    return registry.get(record.name) or record


def _job_num(record: JobRecord) -> int:
    """The job's number in its sweep: the last part of its id (``<launch id>-<num>``)."""
    last = record.job_id.rsplit("-", 1)[-1]
    return int(last) if last.isdigit() else 0


def _save(record: JobRecord, registry: Registry, state: str, result: Optional[Dict[str, Any]]) -> JobRecord:
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
