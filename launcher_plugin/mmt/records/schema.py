"""The records that cross processes, typed: what a job dir's JSON files hold, one frozen dataclass per kind
(file names: mmt.core.jobdir).

* ``result.json``: ResultRecord, how the job ended. Written by whoever concludes the job (the launcher, a detached
  supervisor, a SLURM job's last step, a refresh that finds the job ended: mmt.records.outcome); read by every
  watcher and refresh. The registry's ``result`` column holds its ``to_dict()``.
* ``.mmt/owner.json``: OwnerRecord, the launch that owns the dir. Written by mmt.records.ownership.claim; read by
  the next claim, a SLURM job's last step, a refresh.
* ``error.<i>.json``: ErrorRecord, process i raised (or its command failed). Written by the process itself
  (mmt.worker.main; a SLURM task that cannot hold the job's port); read by mmt.records.outcome.
* ``exit.<i>.json``: ExitRecord, process i exited. Written by the agent that ran it (mmt.agent.jobs); read by
  mmt.records.outcome.
* ``scheduler.json`` (attempt dir): SchedulerRecord, what the scheduler last said of a job that has not ended; in
  mmt.records.scheduler, on the same base and rules.

(``done.<i>`` is not JSON: one digit, the process's task status; mmt.core.jobdir reads and writes it.)

Every record carries ``schema``: the version of its kind's layout (``RESULT_SCHEMA`` ...). The rules:

* adding a key does not change the version: a reader ignores keys it does not know, and fills a default for each
  key a file lacks. A file written before records had versions (no ``schema`` key: version 0) has the keys of
  version 1 but ``schema``, and reads as version 1;
* changing what a key means, or removing one, bumps the version. A reader refuses a version newer than the one it
  knows (UnknownSchemaError, naming the file) rather than misread it;
* ``from_dict``/``read`` return a record of the current version (an older file is read as the current layout).

On disk a record has the keys mmt wrote before records were typed, in the same order, with ``schema`` first: the
dashboard, the registry, the plots and users' scripts read those keys.
"""

from __future__ import annotations

import json
import math
import os
import socket
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from time import time as _now
from typing import Any, ClassVar, Dict, Mapping, Optional, Tuple, Type, TypeVar

from mmt.core.errors import MMTError, RankFailure
from mmt.core.jobdir import read_json, write_atomic
from mmt.core.states import JobState
from mmt.records.world import WorldChange

RESULT_SCHEMA = 1
OWNER_SCHEMA = 1
ERROR_SCHEMA = 1
EXIT_SCHEMA = 1

SCHEMA_KEY = "schema"
# what a file without a ``schema`` key is: written by an mmt from before records had versions
UNVERSIONED = 0


class RecordError(MMTError, ValueError):
    """A record that cannot be read: not an object, a key of the wrong type, a required key missing."""


class UnknownSchemaError(MMTError):
    """A record of a newer layout than this mmt knows (written by a newer mmt)."""

    def __init__(self, kind: str, found: Any, known: int, where: str = "") -> None:
        self.kind, self.found, self.known, self.where = kind, found, known, where
        place = f" {where}" if where else ""
        super().__init__(
            f"cannot read the {kind}{place}: it has schema {found!r}, and this mmt knows up to "
            f"schema {known}. HINT: it was written by a newer mmt; use that version (or upgrade this "
            "one) to read it"
        )

    def __reduce__(self) -> Any:  # keyword-free construction, so it survives pickling like mmt's other errors
        return (UnknownSchemaError, (self.kind, self.found, self.known, self.where))


_R = TypeVar("_R", bound="_Record")
_MISSING = object()


def _get(data: Mapping[str, Any], key: str, kinds: Tuple[type, ...], default: Any = None) -> Any:
    """``data[key]`` when it is of one of ``kinds`` (or null); ``default`` when absent; RecordError otherwise."""
    value = data.get(key, _MISSING)
    if value is _MISSING:
        return default
    if value is None:
        return None
    if isinstance(value, bool) and bool not in kinds:  # JSON's true is not a number here
        raise RecordError(f"{key!r} is {value!r}, not {' or '.join(k.__name__ for k in kinds)}")
    if not isinstance(value, kinds):
        raise RecordError(f"{key!r} is {value!r}, not {' or '.join(k.__name__ for k in kinds)}")
    return float(value) if float in kinds and isinstance(value, int) and not isinstance(value, bool) else value


_NUMBER = (float, int)


