"""Bringing a registry record up to date from its job dir, the same way for every backend: the job's own
``result.json`` wins; a job nothing will ever run again is concluded FAILED, saying why."""

import time
from pathlib import Path
from typing import Optional

from mmt.core.jobdir import JobDir
from mmt.core.states import JobState
from mmt.records.payload import discard_payload
from mmt.records.registry import JobRecord, Registry
from mmt.records.schema import ResultRecord


def own_result(record: JobRecord) -> Optional[ResultRecord]:
    """The job dir's ``result.json``, when it concludes this record's attempt (not an earlier or later run's)."""
    result = ResultRecord.read(JobDir(Path(record.job_dir)).result)
    return result if result is not None and result.concludes(record.attempt) else None


def job_num(record: JobRecord) -> int:
    """The job's number in its sweep: the last part of its id (``<launch id>-<num>``)."""
    last = record.job_id.rsplit("-", 1)[-1]
    return int(last) if last.isdigit() else 0


def conclude_orphan(record: JobRecord, registry: Registry, reason: str) -> JobRecord:
    """FAILED, with ``reason``, unless another process got there first (then its record)."""
    result = ResultRecord(status=JobState.FAILED, error=f"{record.name}: {reason}", attempt=record.attempt,
                          job=job_num(record), ended_at=time.time())
    as_dict = result.to_dict()
    if registry.conclude_orphan(record.name, record.attempt, as_dict):
        record.state, record.result, record.ended_at = result.status.value, as_dict, result.ended_at
        # nothing will run it: its pickled config and copied secrets go (the records stay, for what they tell)
        discard_payload(JobDir(Path(record.job_dir)).attempt(record.attempt))
        return record
    return registry.get(record.name) or record


def save(record: JobRecord, registry: Registry, state: str, result: Optional[ResultRecord]) -> JobRecord:
    """The record with ``state`` (or the ``result``'s final state), saved when it changed."""
    if result is not None:
        as_dict = result.to_dict()
        ended_at = result.ended_at if result.ended_at is not None else time.time()
        record.state, record.result, record.ended_at = result.status.value, as_dict, ended_at
        registry.update(record.name, state=record.state, result=as_dict, ended_at=record.ended_at)
    elif state != record.state:
        record.state = state
        registry.update(record.name, state=state)
    return record


def request_stop(record: JobRecord) -> str:
    """A stop request in the job's attempt dir: whoever supervises the job checks for one every half second."""
    attempt = JobDir(Path(record.job_dir)).attempt(record.attempt)
    if attempt.dir.exists():
        attempt.stop_request.touch()
        return f"{record.name}: asked its supervisor (pid {record.supervisor_pid}) to stop it"
    return f"{record.name}: nothing to stop (its attempt dir is gone)"
