"""Bringing a registry record up to date from its job dir, the same way for every backend: the job's own
``result.json`` wins; a job nothing will ever run again is concluded FAILED, saying why."""

import time
from pathlib import Path
from typing import Optional

from mmt.core.errors import NotCarriedOut
from mmt.core.jobdir import JobDir
from mmt.core.states import JobState
from mmt.records import liveness
from mmt.records.payload import discard_payload
from mmt.records.registry import JobRecord, Registry
from mmt.records.restarts import recorded, with_earlier_runs
from mmt.records.schema import ResultRecord, UnknownSchemaError


def own_result(record: JobRecord) -> Optional[ResultRecord]:
    """The job dir's ``result.json``, when it concludes this record's attempt (not an earlier or later run's)."""
    result = ResultRecord.read(JobDir(Path(record.job_dir)).result)
    return result if result is not None and result.concludes(record.attempt) else None


def job_num(record: JobRecord) -> int:
    """The job's number in its sweep: the last part of its id (``<launch id>-<num>``)."""
    last = record.job_id.rsplit("-", 1)[-1]
    return int(last) if last.isdigit() else 0


def conclude_orphan(record: JobRecord, registry: Registry, reason: str) -> JobRecord:
    """FAILED, with ``reason``, unless another process got there first (then its record). The job dir says so too
    (``result.json``, when the dir is there and holds no result of this attempt): what reads job dirs (the live
    page, a rerun) must not take the job for running."""
    started = record.started_at
    ended = _last_sign_of_life(record, started)
    result = ResultRecord(
        status=JobState.FAILED,
        error=f"{record.name}: {reason}",
        attempt=record.attempt,
        job=job_num(record),
        name=record.name,
        overrides=tuple(record.overrides),
        num_nodes=record.num_nodes,
        devices=record.devices,
        machine=record.machine,
        scheduler_id=record.scheduler_id,
        started_at=started,
        ended_at=ended,
        duration_s=ended - started if started is not None else None,
    )
    # the runs that failed before its supervisor went (each recorded when it failed: it may have died in a back-off)
    result = with_earlier_runs(result, recorded(JobDir(Path(record.job_dir)).attempt(record.attempt)))
    as_dict = result.to_dict()
    if registry.conclude_orphan(record.name, record.attempt, as_dict):
        record.state, record.result, record.ended_at = result.status.value, as_dict, result.ended_at
        _write_orphan_result(record, result)
        liveness.forget(record.job_id, record.attempt)
        # nothing will run it: its pickled config and copied secrets go (the records stay, for what they tell)
        discard_payload(JobDir(Path(record.job_dir)).attempt(record.attempt))
        return record
    return registry.get(record.name) or record


def _last_sign_of_life(record: JobRecord, started: Optional[float]) -> float:
    """When the job's supervisor was last alive: its beacon's last beat (it beats every few seconds while it watches),
    not the moment its death was noticed; now where there is no beat to read."""
    now = time.time()
    beat = liveness.last_beat(record.job_id, record.attempt)
    if beat is None or beat > now:
        return now
    return max(beat, started) if started is not None else beat


def _write_orphan_result(record: JobRecord, result: ResultRecord) -> None:
    job_dir = JobDir(Path(record.job_dir))
    if not job_dir.root.is_dir():
        return  # a job that deleted its own dir: nothing is made again for it
    try:
        if own_result(record) is not None:
            return
        result.write(job_dir.result)
    except (OSError, UnknownSchemaError):  # unwritable, or a newer mmt's result there: the registry keeps it
        pass


def save(record: JobRecord, registry: Registry, state: str, result: Optional[ResultRecord]) -> JobRecord:
    """The record with ``state`` (or the ``result``'s final state), saved when it changed."""
    if result is not None:
        as_dict = result.to_dict()
        ended_at = result.ended_at if result.ended_at is not None else time.time()
        record.state, record.result, record.ended_at = result.status.value, as_dict, ended_at
        record.restarts = result.restarts
        registry.update(
            record.name, state=record.state, result=as_dict, ended_at=record.ended_at, restarts=record.restarts
        )
    elif state != record.state:
        record.state = state
        registry.update(record.name, state=state)
    return record


def request_stop(record: JobRecord) -> str:
    """A stop request in the run dir (never in the job dir, which the job may have deleted): whoever supervises the
    job checks for one every half second."""
    try:
        liveness.request_stop(record.job_id, record.attempt)
    except OSError as exc:
        raise NotCarriedOut(
            f"{record.name}: could not ask its supervisor to stop it: {liveness.run_dir().root}: {exc.strerror or exc}"
        ) from None
    return f"{record.name}: asked its supervisor (pid {record.supervisor_pid}) to stop it"
