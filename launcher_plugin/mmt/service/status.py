"""A registered job as it is now, from any process: its state reconciled with its job dir and its scheduler, the
status names Lightning uses, and a handle to re-attach to it (``mmt wait``)."""

from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence, Tuple

from mmt.backends.base import JobHandle, JobTracker
from mmt.backends.registry import backend_class
from mmt.core.jobdir import JobDir
from mmt.core.states import JobState, ProcessState
from mmt.launching.report import SummaryRow, first_line, metric_of
from mmt.records.outcome import process_state
from mmt.records.registry import JobRecord, Registry, named
from mmt.records.restarts import PendingRestart, pending_restart, recorded
from mmt.records.roles_file import node_indices, read_roles, topology
from mmt.records.scheduler import SchedulerRecord, read_scheduler
from mmt.records.schema import EarlierRun

# Lightning's job states (lightning_sdk.status.Status) for mmt's
LIGHTNING_STATUS = {
    JobState.PENDING: "Pending",
    JobState.RUNNING: "Running",
    JobState.RESTARTING: "Restarting",  # mmt's own: Lightning restarts nothing
    JobState.STOPPING: "Stopping",
    JobState.COMPLETED: "Completed",
    JobState.FAILED: "Failed",
    JobState.TIMEOUT: "Failed",
    JobState.INTERRUPTED: "Stopped",
    JobState.CANCELLED: "Cancelled",  # mmt's own: never ran, a job it waits for did not complete
}


def lightning_status(state: str) -> str:
    return LIGHTNING_STATUS[JobState(state)]


def pending_restart_of(record: JobRecord) -> Optional[PendingRestart]:
    """The restart a job waits for, between a failed run and the next (``RESTARTING``), from its attempt dir."""
    if record.state != JobState.RESTARTING.value:
        return None
    return pending_restart(JobDir(Path(record.job_dir)).attempt(record.attempt))


def earlier_runs(record: JobRecord) -> List[EarlierRun]:
    """The runs of the job that failed and were (or are about to be) restarted: its result's, or while it runs,
    what its attempt dir records as each failed."""
    result = record.result_record()
    if result is not None:
        return list(result.earlier_runs)
    return recorded(JobDir(Path(record.job_dir)).attempt(record.attempt))


def scheduler_view(record: JobRecord) -> Optional[SchedulerRecord]:
    """What the scheduler last said of the job's attempt (why it waits, that it can never start, since when the
    scheduler does not answer), as the last refresh or watcher recorded it; None when nothing was recorded."""
    return read_scheduler(JobDir(Path(record.job_dir)).attempt(record.attempt))


def process_states(record: JobRecord, node: int) -> "frozenset[ProcessState]":
    """Where the processes of node ``node`` of a running job are, by the records in its attempt dir."""
    attempt = JobDir(Path(record.job_dir)).attempt(record.attempt)
    roles = read_roles(Path(record.job_dir))
    per_node = record.command is not None and record.command_mode == "per_node"
    if roles is not None:  # a job with roles: its nodes are each role's, in order
        indices: Sequence[int] = node_indices(roles, node)
    else:
        indices = [node] if per_node else range(node * record.devices, (node + 1) * record.devices)
    return frozenset(process_state(attempt, index) for index in indices)


def refresh(record: JobRecord, registry: Registry) -> JobRecord:
    """The record, its state brought up to date by its backend (from the job dir, and the scheduler); saved when it
    changed. A job whose launcher died before it could run is concluded FAILED, saying so."""
    if JobState(record.state).final:
        return record
    return backend_class(record.backend).refresh(record, registry)


def refresh_all(records: Sequence[JobRecord], registry: Registry) -> List[JobRecord]:
    """Every record brought up to date as by :func:`refresh`, in order; each backend asked once for all of its jobs
    that are not final (``mmt list``)."""
    going: Dict[str, List[int]] = {}
    for index, record in enumerate(records):
        if not JobState(record.state).final:
            going.setdefault(record.backend, []).append(index)
    current = list(records)
    for backend, indices in going.items():
        for index, record in zip(indices, backend_class(backend).refresh_all([records[i] for i in indices], registry)):
            current[index] = record
    return current


def summary_row(record: JobRecord) -> Tuple[Any, str]:
    """The summary line of an ended job and its metric's name, from its record (what `mmt wait` prints for a job
    that ended before)."""
    result = record.result_record()
    metric = metric_of(result.return_value if result else None, result.summary_metric if result else None)
    note = "" if record.state == JobState.COMPLETED.value else first_line((result.error if result else None) or "")
    row = SummaryRow(
        job=result.job if result else 0,
        name=record.name,
        overrides=" ".join(record.overrides),
        status=record.state,
        num_nodes=record.num_nodes,
        devices=record.devices,
        duration_s=result.duration_s if result else None,
        metric=metric["value"],
        note=note.split(": ", 1)[-1],
        shape=topology(roles) if (roles := read_roles(Path(record.job_dir))) is not None else None,
    )
    return row, metric["name"]


def reattach(records: List[JobRecord], poll_interval_s: float = 1.0) -> Tuple[JobTracker[Any], List[JobHandle]]:
    """A watcher following these jobs (all of one backend) from this process, and their handles."""
    kinds = {record.backend for record in records}
    assert len(kinds) == 1, f"one backend at a time: {sorted(kinds)}"
    watcher = backend_class(kinds.pop()).watcher(poll_interval_s)
    return watcher, [watcher.attach(record) for record in records]


def stop(record: JobRecord) -> str:
    """Stop a job from any process (its backend's way: scancel, a stop request to the local supervisor)."""
    if JobState(record.state).final:
        return f"{record.name} has already ended ({record.state})"
    return backend_class(record.backend).stop(record)


def stop_named(name: str, registry: Registry) -> List[str]:
    """Stop the job of that name, or every job of the launch of that name that has not ended (``mmt stop <launch>``:
    each backend asked once for all of its jobs, SLURM's job array tasks in one scancel)."""
    record = registry.get(name)
    if record is not None:
        return [stop(refresh(record, registry))]
    launch = named(name, registry.list())
    if not launch:
        registry.require(name)  # the error: no job or launch of that name
    going = [record for record in launch if not JobState(record.state).final]
    ended = len(launch) - len(going)
    lines = [f"{name}: {ended} of its {len(launch)} jobs have already ended"] if ended else []
    by_backend: Dict[str, List[JobRecord]] = {}
    for record in going:
        by_backend.setdefault(record.backend, []).append(record)
    for backend, records in by_backend.items():
        lines += backend_class(backend).stop_all(records)
    return lines
