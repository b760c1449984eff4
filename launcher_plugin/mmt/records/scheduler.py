"""What the scheduler last said about a job that has not ended (``<attempt dir>/scheduler.json``): its queue state,
why it waits, whether it can never start, since when the scheduler cannot be asked. A typed record like those of
mmt.records.schema (versioned the same way), of one attempt (it lives in the attempt's dir).

Written by whoever asks the scheduler about the job: the SLURM backend while a launcher (or ``mmt wait``) watches,
and a refresh (``mmt list``, ``mmt inspect``, the SDK) from any process. Read by ``mmt list``/``mmt inspect`` and the
live page, which never ask the scheduler themselves, and by whoever concludes a job cancelled because it could never
start (so that it is FAILED with the reason, not "cancelled outside"), or that its launcher cancelled (saying why).
A backend without a queue (local) writes none.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, replace
from typing import Any, ClassVar, Dict, Mapping, Optional

from mmt.core.jobdir import Attempt
from mmt.records.schema import _NUMBER, SCHEMA_KEY, RecordError, UnknownSchemaError, _get, _Record

SCHEDULER_SCHEMA = 1


def clock(when: float, now: Optional[float] = None) -> str:
    """``HH:MM`` today, ``YYYY-MM-DD HH:MM`` on another day (local time)."""
    now = time.time() if now is None else now
    same_day = time.localtime(when)[:3] == time.localtime(now)[:3]
    return time.strftime("%H:%M" if same_day else "%Y-%m-%d %H:%M", time.localtime(when))


@dataclass(frozen=True, kw_only=True)
class SchedulerRecord(_Record):
    """The scheduler's view of one attempt of a job, as last seen (``scheduler.json`` in the attempt dir)."""

    KIND: ClassVar[str] = "scheduler record (scheduler.json)"
    SCHEMA_VERSION: ClassVar[int] = SCHEDULER_SCHEMA

    schema: int = SCHEDULER_SCHEMA
    scheduler_id: Optional[str] = None
    # the scheduler's own state word (SLURM: PENDING, RUNNING ...); None when it was never seen
    state: Optional[str] = None
    # why the job waits, as the scheduler says it (SLURM's pending reason: "Resources", "ReqNodeNotAvail,
    # UnavailableNodes:node2" ...); None when it does not wait
    reason: Optional[str] = None
    # the reason in words ("the nodes it needs are busy")
    explanation: Optional[str] = None
    # when the job was first seen in this state for this reason
    since: Optional[float] = None
    # the reason cannot resolve by waiting: the job was cancelled, FAILED with ``message`` (one line: what the job
    # asks and what the partition offers)
    never_starts: bool = False
    message: Optional[str] = None
    # the scheduler does not answer (SLURM: "slurmctld" when squeue fails, "slurmdbd" when sacct does), since then
    unreachable: Optional[str] = None
    unreachable_since: Optional[float] = None
    # the launcher cancelled the job, and why ("the launch failed: job 1 was refused ..."): whoever concludes the
    # job later (its own last step, ``mmt list``) says so, not "cancelled outside the launcher"
    stopped_because: Optional[str] = None
    # when the scheduler took that stop; None while it could not be asked (it did not answer): whoever finds the
    # job running later (``mmt list``) asks again
    stop_sent_at: Optional[float] = None

    @property
    def reason_code(self) -> Optional[str]:
        """The reason's first word: ``ReqNodeNotAvail, UnavailableNodes:node2`` -> ``ReqNodeNotAvail``."""
        return self.reason.split(",")[0].strip() if self.reason else None

    def note(self, final: bool = False) -> Optional[str]:
        """A few words on what the job's state alone does not say, for ``mmt list`` and the live page: why it waits,
        that it can never start, or that the scheduler does not answer; None when there is nothing to say."""
        if self.never_starts:
            return f"can never start: {self.reason_code}"
        if final:
            return None
        if self.unreachable_since is not None:
            unconfirmed = "; its stop not confirmed" if self.stop_unconfirmed else ""
            return f"{self.unreachable or 'the scheduler'} not answering since {clock(self.unreachable_since)}" + (
                unconfirmed
            )
        if self.reason:
            return self.reason
        return None

    @property
    def stop_unconfirmed(self) -> bool:
        """A stop was asked that the scheduler has not taken yet (it did not answer)."""
        return self.stopped_because is not None and self.stop_sent_at is None

    def describe(self) -> Optional[str]:
        """The whole story, for ``mmt inspect``: the reason with its explanation and since when, or the message."""
        if self.never_starts:
            return self.message or self.note()
        parts = []
        if self.reason:
            words = f"{self.reason} ({self.explanation})" if self.explanation else self.reason
            since = f" since {clock(self.since)}" if self.since is not None else ""
            parts.append(f"waits in the queue{since}: {words}")
        if self.unreachable_since is not None:
            parts.append(
                f"{self.unreachable or 'the scheduler'} not answering since {clock(self.unreachable_since)}; "
                "the state shown is the last one seen"
            )
        if self.stop_unconfirmed:
            parts.append(f"asked to stop ({self.stopped_because}), not confirmed yet: asked again once it answers")
        return "; ".join(parts) or None

    def seen(
        self, state: Optional[str], reason: Optional[str], explanation: Optional[str], now: Optional[float] = None
    ) -> "SchedulerRecord":
        """This record after the scheduler answered: ``state`` and ``reason`` (``since`` kept while they stay)."""
        now = time.time() if now is None else now
        same = state == self.state and reason == self.reason
        return replace(
            self,
            state=state,
            reason=reason,
            explanation=explanation,
            since=self.since if same and self.since is not None else now,
            unreachable=None,
            unreachable_since=None,
        )

    def unanswered(self, who: str, now: Optional[float] = None) -> "SchedulerRecord":
        """This record after ``who`` did not answer (the first time kept)."""
        now = time.time() if now is None else now
        since = self.unreachable_since if self.unreachable_since is not None and self.unreachable == who else now
        return replace(self, unreachable=who, unreachable_since=since)

    def answered(self) -> "SchedulerRecord":
        """This record after the scheduler answered again (its state unchanged)."""
        return replace(self, unreachable=None, unreachable_since=None)

    def stop_sent(self, now: Optional[float] = None) -> "SchedulerRecord":
        """This record after the scheduler took the stop (the first time kept)."""
        return (
            self if self.stop_sent_at is not None else replace(self, stop_sent_at=time.time() if now is None else now)
        )

    def to_dict(self) -> Dict[str, Any]:
        return {
            SCHEMA_KEY: self.schema,
            "scheduler_id": self.scheduler_id,
            "state": self.state,
            "reason": self.reason,
            "explanation": self.explanation,
            "since": self.since,
            "never_starts": self.never_starts,
            "message": self.message,
            "unreachable": self.unreachable,
            "unreachable_since": self.unreachable_since,
            **({"stopped_because": self.stopped_because} if self.stopped_because else {}),
            **({"stop_sent_at": self.stop_sent_at} if self.stop_sent_at is not None else {}),
        }

    @classmethod
    def _fields(cls, data: Mapping[str, Any]) -> "SchedulerRecord":
        scheduler_id = _get(data, "scheduler_id", (str, int))
        return cls(
            scheduler_id=None if scheduler_id is None else str(scheduler_id),
            state=_get(data, "state", (str,)),
            reason=_get(data, "reason", (str,)),
            explanation=_get(data, "explanation", (str,)),
            since=_get(data, "since", _NUMBER),
            never_starts=bool(data.get("never_starts", False)),
            message=_get(data, "message", (str,)),
            unreachable=_get(data, "unreachable", (str,)),
            unreachable_since=_get(data, "unreachable_since", _NUMBER),
            stopped_because=_get(data, "stopped_because", (str,)),
            stop_sent_at=_get(data, "stop_sent_at", _NUMBER),
        )


def read_scheduler(attempt: Attempt) -> Optional[SchedulerRecord]:
    """The attempt's scheduler record; None when there is none, or none this mmt can read (a newer mmt's)."""
    try:
        return SchedulerRecord.read(attempt.scheduler)
    except UnknownSchemaError:
        return None


def scheduler_record_of(data: Any) -> Optional[SchedulerRecord]:
    """A scheduler record from JSON already read (the live page's cached reader); None when it is not one."""
    if not isinstance(data, Mapping):
        return None
    try:
        return SchedulerRecord.from_dict(data)
    except (RecordError, UnknownSchemaError):
        return None


def write_scheduler(attempt: Attempt, record: SchedulerRecord, previous: Optional[SchedulerRecord]) -> bool:
    """Write ``record`` unless it says what ``previous`` said; whether it was written. A dir that cannot be written
    (gone, a full disk) loses only this view of the job: the job itself goes on."""
    if previous is not None and previous == record:
        return False
    if not attempt.dir.is_dir():  # its job dir was deleted: never make it again
        return False
    try:
        record.write(attempt.scheduler)
    except OSError:
        return False
    return True
