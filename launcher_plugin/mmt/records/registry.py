"""The registry of jobs: every job any launcher, CLI or SDK started, attached or detached, on any backend.

A real embedded database, SQLite (``$MMT_HOME/registry.sqlite``, default ``~/.mmt``), because the registry is
written by many processes at once (concurrent launchers, a detached supervisor, ``mmt list`` reconciling states)
and must stay readable when one of them is killed mid-write: SQLite's transactions give both, and WAL lets readers
go on while a writer writes. The job dirs remain the truth about how a job ended (``result.json``, written by
whoever concluded it, inside a SLURM allocation included): the registry is the index of names to dirs and scheduler
ids, with the last state seen. Compute nodes never write it (SQLite over NFS is unsafe); only processes on the host
that submitted do.
"""

import json
import os
import re
import sqlite3
from contextlib import contextmanager
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any, Dict, Iterator, List, Optional

from mmt.core.errors import UsageError
from mmt.core.states import FINAL_STATES
from mmt.records.schema import RecordError, ResultRecord

HOME_VAR = "MMT_HOME"
_FINAL_STATES = sorted(state.value for state in FINAL_STATES)
_SCHEMA = """
CREATE TABLE IF NOT EXISTS jobs (
    name TEXT PRIMARY KEY,
    job_id TEXT NOT NULL,
    backend TEXT NOT NULL,
    job_dir TEXT NOT NULL,
    sweep_dir TEXT NOT NULL,
    attempt TEXT NOT NULL,
    num_nodes INTEGER NOT NULL,
    devices INTEGER NOT NULL,
    machine TEXT NOT NULL,
    command TEXT,
    command_mode TEXT,
    overrides TEXT NOT NULL,
    state TEXT NOT NULL,
    scheduler_id TEXT,
    supervisor_pid INTEGER,
    supervisor_host TEXT,
    supervisor_start INTEGER,
    detached INTEGER NOT NULL DEFAULT 0,
    created_at REAL NOT NULL,
    started_at REAL,
    ended_at REAL,
    result TEXT,
    restarts INTEGER
)
"""


def _add_missing_columns(connection: sqlite3.Connection) -> None:
    """A registry written by an older mmt gets the columns added since (nullable), its rows kept."""
    have = {row[1] for row in connection.execute("PRAGMA table_info(jobs)")}
    for line in _SCHEMA.splitlines():
        parts = line.strip().rstrip(",").split()
        if len(parts) >= 2 and parts[0].islower() and parts[0] not in have and parts[0] not in ("create",):
            connection.execute(f"ALTER TABLE jobs ADD COLUMN {parts[0]} {parts[1]}")


def home() -> Path:
    return Path(os.environ.get(HOME_VAR) or Path.home() / ".mmt")


class RegistryError(UsageError):
    """The registry file cannot be used (damaged, not SQLite, read-only, unreadable): one line saying what to do."""


def unusable(path: Path, exc: BaseException) -> RegistryError:
    """The error for registry ``path`` that raised ``exc``, with what to do about it."""
    text = str(exc) or type(exc).__name__
    lowered = text.lower()
    if "not a database" in lowered or "malformed" in lowered or "corrupt" in lowered:
        hint = (
            f"the file is damaged: move it aside (mv {path} {path}.broken) and mmt starts a new one; every "
            "job's files stay in its job dir"
        )
    elif "locked" in lowered or "busy" in lowered:
        hint = "another mmt process holds it: try again in a moment"
    elif (
        "readonly" in lowered
        or "read-only" in lowered
        or isinstance(exc, PermissionError)
        or "unable to open" in lowered
        or "permission" in lowered
    ):
        hint = (
            f"mmt writes it on every command: make {path.parent} and the file readable and writable by you, "
            f"or point {HOME_VAR} at a directory that is"
        )
    else:
        hint = f"check the file, or point {HOME_VAR} at another directory"
    return RegistryError(f"the job registry {path} cannot be used: {text}. HINT: {hint}")


