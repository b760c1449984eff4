"""Backends whose jobs run under a scheduler and outlive their launcher (SLURM, Ray, and any backend like them): the
lifecycle they share, so that each keeps only what is its scheduler's own.

* :class:`ScheduledJob`: a submitted job as such a backend tracks it (its state, when it started, why it was stopped,
  a stop the scheduler has not taken yet).
* :class:`ScheduledBackend`: a backend that also watches the jobs it registered; its settings class and its records
  module (what answers for its jobs from any process) are named once. It polls one query for every watched job,
  says things once (``drain_notices``), asks again for a stop the scheduler did not take, and concludes a job from
  its own ``result.json`` when the job concluded itself.
* :func:`refresh_registered`: a registered job brought up to date from its job dir and one question to its
  scheduler, the same skeleton for every such backend (``mmt list``, ``mmt inspect``, the SDK).

The task file the scheduler's side of a job runs is :func:`mmt.records.payload.write_task`'s (light: that side
imports only what it runs).
"""

import abc
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, ClassVar, Generic, List, Optional, Sequence, Set, Tuple, TypeVar

from omegaconf import DictConfig

from mmt.backends.base import Backend, JobHandle, JobSnapshot, Submission, Watcher
from mmt.backends.registry import job_noun
from mmt.core.states import JobState
from mmt.planning.plan import Limits
from mmt.records.outcome import JobOutcome, all_succeeded, outcome_of_record, read_result
from mmt.records.ownership import lock_is_held
from mmt.records.reconcile import conclude_orphan, own_result, save
from mmt.records.registry import JobRecord, Registry
from mmt.records.schema import ResultRecord, UnknownSchemaError
from mmt.records.world import last_world_plan, read_changes

# seconds between two asks to stop a job whose scheduler did not take the stop
STOP_RETRY_S = 2.0


@dataclass(kw_only=True)
class ScheduledJob(JobHandle):
    """A job a scheduler runs, as its backend tracks it (each backend adds its scheduler's own fields)."""

    submission: Submission
    # when it was submitted, then first seen running (monotonic)
    submitted: float
    started: Optional[float] = None
    state: JobState = JobState.PENDING
    # runs restarted so far (its scheduler's or its own side's)
    restarts: int = 0
    stopped_because: Optional[str] = None
    outcome: Optional[JobOutcome] = None
    # why it waits, as last said on the console
    reason: Optional[str] = None
    # a stop the scheduler did not take yet (it did not answer): asked again from wait() from this time on
    stop_due: Optional[float] = None
    # an elastic job's world changes said on the console: (run, generation, its first training step seen)
    world_said: Set[Tuple[int, int, bool]] = field(default_factory=set)

    @property
    def scheduler_id(self) -> str:
        raise NotImplementedError

    def duration(self, now: float) -> float:
        """Seconds from its start (its submission, if it was never seen running) to ``now`` (monotonic)."""
        return now - (self.started or self.submitted)


J = TypeVar("J", bound=ScheduledJob)
S = TypeVar("S")


