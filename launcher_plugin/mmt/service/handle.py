"""A handle on a registered job from any process: its state, logs, result and machines, waiting and stopping.

The SDK's ``mmt.Job`` is this handle with Lightning's ``run``/``get``; a detached Hydra sweep returns one per job.
"""

import enum
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator, Optional, Tuple, Union

from mmt.core.states import ProcessState
from mmt.core.jobdir import JobDir
from mmt.service import status as job_status
from mmt.records.registry import JobRecord, Registry


class Status(str, enum.Enum):
    """Lightning's job states."""

    Pending = "Pending"
    Running = "Running"
    Stopping = "Stopping"
    Stopped = "Stopped"
    Completed = "Completed"
    Failed = "Failed"

    @property
    def final(self) -> bool:
        return self in (Status.Stopped, Status.Completed, Status.Failed)



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
        return self.job._node_logs(self.rank)


class RegisteredJob:
    """A handle on a registered job, by name: valid in any process, on the machine that submitted it."""

    def __init__(self, name: str, registry: Optional[Registry] = None) -> None:
        self.name = name
        self._registry = registry or Registry()

    def __repr__(self) -> str:
        return f"{type(self).__name__}(name={self.name!r})"

    def __reduce__(self):  # a handle travels by name (a detached sweep's JobReturn values)
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
    def machine(self) -> str:
        return self._registry.require(self.name).machine

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

    def logs(self, rank: int = 0, follow: bool = False, tail: Optional[int] = None) -> Union[str, Iterator[str]]:
        """Rank ``rank``'s output (a per-node command job: node ``rank``'s); ``follow``: an iterator of lines that
        ends when the job has ended."""
        path = self._log_path(rank)
        if follow:
            return self._follow(path)
        text = path.read_text(errors="replace") if path.exists() else ""
        return "".join(text.splitlines(keepends=True)[-tail:]) if tail else text

    # ------------------------------------------------------------------------------------------ internals

    def _log_path(self, rank: int) -> Path:
        record = self._registry.require(self.name)
        per_node = record.command is not None and record.command_mode == "per_node"
        node = rank if per_node else rank // record.devices
        return JobDir(Path(record.job_dir)).log(node, rank, per_node)

    def _follow(self, path: Path) -> Iterator[str]:
        offset, partial = 0, ""
        while True:
            ended = self.status.final
            if path.exists():
                with open(path, errors="replace") as handle:
                    handle.seek(offset)
                    data = handle.read()
                    offset = handle.tell()
                lines = (partial + data).split("\n")
                partial = lines.pop()
                yield from (line + "\n" for line in lines)
            if ended:
                if partial:
                    yield partial
                return
            time.sleep(0.5)

    def _node_status(self, node: int) -> Status:
        job = self.status
        if job == Status.Running:  # the node's own processes, by the records they left so far
            return _node_status_of(job_status.process_states(self._record(), node))
        if not job.final:
            return job
        result = self._record().result_record()
        failure = result.failure if result else None
        if job == Status.Failed and failure is not None and failure.node_rank != node:
            return Status.Stopped  # its ranks were stopped because another node's failed
        return job

    def _node_logs(self, node: int) -> str:
        return "".join(p.read_text(errors="replace") for p in JobDir(self.dir).node_logs(node))