@dataclass
class JobRecord:
    name: str
    job_id: str
    backend: str
    job_dir: str
    sweep_dir: str
    attempt: str
    num_nodes: int
    devices: int
    machine: str
    command: Optional[str]
    command_mode: str
    overrides: List[str]
    state: str
    scheduler_id: Optional[str] = None
    supervisor_pid: Optional[int] = None
    supervisor_host: Optional[str] = None
    # when the supervisor process started (mmt.core.proctree.start_time): its pid is that process, not a reuse
    supervisor_start: Optional[int] = None
    detached: bool = False
    created_at: float = 0.0
    started_at: Optional[float] = None
    ended_at: Optional[float] = None
    # result.json's content once the job ended (masked like the file): ResultRecord.to_dict(), see result_record()
    result: Optional[Dict[str, Any]] = None
    # times the job was restarted after a failure (hydra.launcher.max_restarts) so far
    restarts: int = 0

    def result_record(self) -> Optional[ResultRecord]:
        """The job's result, typed, once it ended; None before, or when the registry holds no readable one
        (UnknownSchemaError when a newer mmt recorded it)."""
        if self.result is None:
            return None
        try:
            return ResultRecord.from_dict(self.result, where=f"of job {self.name} in the registry")
        except RecordError:
            return None

    def to_row(self) -> Dict[str, Any]:
        row = asdict(self)
        row["overrides"] = json.dumps(self.overrides)
        row["result"] = json.dumps(self.result) if self.result is not None else None
        row["detached"] = int(self.detached)
        return row

    @classmethod
    def from_row(cls, row: sqlite3.Row) -> "JobRecord":
        values = {f.name: row[f.name] for f in fields(cls)}
        values["overrides"] = json.loads(values["overrides"])
        values["result"] = json.loads(values["result"]) if values["result"] else None
        values["detached"] = bool(values["detached"])
        values["restarts"] = values["restarts"] or 0  # a row from an mmt before restarts
        return cls(**values)


def named(entry: str, records: List[JobRecord]) -> List[JobRecord]:
    """The registered jobs a name stands for: the job of that name, or else every job of the launch of that name
    (``hydra.launcher.name``: its jobs are ``<name>-<n>``)."""
    exact = [record for record in records if record.name == entry]
    return exact or [record for record in records if re.fullmatch(rf"{re.escape(entry)}-\d+", record.name)]