class ScheduledBackend(Backend[J], Watcher[J], Generic[J, S]):
    """A backend whose jobs a scheduler runs and conclude themselves; it watches the jobs it registered too."""

    survives_launcher = True
    #: its settings: ``from_config(launcher_cfg)`` and ``for_watching(poll_interval_s)``
    settings_class: ClassVar[Any]
    #: what answers for its registered jobs from any process: ``refresh(record, registry)``, ``stop(record)`` and,
    #: where one question serves many jobs, ``refresh_all(records, registry)``, ``stop_all(records)``
    records: ClassVar[Any]

    @property
    def limits(self) -> Limits:
        """mmt's own bound for one job: the scheduler refuses what its cluster cannot run, more precisely."""
        why = f"mmt's bound for one {job_noun(self.name)}; the scheduler refuses what its cluster cannot run"
        return Limits(max_nodes=100_000, max_devices=1_024, max_world=10_000_000, why=why)

    def __init_subclass__(cls, **declared: Any) -> None:
        """A backend declares its name, settings class and records module in its class statement:
        ``class RayBackend(ScheduledBackend[...], name="ray", settings=RaySettings, records=records)``."""
        name, settings, records = (
            declared.pop("name", None),
            declared.pop("settings", None),
            declared.pop("records", None),
        )
        super().__init_subclass__(**declared)
        if name is not None:
            cls.name, cls.settings_class, cls.records = name, settings, records

    def __init__(self, settings: S) -> None:
        self.settings: S = settings
        self.project_dir = os.getcwd()
        self._watched: List[J] = []
        self._notices: List[str] = []
        self._next_query = 0.0

    @classmethod
    def from_config(cls, launcher_cfg: DictConfig) -> "ScheduledBackend[J, S]":
        return cls(cls.settings_class.from_config(launcher_cfg))

    @classmethod
    def watcher(cls, poll_interval_s: float = 1.0) -> "ScheduledBackend[J, S]":
        return cls(cls.settings_class.for_watching(poll_interval_s))

    @classmethod
    def refresh(cls, record: JobRecord, registry: Registry) -> JobRecord:
        result: JobRecord = cls.records.refresh(record, registry)
        return result

    @classmethod
    def refresh_all(cls, records_: Sequence[JobRecord], registry: Registry) -> List[JobRecord]:
        if hasattr(cls.records, "refresh_all"):
            return list(cls.records.refresh_all(records_, registry))
        return super().refresh_all(records_, registry)

    @classmethod
    def stop(cls, record: JobRecord) -> str:
        return str(cls.records.stop(record))

    @classmethod
    def stop_all(cls, records_: Sequence[JobRecord]) -> List[str]:
        if hasattr(cls.records, "stop_all"):
            return list(cls.records.stop_all(records_))
        return super().stop_all(records_)

    # ------------------------------------------------------------------------------------------ what each says

    @abc.abstractmethod
    def _query(self) -> None:
        """Ask the scheduler about every watched job that has not ended (one question where it can)."""

    @abc.abstractmethod
    def _update(self, job: J) -> None:
        """The job's state from its attempt dir and what the scheduler last said; concluded once it has ended."""

    @abc.abstractmethod
    def _record_stop(self, job: J, reason: str) -> None:
        """Record why the job is stopped before stopping it: whoever concludes it then says so."""

    @abc.abstractmethod
    def _send_stop(self, job: J) -> Optional[str]:
        """Ask the scheduler to stop the job; None when it took it, else why not (it did not answer ...)."""

    def _stop_taken(self, job: J) -> None:
        """The scheduler took the stop (after it had not, when ``job.stop_due`` is set): what to record and say."""

    def _stop_not_taken(self, job: J, why: str) -> str:
        """What to say, once, of a stop the scheduler did not take."""
        return (
            f"mmt: could not stop {job_noun(self.name)} {job.scheduler_id} ({job.plan.name}): {why}; asking again "
            f"every {STOP_RETRY_S:g} s until it answers (the job runs on meanwhile)"
        )

    def _silent(self, job: J) -> Optional[str]:
        """Whether the job's scheduler does not answer: who, since when, how to check (None: it answers)."""
        return None

    # ------------------------------------------------------------------------------------------ the interface

    def poll(self, handle: J) -> JobSnapshot:
        if handle.outcome is None:
            self._update(handle)
        return JobSnapshot(
            state=handle.state,
            scheduler_id=handle.scheduler_id,
            outcome=handle.outcome,
            silent=self._silent(handle) if handle.outcome is None else None,
        )

    def cancel(self, handle: J, reason: str) -> None:
        if handle.outcome is None and handle.stopped_because is None:
            handle.stopped_because = reason
            handle.state = JobState.STOPPING
            self._record_stop(handle, reason)  # first: whoever concludes the job then says why it was stopped
            self._stop(handle)
            self._next_query = 0.0

    def _stop(self, job: J) -> None:
        """Ask once; when the scheduler does not take it, say so once and ask again every STOP_RETRY_S."""
        why = self._send_stop(job)
        if why is None:
            self._stop_taken(job)
            job.stop_due = None
            return
        if job.stop_due is None:
            self._notices.append(self._stop_not_taken(job, why))
        job.stop_due = time.monotonic() + STOP_RETRY_S

    def wait(self, timeout_s: float) -> None:
        time.sleep(min(timeout_s, 0.1))
        now = time.monotonic()
        for job in self._watched:
            if job.outcome is None and job.stop_due is not None and now >= job.stop_due:
                self._stop(job)
        if time.monotonic() >= self._next_query:
            self._query()

    def _note_world_changes(self, job: J) -> None:
        """An elastic job's world changes, as its coordinator recorded them (``world.jsonl``): each said once when
        it is decided, and again with its time to training."""
        if job.plan.elastic is None:
            return
        for change in read_changes(job.attempt.job_dir):
            key = (change.restart, change.generation, change.training_at is not None)
            if key not in job.world_said:
                job.world_said.add(key)
                self._notices.append(f"mmt: {job.plan.label} ({job.plan.name}): {change.describe()}")

    def drain_notices(self) -> List[str]:
        notices, self._notices = self._notices, []
        return notices

    # ------------------------------------------------------------------------------------------ concluding

    def _completed(self, job: J, now: float) -> bool:
        """Every process of the job reported success: done, without waiting for the scheduler to tidy up (an
        epilog, a placement group released), nothing that changes the result."""
        if not all_succeeded(last_world_plan(job.plan, job.attempt), job.attempt):
            return False
        self._conclude(job, JobOutcome(JobState.COMPLETED, job.duration(now), scheduler_id=job.scheduler_id))
        return True

    def _own_conclusion(self, job: J) -> Optional[ResultRecord]:
        """The job's own conclusion, when its scheduler's side wrote it (``finalized``, result.json of this
        attempt)."""
        if not job.attempt.finalized.exists():
            return None
        try:
            own = read_result(Path(job.plan.job_dir))
        except UnknownSchemaError:
            return None
        return own if own is not None and own.concludes(job.attempt.id) else None

    def _concluded_itself(self, job: J, now: float, fallback_duration: Optional[float] = None) -> bool:
        """Conclude the job from its own conclusion, if it wrote one; whether it did."""
        own = self._own_conclusion(job)
        if own is None:
            return False
        outcome = outcome_of_record(own)
        if outcome.duration_s is None:
            outcome.duration_s = job.duration(now) if fallback_duration is None else fallback_duration
        self._conclude(job, outcome)
        return True

    def _conclude(self, job: J, outcome: JobOutcome) -> None:
        job.outcome, job.state = outcome, outcome.status
        self._watched.remove(job)


