"""The interface between the engine and a backend: submit a job, poll it, cancel it, describe it. Never blocking.

The engine's blocking launch is a loop over this interface (``mmt.launching.engine``); detached jobs, the CLI
and the SDK use the same calls from other processes.
"""

import abc
import enum
import time
from dataclasses import dataclass, field
from typing import Any, Dict, List, Mapping, Optional

from mmt.errors import ConfigError, RankFailure
from mmt.jobdir import Attempt
from mmt.planning.plan import JobPlan, Limits


class JobState(str, enum.Enum):
    """Where a job is. The last four are final; ``result.json`` holds one of them."""

    PENDING = "PENDING"  # accepted, not started (waiting for capacity here, or in SLURM's queue)
    RUNNING = "RUNNING"
    STOPPING = "STOPPING"  # asked to stop (a failure, the time limit, an interrupt); its processes are going
    COMPLETED = "COMPLETED"
    FAILED = "FAILED"
    TIMEOUT = "TIMEOUT"
    INTERRUPTED = "INTERRUPTED"

    @property
    def final(self) -> bool:
        return self in FINAL_STATES

    def __str__(self) -> str:
        return self.value


FINAL_STATES = frozenset({JobState.COMPLETED, JobState.FAILED, JobState.TIMEOUT, JobState.INTERRUPTED})


class ProcessState(str, enum.Enum):
    """Where one process of a job is (a rank, or a node's command)."""

    PENDING = "PENDING"
    RUNNING = "RUNNING"
    SUCCEEDED = "SUCCEEDED"
    FAILED = "FAILED"  # exited non-zero or was killed, by itself
    STOPPED = "STOPPED"  # stopped by mmt (a sibling failed, the time limit, an interrupt)

    def __str__(self) -> str:
        return self.value


@dataclass
class JobOutcome:
    """How a job ended, as a backend saw it."""

    status: JobState
    duration_s: Optional[float]
    # FAILED: the first process that failed
    failure: Optional[RankFailure] = None
    # TIMEOUT: which processes were still running; INTERRUPTED: why
    detail: str = ""
    # the scheduler's id (SLURM job id), when there is one
    scheduler_id: Optional[str] = None
    # seconds from the decision to stop the job (failure, time limit, interrupt) until its last process was gone
    stop_latency_s: Optional[float] = None


@dataclass(frozen=True)
class Submission:
    """What a backend needs to start a job: its plan, the attempt dir its payload is in, the copied variables."""

    plan: JobPlan
    attempt: Attempt
    # the values of plan.env_from, read from the launcher's environment (secrets: never printed)
    copied_env: Mapping[str, str] = field(default_factory=dict, repr=False)


@dataclass
class JobStatus:
    state: JobState
    scheduler_id: Optional[str] = None
    # once final
    outcome: Optional[JobOutcome] = None


class JobHandle(abc.ABC):
    """A submitted job, as its backend tracks it."""

    submission: Submission

    @property
    def plan(self) -> JobPlan:
        return self.submission.plan

    @property
    def attempt(self) -> Attempt:
        return self.submission.attempt


class Backend(abc.ABC):
    """Where jobs run. Every method returns promptly; ``wait`` is the only one that may sleep."""

    #: the ``cluster=`` name
    name: str
    #: whether jobs run on when the launcher's process ends (SLURM's do; local ones are its agent's children)
    survives_launcher: bool = False

    @property
    @abc.abstractmethod
    def limits(self) -> Limits:
        """The largest job this backend runs; larger ones are refused while planning."""

    @abc.abstractmethod
    def problems(self, plan: JobPlan) -> List[ConfigError]:
        """Why this backend cannot run ``plan`` (empty when it can): raised before launch, warned in a dry run."""

    @abc.abstractmethod
    def describe(self, plan: JobPlan) -> List[str]:
        """Backend-specific lines of the dry run (the sbatch script ...)."""

    @abc.abstractmethod
    def submit(self, submission: Submission) -> JobHandle:
        """Accept a job; it may start now or wait for capacity."""

    @abc.abstractmethod
    def poll(self, handle: JobHandle) -> JobStatus:
        """The job's state now; with its outcome once final."""

    @abc.abstractmethod
    def cancel(self, handle: JobHandle, reason: str) -> None:
        """Stop the job (INTERRUPTED, ``reason``); its processes go within the kill grace."""

    def warm_up(self) -> None:
        """Get ready to start jobs (the local host agent), while the front end is still composing them."""

    def kill(self, handle: JobHandle) -> None:
        """After ``cancel``: do not wait for the grace (a second Ctrl-C)."""

    def wait(self, timeout_s: float) -> None:
        """Block until something may have changed, at most ``timeout_s``."""
        time.sleep(timeout_s)

    def drain_notices(self) -> List[str]:
        """Lines for the console since the last call (a job submitted, a job requeued)."""
        return []

    def owner_active(self, owner: Dict[str, Any]) -> bool:
        """Whether the launch recorded in a job dir's owner.json still runs, its launcher gone (a SLURM job)."""
        return False

    def close(self) -> None:
        """Release what the backend holds (its agent, its connections)."""