class Registry:
    """One connection per process (opened on first use, never shared across a fork or a pickle)."""

    def __init__(self, path: Optional[Path] = None) -> None:
        self.path = path or home() / "registry.sqlite"
        self._connection: Optional[sqlite3.Connection] = None
        self._pid = 0

    def __getstate__(self) -> Dict[str, Any]:
        return {"path": self.path}

    def __setstate__(self, state: Dict[str, Any]) -> None:
        Registry.__init__(self, state["path"])

    def _open(self) -> sqlite3.Connection:
        self.path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        connection = sqlite3.connect(self.path, timeout=30, isolation_level=None, check_same_thread=False)
        try:
            if self.path.stat().st_mode & 0o077:
                os.chmod(self.path, 0o600)  # names, dirs and results: the owner's business
            connection.row_factory = sqlite3.Row
            connection.execute("PRAGMA journal_mode=WAL")
            # WAL with synchronous=NORMAL: every transaction is atomic and the file consistent after any crash; a
            # power cut may lose the last ones (the job dirs still hold every result)
            connection.execute("PRAGMA synchronous=NORMAL")
            connection.execute("PRAGMA busy_timeout=30000")
            connection.execute(_SCHEMA)
            _add_missing_columns(connection)
        except BaseException:
            connection.close()
            raise
        return connection

    @contextmanager
    def _connect(self) -> Iterator[sqlite3.Connection]:
        """The connection; a registry that cannot be used (a damaged file, a read-only or unreadable one) raises
        RegistryError, one line saying what to do, instead of sqlite's traceback."""
        try:
            if self._connection is None or self._pid != os.getpid():
                self._connection, self._pid = self._open(), os.getpid()
            yield self._connection
        except (sqlite3.Error, OSError) as exc:
            raise unusable(self.path, exc) from exc

    def add(self, records: List[JobRecord]) -> None:
        """Register jobs, all or none; a taken name is refused (names identify jobs: `mmt logs NAME`)."""
        with self._connect() as db:
            db.execute("BEGIN IMMEDIATE")
            try:
                for record in records:
                    taken = db.execute("SELECT state, job_dir FROM jobs WHERE name = ?", (record.name,)).fetchone()
                    if taken is not None:
                        raise UsageError(
                            f"a job named {record.name!r} exists already ({taken['state']}, "
                            f"{taken['job_dir']}). HINT: choose another name, or `mmt delete "
                            f"{record.name}` first"
                        )
                    row = record.to_row()
                    db.execute(
                        f"INSERT INTO jobs ({', '.join(row)}) VALUES ({', '.join('?' for _ in row)})",
                        list(row.values()),
                    )
                db.execute("COMMIT")
            except BaseException:
                db.execute("ROLLBACK")
                raise

    def names_taken(self, names: List[str]) -> List[str]:
        with self._connect() as db:
            marks = ", ".join("?" for _ in names)
            return [r["name"] for r in db.execute(f"SELECT name FROM jobs WHERE name IN ({marks})", names)]

    def update(self, name: str, **values: Any) -> None:
        if "result" in values and values["result"] is not None:
            values["result"] = json.dumps(values["result"])
        if "detached" in values:
            values["detached"] = int(values["detached"])
        with self._connect() as db:
            db.execute(
                f"UPDATE jobs SET {', '.join(f'{k} = ?' for k in values)} WHERE name = ?", [*values.values(), name]
            )

    def conclude_orphan(self, name: str, attempt: str, result: Dict[str, Any]) -> bool:
        """Record ``result`` for a job whose launcher is gone (a local job's, or a SLURM job's before it got its id),
        unless in the meantime the job got an id or ended (its launcher may have just saved the id, or concluded
        it): the check and the write are one statement, so they cannot interleave with that launcher's writes.
        Whether it was recorded."""
        with self._connect() as db:
            changed = db.execute(
                "UPDATE jobs SET state = ?, result = ?, ended_at = ? WHERE name = ? AND attempt = ? "
                "AND scheduler_id IS NULL AND ended_at IS NULL AND state NOT IN "
                f"({', '.join('?' for _ in _FINAL_STATES)})",
                [result["status"], json.dumps(result), result["ended_at"], name, attempt, *_FINAL_STATES],
            ).rowcount
        return changed == 1

    def get(self, name: str) -> Optional[JobRecord]:
        with self._connect() as db:
            row = db.execute("SELECT * FROM jobs WHERE name = ?", (name,)).fetchone()
        return JobRecord.from_row(row) if row is not None else None

    def require(self, name: str) -> JobRecord:
        record = self.get(name)
        if record is None:
            raise UsageError(
                f"no job named {name!r} in the registry ({self.path}). HINT: `mmt list --all` lists every job"
            )
        return record

    def list(self, since: Optional[float] = None) -> List[JobRecord]:
        """Jobs, newest first; ``since``: only those created since then, or not final yet."""
        with self._connect() as db:
            if since is None:
                rows = db.execute("SELECT * FROM jobs ORDER BY created_at DESC").fetchall()
            else:
                rows = db.execute(
                    "SELECT * FROM jobs WHERE created_at >= ? OR ended_at IS NULL ORDER BY created_at DESC", (since,)
                ).fetchall()
        return [JobRecord.from_row(row) for row in rows]

    def delete(self, name: str, attempt: Optional[str] = None) -> None:
        """Forget the job ``name``; with ``attempt``, only the row that attempt inserted (a launch giving up must
        never delete another launch's job that won the name)."""
        with self._connect() as db:
            if attempt is None:
                db.execute("DELETE FROM jobs WHERE name = ?", (name,))
            else:
                db.execute("DELETE FROM jobs WHERE name = ? AND attempt = ?", (name, attempt))
