"""A handle on a registered job from any process: its state, logs, result and machines, waiting and stopping.

The SDK's ``mmt.Job`` is this handle with Lightning's ``run``/``get``; a detached Hydra sweep returns one per job.
"""

import enum
import json
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Dict, Iterator, List, Optional, Tuple, Union

from mmt.backends.registry import scheduler_job
from mmt.core.errors import ConfigError, RankFailure, UsageError
from mmt.core.jobdir import JobDir, process_log_name
from mmt.core.states import JobState, ProcessState
from mmt.launching.report import metric_of
from mmt.records import snapshot_use
from mmt.records.registry import JobRecord, Registry
from mmt.records.roles_file import RoleShape, job_node, read_roles, role_node, topology
from mmt.records.world import read_changes
from mmt.records.world import shape as world_shape
from mmt.service import logs as log_files
from mmt.service import status as job_status
from mmt.service.machines import Machine, MachineType

#: what ``job.machines[i].logs`` holds at most of one node's logs (the end of each; the files keep everything)
MACHINE_LOG_BYTES = 16 * 1024 * 1024


class JobDirGone(UsageError):
    """The job's dir was deleted: its logs and the files it wrote are gone (its registry record stays)."""

    def __init__(self, record: JobRecord) -> None:
        self.job_dir = record.job_dir
        super().__init__(
            f"the job dir {record.job_dir} of {record.name} was deleted: its logs and files are gone "
            f"(the registry still records it as {job_status.lightning_status(record.state)}). "
            f"HINT: `mmt delete {record.name}` forgets it"
        )


def log_range(record: JobRecord) -> Tuple[int, str]:
    """(how many logs ``rank`` may name, what they are in words) for a job: every rank, or every node for a
    per-node command job."""
    per_node = record.command is not None and record.command_mode == "per_node"
    count = record.num_nodes if per_node else record.num_nodes * record.devices
    span = "0" if count == 1 else f"0-{count - 1}"
    if per_node:
        return count, (
            f"{'machine' if count == 1 else 'machines'} {span} of this {record.num_nodes}-machine job "
            "(its command runs once per machine: the rank names the machine)"
        )
    return count, f"{'rank' if count == 1 else 'ranks'} {span} of this {record.num_nodes} x {record.devices} job"


def check_rank(record: JobRecord, rank: Any) -> int:
    count, allowed = log_range(record)
    if isinstance(rank, bool) or not isinstance(rank, int) or not 0 <= rank < count:
        raise ConfigError("rank", rank, f"expected one of {allowed}")
    return rank


def role_log_path(record: JobRecord, roles: Tuple[RoleShape, ...], rank: Any, role: Optional[str]) -> Path:
    """A job with roles: rank ``rank`` of ``role`` (default: the primary), checked against the role's shape."""
    names = [shape.name for shape in roles]
    shape = roles[0] if role is None else next((s for s in roles if s.name == role), None)
    if shape is None:
        raise ConfigError("role", role, f"expected one of {', '.join(names)}", f"e.g. --role {names[0]}")
    count = shape.log_count
    if isinstance(rank, bool) or not isinstance(rank, int) or not 0 <= rank < count:
        what = ("machine" if count == 1 else "machines") if shape.per_node else ("rank" if count == 1 else "ranks")
        span = "0" if count == 1 else f"0-{count - 1}"
        raise ConfigError("rank", rank, f"expected {what} {span} of role {shape.name}")
    node = rank if shape.per_node else rank // shape.devices
    name = process_log_name(node, rank, shape.per_node)
    return JobDir(Path(record.job_dir)).logs_of(record.attempt) / shape.name / name


def check_tail(tail: Any) -> Optional[int]:
    if tail is not None and (isinstance(tail, bool) or not isinstance(tail, int) or tail < 1):
        raise ConfigError("tail", tail, "expected a whole number >= 1", "leave it out for the whole log")
    return tail


def _metric(result: Any) -> Optional[str]:
    """``name=value`` of a completed job's result (a ResultRecord), else None."""
    if result is None or not result.completed:
        return None
    metric = metric_of(result.return_value, result.summary_metric)
    return None if metric["value"] == "-" else f"{metric['name']}={metric['value']}"