class _Record:
    """What every record kind has: its version, its file form, and reading that tolerates older files."""

    KIND: ClassVar[str]
    SCHEMA_VERSION: ClassVar[int]
    PRIVATE: ClassVar[bool] = True  # mode 0600 (the engine's own records); result.json is the user's
    INDENT: ClassVar[Optional[int]] = None

    schema: int

    # ---------------------------------------------------------------------------------------- to the file
    def to_dict(self) -> Dict[str, Any]:
        raise NotImplementedError

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=self.INDENT)

    def write(self, path: Path) -> None:
        """Atomically: a reader sees the previous record or this one."""
        write_atomic(path, self.to_json().encode(), private=self.PRIVATE)

    # -------------------------------------------------------------------------------------- from the file
    @classmethod
    def _fields(cls: Type[_R], data: Mapping[str, Any]) -> _R:
        raise NotImplementedError

    @classmethod
    def check_schema(cls, data: Mapping[str, Any], where: str = "") -> int:
        """The version ``data`` says it has (UNVERSIONED when it says none); UnknownSchemaError when this mmt does
        not know it."""
        version = data.get(SCHEMA_KEY, UNVERSIONED)
        if isinstance(version, bool) or not isinstance(version, int) or version < 0:
            raise UnknownSchemaError(cls.KIND, version, cls.SCHEMA_VERSION, where)
        if version > cls.SCHEMA_VERSION:
            raise UnknownSchemaError(cls.KIND, version, cls.SCHEMA_VERSION, where)
        return version

    @classmethod
    def from_dict(cls: Type[_R], data: Mapping[str, Any], where: str = "") -> _R:
        """The record ``data`` holds, of the current version; UnknownSchemaError for a newer one, RecordError for
        one that is not a record of this kind."""
        if not isinstance(data, Mapping):
            raise RecordError(f"the {cls.KIND}{' ' + where if where else ''} is {type(data).__name__}, not an object")
        cls.check_schema(data, where)
        try:
            return cls._fields(data)
        except RecordError as exc:
            raise RecordError(f"the {cls.KIND}{' ' + where if where else ''} is not valid: {exc}") from None
        except (KeyError, TypeError, ValueError) as exc:
            raise RecordError(
                f"the {cls.KIND}{' ' + where if where else ''} is not valid: {type(exc).__name__}: {exc}"
            ) from None

    @classmethod
    def read(cls: Type[_R], path: Path) -> Optional[_R]:
        """The record in ``path``; None when there is none, or none that can be read (a partial or foreign file).
        A record of a newer schema raises UnknownSchemaError: it exists, and this mmt cannot tell what it says."""
        data = read_json(path)
        if not isinstance(data, dict):
            return None
        try:
            return cls.from_dict(data, where=str(path))
        except RecordError:
            return None


# ------------------------------------------------------------------------------------------------ result.json


def _failure_dict(failure: RankFailure) -> Dict[str, Any]:
    """A failure as result.json keeps it: a job without roles keeps the keys it always had."""
    data = asdict(failure)
    if failure.role is None:
        data.pop("role")
    if not failure.ended_early:
        data.pop("ended_early")
    return data


def _failure_of(data: Any) -> Optional[RankFailure]:
    if data is None:
        return None
    if not isinstance(data, Mapping):
        raise RecordError(f"'failure' is {data!r}, not an object")
    return RankFailure(
        rank=int(data["rank"]),
        node_rank=int(data["node_rank"]),
        exit_code=_get(data, "exit_code", (int,)),
        signal=_get(data, "signal", (str,)),
        exception=_get(data, "exception", (str,)),
        traceback=_get(data, "traceback", (str,)),
        log=str(data.get("log") or ""),
        whole_node=bool(data.get("whole_node", False)),
        missing_result=bool(data.get("missing_result", False)),
        role=_get(data, "role", (str,)),
        ended_early=bool(data.get("ended_early", False)),
    )


@dataclass(frozen=True)
class EarlierRun:
    """A run of the job that failed and was restarted (hydra.launcher.max_restarts): part of its result."""

    restart: int  # its MMT_RESTART_COUNT
    error: str  # what failed, as the job's error says it
    started_at: Optional[float] = None
    ended_at: Optional[float] = None
    duration_s: Optional[float] = None

    @classmethod
    def of(cls, data: Any) -> Optional["EarlierRun"]:
        if not isinstance(data, Mapping) or not isinstance(data.get("restart"), int):
            return None
        return cls(
            restart=data["restart"],
            error=str(data.get("error") or ""),
            started_at=_get(data, "started_at", _NUMBER),
            ended_at=_get(data, "ended_at", _NUMBER),
            duration_s=_get(data, "duration_s", _NUMBER),
        )


