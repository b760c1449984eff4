"""What the stages of a launch hand each other and the front ends: typed records, no behaviour.

``PreparedJob`` goes in (a planned job and what its processes receive); ``Submitted`` (a detached start) or a
``LaunchReport`` of ``JobReport``s (an attached one) comes out. ``Watched`` is one job while the engine watches it:
the submit stage makes it, the watch, restart and conclude stages update it.
"""

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence

from mmt.backends.base import JobHandle
from mmt.core.jobdir import Attempt
from mmt.core.states import ConsoleMode
from mmt.launching.console import LogFollower
from mmt.planning.plan import JobPlan
from mmt.records.outcome import JobOutcome
from mmt.records.ownership import Claim
from mmt.records.payload import JobPayload
from mmt.records.registry import Registry
from mmt.records.schema import EarlierRun, ResultRecord


@dataclass
class PreparedJob:
    """A planned job and what its processes receive."""

    payload: JobPayload
    # the values of plan.env_from, read from the launcher's environment
    copied_env: Dict[str, str] = field(default_factory=dict, repr=False)

    @property
    def plan(self) -> JobPlan:
        return self.payload.plan


@dataclass(frozen=True)
class LaunchOptions:
    sweep_dir: Path
    console: ConsoleMode = ConsoleMode.rank0  # whose output is followed live
    # a job left running when the launcher's terminal goes (SIGHUP) keeps running; the registry says so
    registry: Optional[Registry] = None


@dataclass
class JobReport:
    """How one job ended, as reported to the front end."""

    plan: JobPlan
    outcome: JobOutcome
    attempt: Attempt
    # its result.json
    record: ResultRecord
    # the primary process's JobReturn (Hydra's), when it reported one
    primary: Any = None
    # why result.json could not be written, when it could not
    write_error: Optional[str] = None


@dataclass
class LaunchReport:
    jobs: List[JobReport]
    # the signal that interrupted the launch, if one did
    interrupted_by: Optional[int] = None
    # jobs left running on purpose (SIGHUP on SLURM, Ctrl-C while re-attached): names, for `mmt wait`
    detached: List[str] = field(default_factory=list)
    # jobs never submitted: the launch was interrupted while it submitted them (job numbers)
    unsubmitted: List[int] = field(default_factory=list)
    # jobs asked to stop whose cluster did not answer: the stop is recorded, not confirmed; they may still run
    unconfirmed: List[str] = field(default_factory=list)


@dataclass
class Submitted:
    """A job a backend accepted, as the front end sees it."""

    plan: JobPlan
    attempt: Attempt
    backend: str
    scheduler_id: Optional[str] = None


@dataclass(frozen=True)
class NotStarted:
    """A job of the batch that was refused (an invalid trial a sweeper proposed): a row of the summary too."""

    num: int
    overrides: Sequence[str]
    reason: str


@dataclass
class Watched:
    """One job while the engine watches it, from its submission to its report."""

    plan: JobPlan
    handle: JobHandle
    claim: Optional[Claim]
    # when it was submitted, then when it was first seen running
    started_at: float
    # its backend's jobs outlive the launcher: their records stay after concluding (see Backend.survives_launcher)
    survives_launcher: bool = False
    followers: List[LogFollower] = field(default_factory=list)
    running_seen: bool = False
    report: Optional[JobReport] = None
    # restarts (plan.max_restarts; only for jobs this process supervises): the values its processes need again, the
    # runs that failed so far, and the failed run's outcome while the back-off runs
    copied_env: Dict[str, str] = field(default_factory=dict, repr=False)
    earlier_runs: List[EarlierRun] = field(default_factory=list)
    run_started_at: float = 0.0
    restart_at: Optional[float] = None
    failed_run: Optional[JobOutcome] = None
    # asked to stop while its cluster did not answer: what the backend said of the silence; the launcher gave up
    unconfirmed: Optional[str] = None