def job_row(record: JobRecord) -> Dict[str, Any]:
    """A job as `mmt list` shows it (and ``--json`` prints it)."""
    result = record.result_record()
    duration = result.duration_s if result else None
    if duration is None and record.started_at:
        duration = (record.ended_at or time.time()) - record.started_at
    view = job_status.scheduler_view(record)
    final = JobState(record.state).final
    restarting = job_status.pending_restart_of(record)
    return {
        "name": record.name,
        "status": job_status.lightning_status(record.state),
        "state": record.state,
        # SLURM's pending reason while the job waits (or the one that failed it); what the status alone does not say
        "reason": view.reason if view is not None and (view.never_starts or not final) else None,
        # a restart's back-off: which run failed, why, and when the next starts; else what the scheduler says
        "note": restarting.describe() if restarting else view.note(final) if view is not None else None,
        "cluster": record.backend,
        "machine": record.machine,
        "topology": _topology(record),
        "scheduler_id": record.scheduler_id,
        # the scheduler's job as its users know it: "SLURM job 123", "Ray job mmt-..."; None for a local job
        "scheduler_job": scheduler_job(record.backend, record.scheduler_id) if record.scheduler_id else None,
        "created": time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(record.created_at)),
        "duration_s": round(duration, 1) if duration is not None else None,
        "dir": record.job_dir,
        "metric": _metric(result),
        "detached": record.detached,
        # times it was restarted after a failure (hydra.launcher.max_restarts), so far
        "restarts": record.restarts,
    }


def node_status(record: JobRecord, node: int) -> str:
    """An ended or waiting job's node, by its record: a failed job's other nodes were stopped."""
    job = job_status.lightning_status(record.state)
    result = record.result_record()
    failure = result.failure if result else None
    if job == "Failed" and failure is not None and failed_node(record, failure) != node:
        return "Stopped"
    return job


def _topology(record: JobRecord) -> str:
    """As the summary shows it: each role's shape, or an elastic job's worlds (``3 -> 2 x 1``), or nodes x devices."""
    roles = read_roles(Path(record.job_dir))
    if roles is not None:
        return topology(roles)
    changes = read_changes(JobDir(Path(record.job_dir)))
    elastic = world_shape(record.devices, changes, record.restarts) if changes else None
    return elastic or f"{record.num_nodes} x {record.devices}"


def _node_log_paths(record: JobRecord, node: int) -> List[Path]:
    """The logs of the job's node ``node``: its command's, then its ranks' (a job with roles: in its role's dir)."""
    job_dir = JobDir(Path(record.job_dir))
    roles = read_roles(job_dir.root)
    found = role_node(roles, node) if roles is not None else None
    if found is None:
        return job_dir.node_logs(node, record.attempt)
    shape, local = found
    logs = job_dir.logs_of(record.attempt) / shape.name
    ranks = range(local * shape.devices, (local + 1) * shape.devices)
    names = [process_log_name(local, 0, True)] if shape.per_node else [process_log_name(local, r, False) for r in ranks]
    return [logs / name for name in names if (logs / name).exists()]


def failed_node(record: JobRecord, failure: RankFailure) -> Optional[int]:
    """The job's node where ``failure`` happened (a job with roles: its role's node, counted in the job)."""
    if failure.role is None:
        return failure.node_rank
    roles = read_roles(Path(record.job_dir))
    return job_node(roles, failure.role, failure.node_rank) if roles is not None else None


def job_facts(record: JobRecord) -> Dict[str, Any]:
    """A job in detail, as `mmt inspect --json` prints it and ``job.dict()`` returns it."""
    result = record.result_record()
    return {
        **job_row(record),
        "job_id": record.job_id,
        "attempt": record.attempt,
        "command": record.command,
        "overrides": record.overrides,
        "sweep_dir": record.sweep_dir,
        "supervisor_pid": record.supervisor_pid,
        "dir_exists": Path(record.job_dir).is_dir(),
        "link": Path(record.job_dir).absolute().as_uri(),
        "result": record.result,
        "scheduler": scheduler_story(record),
        "machines": [{"rank": n, "status": node_status(record, n)} for n in range(record.num_nodes)],
        # the runs that failed and were restarted, oldest first: restart, error, started_at, ended_at, duration_s
        "earlier_runs": [asdict(run) for run in job_status.earlier_runs(record)],
        # SLURM: the runs that were requeued (a lost node, scontrol requeue, the requeue signal): restart, why, at
        "requeues": [asdict(one) for one in (result.requeues if result is not None else ())],
        # an elastic job: each time its world formed again, as it happens (a node lost: which, when, the world and
        # the batch split before and after, the seconds to training again)
        "world_changes": [change.to_dict() for change in read_changes(JobDir(Path(record.job_dir)))],
        # the code it runs: its launch's snapshot (id, commit, dirty, source, dir); None: the live tree
        "snapshot": snapshot_use.provenance(record.job_dir, record.job_id),
    }