# ------------------------------------------------------------------------------------------------ from any process

# a registered job's scheduler id found again: the id, "" when the scheduler has none, None when it cannot be asked
FindId = Callable[[JobRecord], Optional[str]]
# a registered job that was submitted: its state now, and its result once it has ended (what else its scheduler says,
# such as its restarts so far, saved in the registry by the callee)
Ask = Callable[[JobRecord, Registry], Tuple[str, Optional[ResultRecord]]]


def refresh_registered(record: JobRecord, registry: Registry, find_id: FindId, ask: Ask) -> JobRecord:
    """A registered job brought up to date: its own result.json wins; one its launcher died submitting is found
    again (``find_id``) or concluded FAILED; else its scheduler is asked (``ask``). Saved when it changed."""
    result = own_result(record)
    if result is None and not record.scheduler_id:
        record = unsubmitted(record, registry, find_id)
        if JobState(record.state).final or not record.scheduler_id:
            return record
    state = record.state
    if result is None:
        state, result = ask(record, registry)
    return save(record, registry, state, result)


def unsubmitted(record: JobRecord, registry: Registry, find_id: FindId) -> JobRecord:
    """A record without a scheduler id: its launcher is submitting it (it holds the job dir's lock), or died before
    it saved the id: after submitting (the scheduler knows the job: ``find_id``) or before (FAILED)."""
    if lock_is_held(Path(record.job_dir)):
        return record
    current = registry.get(record.name)  # read again: the launcher may have saved the id and ended since
    if current is None or current.attempt != record.attempt or current.scheduler_id or JobState(current.state).final:
        return current or record
    found = find_id(current)
    if found is None:
        return current  # the scheduler cannot be asked now: nothing can be concluded
    if found:
        registry.update(current.name, scheduler_id=found)
        current.scheduler_id = found
        return current
    return conclude_orphan(
        current,
        registry,
        f"its launcher (pid {current.supervisor_pid} on "
        f"{current.supervisor_host}) ended before the job was submitted (killed?)",
    )