@dataclass(frozen=True)
class RoleResult:
    """How one role of a job with roles ended: part of its result. ``status``: COMPLETED (every process exited 0),
    FAILED (one failed), STOPPED (mmt stopped its processes: the primary role ended, or another role failed)."""

    name: str
    primary: bool
    num_nodes: int
    devices: int
    world_size: int
    status: str
    succeeded: int = 0
    failed: int = 0
    stopped: int = 0

    @classmethod
    def of(cls, data: Any) -> Optional["RoleResult"]:
        if not isinstance(data, Mapping) or not isinstance(data.get("name"), str):
            return None
        return cls(
            name=data["name"],
            primary=bool(data.get("primary", False)),
            num_nodes=int(data.get("num_nodes") or 0),
            devices=int(data.get("devices") or 0),
            world_size=int(data.get("world_size") or 0),
            status=str(data.get("status") or ""),
            succeeded=int(data.get("succeeded") or 0),
            failed=int(data.get("failed") or 0),
            stopped=int(data.get("stopped") or 0),
        )


@dataclass(frozen=True)
class Requeue:
    """A run of a SLURM job that was requeued (same job id, same attempt): part of its result."""

    restart: int  # SLURM_RESTART_COUNT of the run that was requeued
    why: str  # who requeued it and why: a lost node, ``scontrol requeue``, mmt on the requeue signal
    at: Optional[float] = None

    @classmethod
    def of(cls, data: Any) -> Optional["Requeue"]:
        if not isinstance(data, Mapping) or not isinstance(data.get("restart"), int):
            return None
        return cls(restart=data["restart"], why=str(data.get("why") or ""), at=_get(data, "at", _NUMBER))