def scheduler_story(record: JobRecord) -> Optional[str]:
    """What the scheduler said of a job that has not ended: why it waits, since when it does not answer (the error
    of one that could never start says why)."""
    view = job_status.scheduler_view(record)
    return None if view is None or JobState(record.state).final else view.describe()


class Status(str, enum.Enum):
    """Lightning's job states."""

    Pending = "Pending"
    Running = "Running"
    Restarting = "Restarting"  # mmt's own: a run failed, the next starts after its back-off (max_restarts)
    Stopping = "Stopping"
    Stopped = "Stopped"
    Completed = "Completed"
    Failed = "Failed"
    Cancelled = "Cancelled"  # mmt's own: never ran, a job it waited for (after=) did not complete

    @property
    def final(self) -> bool:
        return self in (Status.Stopped, Status.Completed, Status.Failed, Status.Cancelled)


def _node_status_of(states: "frozenset[ProcessState]") -> Status:
    """A running job's node, from its processes' states: failed if one failed, stopping if one was stopped,
    completed once all have succeeded, else running."""
    if ProcessState.FAILED in states:
        return Status.Failed
    if ProcessState.STOPPED in states:
        return Status.Stopping
    if states and states == {ProcessState.SUCCEEDED}:
        return Status.Completed
    return Status.Running


@dataclass(frozen=True)
class MachineRun:
    """One node of a job (Lightning's ``job.machines[i]``)."""

    job: "RegisteredJob"
    rank: int

    @property
    def status(self) -> Status:
        return self.job._node_status(self.rank)

    @property
    def logs(self) -> str:
        """The node's output (its command's, or its ranks' one after the other): the end of each log, at most
        MACHINE_LOG_BYTES in all, with a line saying what was left out (``job.logs(rank=...)`` reads it all)."""
        return self.job._node_logs(self.rank)


class RegisteredJob:
    """A handle on a registered job, by name: valid in any process, on the machine that submitted it."""

    def __init__(self, name: str, registry: Optional[Registry] = None) -> None:
        self.name = name
        self._registry = registry or Registry()

    def __repr__(self) -> str:
        return f"{type(self).__name__}(name={self.name!r})"

    def __reduce__(self) -> Tuple[Any, Tuple[str]]:  # a handle travels by name (a detached sweep's JobReturn values)
        return (type(self), (self.name,))

    # ------------------------------------------------------------------------------------------ facts

    def _record(self) -> JobRecord:
        return job_status.refresh(self._registry.require(self.name), self._registry)

    @property
    def status(self) -> Status:
        return Status(job_status.lightning_status(self._record().state))

    @property
    def dir(self) -> Path:
        return Path(self._registry.require(self.name).job_dir)

    @property
    def num_machines(self) -> int:
        return self._registry.require(self.name).num_nodes

    @property
    def is_multi_machine(self) -> bool:
        return self.num_machines > 1

    @property
    def machine(self) -> MachineType:
        """Lightning's ``Machine`` (a ``str``: the catalogue name; ``.name``: Lightning's, e.g. ``A100_X_8``)."""
        return Machine.from_str(self._registry.require(self.name).machine)

    @property
    def link(self) -> str:
        """Where to look at the job: its dir as a file:// URL (``mmt dashboard DIR`` serves the live page)."""
        return Path(self._registry.require(self.name).job_dir).absolute().as_uri()

    def dict(self) -> Dict[str, Any]:
        """The job's record, brought up to date (what ``mmt inspect --json`` prints)."""
        return job_facts(self._record())

    def json(self) -> str:
        return json.dumps(self.dict(), indent=2)

    @property
    def command(self) -> Optional[str]:
        return self._registry.require(self.name).command

    @property
    def id(self) -> str:
        return self._registry.require(self.name).job_id

    @property
    def result(self) -> Any:
        """Rank 0's return value once the job completed (a command's: its exit code and duration), else None."""
        result = self._record().result_record()
        return result.return_value if result else None

    @property
    def error(self) -> Optional[str]:
        result = self._record().result_record()
        return result.error if result else None

    @property
    def machines(self) -> Tuple[MachineRun, ...]:
        return tuple(MachineRun(self, rank) for rank in range(self.num_machines))

    # ------------------------------------------------------------------------------------------ acting

    def wait(self, interval: float = 0.5, timeout: Optional[float] = None, stop_on_timeout: bool = False) -> Status:
        """Block until the job has ended; TimeoutError after ``timeout`` seconds (stopping it first if asked)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            current = self.status
            if current.final:
                return current
            if deadline is not None and time.monotonic() >= deadline:
                if stop_on_timeout:
                    self.stop()
                raise TimeoutError(f"job {self.name} is still {current.value} after {timeout:g} s")
            time.sleep(interval)

    def stop(self) -> None:
        job_status.stop(self._record())

    def logs(
        self, rank: int = 0, follow: bool = False, tail: Optional[int] = None, role: Optional[str] = None
    ) -> Union[str, Iterator[str]]:
        """Rank ``rank``'s output (a per-node command job: node ``rank``'s): all of it, or its last ``tail`` lines;
        ``follow``: an iterator of lines (from the last ``tail`` ones, if given) that ends when the job has ended.
        ``role``: a job with roles, whose ranks each role numbers (default: the primary role).
        Read in bounded chunks, the last lines found by seeking back from the end: a huge log costs no more memory
        than what is returned. JobDirGone when the job dir was deleted."""
        path, start = self.log_start(rank, tail, role)
        if follow:
            return log_files.follow(path, start, lambda: self.status.final)
        return log_files.read_text(path, start) if path.exists() else ""

    def log_start(self, rank: int = 0, tail: Optional[int] = None, role: Optional[str] = None) -> Tuple[Path, int]:
        """(rank ``rank``'s log file, the byte offset of its last ``tail`` lines, 0 for all of it), checked: a
        rank the job (or its ``role``) has, a ``tail`` >= 1, a job dir that still exists."""
        check_tail(tail)
        path = self._log_path(rank, role)
        if tail is None or not path.exists():
            return path, 0
        return path, log_files.tail_offset(path, tail)

    # ------------------------------------------------------------------------------------------ internals

    def _log_path(self, rank: int, role: Optional[str] = None) -> Path:
        record = self._registry.require(self.name)
        roles = read_roles(Path(record.job_dir))
        if roles is not None:
            return role_log_path(record, roles, rank, role)
        if role is not None:
            raise ConfigError("role", role, f"job {record.name} has no roles", "leave out --role")
        check_rank(record, rank)
        if not Path(record.job_dir).is_dir():
            raise JobDirGone(record)
        per_node = record.command is not None and record.command_mode == "per_node"
        node = rank if per_node else rank // record.devices
        # this job's own attempt: a later run into the same dir set its logs aside (logs/previous/<attempt>/)
        return JobDir(Path(record.job_dir)).logs_of(record.attempt) / process_log_name(node, rank, per_node)

    def _node_status(self, node: int) -> Status:
        job = self.status
        if job == Status.Running:  # the node's own processes, by the records they left so far
            return _node_status_of(job_status.process_states(self._record(), node))
        if not job.final:
            return job
        result = self._record().result_record()
        failure = result.failure if result else None
        if job == Status.Failed and failure is not None and failed_node(self._record(), failure) != node:
            return Status.Stopped  # its ranks were stopped because another node's failed
        return job

    def _node_logs(self, node: int) -> str:
        record = self._registry.require(self.name)
        if not Path(record.job_dir).is_dir():
            raise JobDirGone(record)
        paths = _node_log_paths(record, node)
        budget = MACHINE_LOG_BYTES // max(1, len(paths))
        parts: List[str] = []
        for path in paths:
            try:
                size = path.stat().st_size
                start = 0 if size <= budget else _line_start_after(path, size - budget)
                if start:
                    parts.append(
                        f"[mmt] the first {start} bytes of {path} are not shown here; job.logs(rank=...) "
                        "or the file has them\n"
                    )
                parts.append(log_files.read_text(path, start, size))
            except (FileNotFoundError, NotADirectoryError):
                continue
        return "".join(parts)


def _line_start_after(path: Path, offset: int) -> int:
    """The first line start at or after byte ``offset`` (``offset`` itself when no newline follows soon)."""
    with open(path, "rb") as handle:
        handle.seek(max(0, offset - 1))
        data = handle.read(log_files.BLOCK)
    newline = data.find(b"\n")
    return offset if offset == 0 or newline < 0 else max(0, offset - 1) + newline + 1