@dataclass(frozen=True, kw_only=True)
class ResultRecord(_Record):
    """How a job ended (``result.json``). The job's own record of one attempt: a reader checks ``attempt``."""

    KIND: ClassVar[str] = "job result (result.json)"
    SCHEMA_VERSION: ClassVar[int] = RESULT_SCHEMA
    PRIVATE: ClassVar[bool] = False
    INDENT: ClassVar[Optional[int]] = 2

    schema: int = RESULT_SCHEMA
    job: int = 0  # the job's number in its sweep
    name: Optional[str] = None
    attempt: Optional[str] = None  # the attempt it concludes (a job dir is reused by later launches)
    overrides: Tuple[str, ...] = ()  # masked: a secret's value is ***
    status: JobState  # one of the final states
    num_nodes: Optional[int] = None
    devices: Optional[int] = None
    world_size: Optional[int] = None
    machine: Optional[str] = None
    summary_metric: Optional[str] = None
    duration_s: Optional[float] = None
    # seconds from the decision to stop the job until its last process was gone
    stop_latency_s: Optional[float] = None
    scheduler_id: Optional[str] = None
    # when the job started and ended, as its concluder saw it (absent from the file when unknown)
    started_at: Optional[float] = None
    ended_at: Optional[float] = None
    # what rank 0's task returned (COMPLETED only), made JSON-able
    return_value: Any = None
    # FAILED: the process that failed first
    failure: Optional[RankFailure] = None
    # why it did not complete: the text of the exception a Hydra JobReturn raises for it (``<label>: <why>``)
    error: Optional[str] = None
    # the runs that failed before this one and were restarted, oldest first (their count is MMT_RESTART_COUNT)
    earlier_runs: Tuple[EarlierRun, ...] = ()
    # SLURM: the runs that were requeued (a lost node, scontrol requeue, preemption), oldest first
    requeues: Tuple[Requeue, ...] = ()
    # a job with roles: how each role ended, the primary first
    roles: Tuple[RoleResult, ...] = ()
    # an elastic job: each time its world formed again (a node lost or joined), oldest first
    world_changes: Tuple[WorldChange, ...] = ()
    # the code it ran: the launch's snapshot (id, commit, dirty, source, dir); absent when it ran the live tree
    snapshot: Optional[Dict[str, Any]] = None

    @property
    def restarts(self) -> int:
        return len(self.earlier_runs)

    def to_dict(self) -> Dict[str, Any]:
        data: Dict[str, Any] = {
            SCHEMA_KEY: self.schema,
            "job": self.job,
            "name": self.name,
            "attempt": self.attempt,
            "overrides": list(self.overrides),
            "status": self.status.value,
            "num_nodes": self.num_nodes,
            "devices": self.devices,
            "world_size": self.world_size,
            "machine": self.machine,
            "summary_metric": self.summary_metric,
            "duration_s": self.duration_s,
            "stop_latency_s": self.stop_latency_s,
            "scheduler_id": self.scheduler_id,
        }
        if self.started_at is not None:
            data["started_at"] = self.started_at
        if self.ended_at is not None:
            data["ended_at"] = self.ended_at
        data.update(
            {
                "return_value": self.return_value,
                "failure": _failure_dict(self.failure) if self.failure is not None else None,
                "error": self.error,
            }
        )
        if self.earlier_runs:
            data["restarts"] = self.restarts
            data["earlier_runs"] = [asdict(run) for run in self.earlier_runs]
        if self.requeues:
            data["requeues"] = [asdict(requeue) for requeue in self.requeues]
        if self.roles:
            data["roles"] = [asdict(role) for role in self.roles]
        if self.world_changes:
            data["world_changes"] = [change.to_dict() for change in self.world_changes]
        if self.snapshot is not None:
            data["snapshot"] = dict(self.snapshot)
        return data

    @classmethod
    def _fields(cls, data: Mapping[str, Any]) -> "ResultRecord":
        if "status" not in data:
            raise RecordError("it has no 'status'")
        overrides = _get(data, "overrides", (list, tuple), ())
        scheduler_id = _get(data, "scheduler_id", (str, int))
        return cls(
            job=_get(data, "job", (int,), 0) or 0,
            name=_get(data, "name", (str,)),
            attempt=_get(data, "attempt", (str,)),
            overrides=tuple(str(o) for o in overrides or ()),
            status=JobState(data["status"]),
            num_nodes=_get(data, "num_nodes", (int,)),
            devices=_get(data, "devices", (int,)),
            world_size=_get(data, "world_size", (int,)),
            machine=_get(data, "machine", (str,)),
            summary_metric=_get(data, "summary_metric", (str,)),
            duration_s=_get(data, "duration_s", _NUMBER),
            stop_latency_s=_get(data, "stop_latency_s", _NUMBER),
            scheduler_id=None if scheduler_id is None else str(scheduler_id),
            started_at=_get(data, "started_at", _NUMBER),
            ended_at=_get(data, "ended_at", _NUMBER),
            return_value=data.get("return_value"),
            failure=_failure_of(data.get("failure")),
            error=_get(data, "error", (str,)),
            earlier_runs=tuple(
                run for run in map(EarlierRun.of, _get(data, "earlier_runs", (list,), ()) or ()) if run is not None
            ),
            requeues=tuple(
                one for one in map(Requeue.of, _get(data, "requeues", (list,), ()) or ()) if one is not None
            ),
            roles=tuple(one for one in map(RoleResult.of, _get(data, "roles", (list,), ()) or ()) if one is not None),
            world_changes=tuple(
                one for one in map(WorldChange.of, _get(data, "world_changes", (list,), ()) or ()) if one is not None
            ),
            snapshot=_get(data, "snapshot", (dict,)),
        )

    def concludes(self, attempt_id: Optional[str]) -> bool:
        """Whether it is the result of that attempt (not of an earlier or a later launch into the same dir)."""
        return self.attempt == attempt_id

    @property
    def completed(self) -> bool:
        return self.status == JobState.COMPLETED


# ----------------------------------------------------------------------------------------------- owner.json


@dataclass(frozen=True, kw_only=True)
class OwnerRecord(_Record):
    """The launch that owns a job dir now (``.mmt/owner.json``)."""

    KIND: ClassVar[str] = "job dir owner (.mmt/owner.json)"
    SCHEMA_VERSION: ClassVar[int] = OWNER_SCHEMA

    schema: int = OWNER_SCHEMA
    # the process that claimed the dir, and when
    host: Optional[str] = None
    pid: Optional[int] = None
    started: Optional[float] = None
    attempt: Optional[str] = None
    name: Optional[str] = None
    backend: Optional[str] = None
    job_id: Optional[str] = None
    # the scheduler's job (SLURM), once submitted (absent from the file until then), and that job as a user knows it
    # (its backend's noun and id: "SLURM job 123")
    scheduler_id: Optional[str] = None
    scheduler_job: Optional[str] = None

    @classmethod
    def of_this_process(cls, **facts: Any) -> "OwnerRecord":
        """An owner claimed by this process, now, with ``facts`` (attempt, name, backend, job_id ...)."""
        return cls(**{"host": socket.gethostname(), "pid": os.getpid(), "started": _now(), **facts})

    def with_facts(self, **facts: Any) -> "OwnerRecord":
        return replace(self, **facts)

    def to_dict(self) -> Dict[str, Any]:
        data: Dict[str, Any] = {
            SCHEMA_KEY: self.schema,
            "host": self.host,
            "pid": self.pid,
            "started": self.started,
            "attempt": self.attempt,
            "name": self.name,
            "backend": self.backend,
            "job_id": self.job_id,
        }
        if self.scheduler_id is not None:
            data["scheduler_id"] = self.scheduler_id
        if self.scheduler_job is not None:
            data["scheduler_job"] = self.scheduler_job
        return data

    @classmethod
    def _fields(cls, data: Mapping[str, Any]) -> "OwnerRecord":
        scheduler_id = _get(data, "scheduler_id", (str, int))
        return cls(
            host=_get(data, "host", (str,)),
            pid=_get(data, "pid", (int,)),
            started=_get(data, "started", _NUMBER),
            attempt=_get(data, "attempt", (str,)),
            name=_get(data, "name", (str,)),
            backend=_get(data, "backend", (str,)),
            job_id=_get(data, "job_id", (str,)),
            scheduler_id=None if scheduler_id is None or scheduler_id == "" else str(scheduler_id),
            scheduler_job=_get(data, "scheduler_job", (str,)),
        )


# ------------------------------------------------------------------------------------- error.<i>.json, exit.<i>.json


@dataclass(frozen=True, kw_only=True)
class ErrorRecord(_Record):
    """Process i of an attempt raised, or its command failed (``error.<i>.json``, written by the process itself)."""

    KIND: ClassVar[str] = "process error record (error.<i>.json)"
    SCHEMA_VERSION: ClassVar[int] = ERROR_SCHEMA

    schema: int = ERROR_SCHEMA
    # when it was recorded (None: an old record without it, which sorts last among failures)
    time: Optional[float] = field(default_factory=_now)
    # the root exception's type and first line, and the whole traceback
    exception: Optional[str] = None
    traceback: Optional[str] = None
    # the process ran a command, and exit_code/signal are that command's status (on disk: the two keys are there)
    command: bool = False
    exit_code: Optional[int] = None
    signal: Optional[str] = None

    @property
    def when(self) -> float:
        return self.time if self.time is not None else math.inf

    def to_dict(self) -> Dict[str, Any]:
        data: Dict[str, Any] = {
            SCHEMA_KEY: self.schema,
            "time": self.time,
            "exception": self.exception,
            "traceback": self.traceback,
        }
        if self.command:
            data.update(exit_code=self.exit_code, signal=self.signal)
        return data

    @classmethod
    def _fields(cls, data: Mapping[str, Any]) -> "ErrorRecord":
        return cls(
            time=_get(data, "time", _NUMBER),
            exception=_get(data, "exception", (str,)),
            traceback=_get(data, "traceback", (str,)),
            command="exit_code" in data,
            exit_code=_get(data, "exit_code", (int,)),
            signal=_get(data, "signal", (str,)),
        )


@dataclass(frozen=True, kw_only=True)
class ExitRecord(_Record):
    """Process i of an attempt exited (``exit.<i>.json``, written by the agent that ran it)."""

    KIND: ClassVar[str] = "process exit record (exit.<i>.json)"
    SCHEMA_VERSION: ClassVar[int] = EXIT_SCHEMA

    schema: int = EXIT_SCHEMA
    # its exit status; negative: killed by that signal
    code: int
    # mmt signalled it before it exited (a sibling failed, the time limit, a stop request)
    stopped: bool = False
    time: Optional[float] = field(default_factory=_now)

    @property
    def when(self) -> float:
        return self.time if self.time is not None else math.inf

    def to_dict(self) -> Dict[str, Any]:
        return {SCHEMA_KEY: self.schema, "code": self.code, "stopped": self.stopped, "time": self.time}

    @classmethod
    def _fields(cls, data: Mapping[str, Any]) -> "ExitRecord":
        code = _get(data, "code", (int,))
        if code is None:
            raise RecordError("it has no 'code'")
        return cls(code=code, stopped=bool(data.get("stopped", False)), time=_get(data, "time", _NUMBER))
