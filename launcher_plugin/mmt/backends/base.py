"""The interface between the engine and a backend: submit a job, poll it, cancel it, describe it. Never blocking.

* :class:`JobTracker` follows jobs to their end: poll, cancel, kill, wait. The engine's blocking launch is a loop
  over one.
* :class:`Backend` is a tracker that also plans and starts jobs, and answers for the jobs it registered from any
  process (:meth:`Backend.refresh`, :meth:`Backend.stop`).
* :class:`Watcher` is a tracker of jobs another process started (``mmt wait``, the SDK): it attaches to a registry
  record. Each backend names its own (:meth:`Backend.watcher`).

Every backend is reached by its ``cluster=`` name through :mod:`mmt.backends.registry`; nothing outside
``mmt.backends`` compares backend names.
"""

import abc
import time
from dataclasses import dataclass, field
from typing import Any, ClassVar, Generic, Iterator, List, Mapping, Optional, Sequence, Tuple, TypeVar

from omegaconf import DictConfig

from mmt.core.errors import ConfigError, NotCarriedOut
from mmt.core.jobdir import Attempt
from mmt.core.snapshot import CodeSnapshot
from mmt.core.states import JobState
from mmt.planning.plan import JobPlan, Limits
from mmt.records.outcome import JobOutcome
from mmt.records.registry import JobRecord, Registry
from mmt.records.schema import OwnerRecord


@dataclass(frozen=True)
class Dependency:
    """A job another one waits for (``hydra.launcher.after``), as the registry knows it."""

    name: str
    backend: str
    job_dir: str
    attempt: str
    # the scheduler's id (SLURM: ``--dependency=afterok:<id>``), once submitted
    scheduler_id: Optional[str] = None


@dataclass(frozen=True)
class Submission:
    """What a backend needs to start a job: its plan, the attempt dir its payload is in, the copied variables."""

    plan: JobPlan
    attempt: Attempt
    # the values of plan.env_from, read from the launcher's environment (secrets: never printed)
    copied_env: Mapping[str, str] = field(default_factory=dict, repr=False)
    # a restart after a failure: which one (MMT_RESTART_COUNT), and the seconds of the job's time limit the
    # earlier runs used (the limit is the job's, not each run's)
    restart: int = 0
    time_used_s: float = 0.0
    # the jobs it starts after (every one COMPLETED), resolved from plan.after
    after: Tuple[Dependency, ...] = ()


@dataclass
class JobSnapshot:
    """A job's state as one poll saw it (not Hydra's ``JobStatus``, which is one task function's)."""

    state: JobState
    scheduler_id: Optional[str] = None
    # once final
    outcome: Optional[JobOutcome] = None
    # the job's cluster does not answer (its controller: Ray's dashboard, slurmctld): who, since when, and how to
    # check by hand; a stop asked meanwhile cannot be confirmed (the launcher gives up waiting for it, saying so)
    silent: Optional[str] = None


class JobHandle:
    """A submitted job, as its backend tracks it (each backend keeps its own fields in a subclass)."""

    submission: Submission

    @property
    def plan(self) -> JobPlan:
        return self.submission.plan

    @property
    def attempt(self) -> Attempt:
        return self.submission.attempt


H = TypeVar("H", bound=JobHandle)


class JobTracker(abc.ABC, Generic[H]):
    """Follows jobs to their end. Every method returns promptly; ``wait`` is the only one that may sleep."""

    #: the ``cluster=`` name
    name: ClassVar[str]

    @abc.abstractmethod
    def poll(self, handle: H) -> JobSnapshot:
        """The job's state now; with its outcome once final."""

    @abc.abstractmethod
    def cancel(self, handle: H, reason: str) -> None:
        """Stop the job (INTERRUPTED, ``reason``); its processes go within the kill grace."""

    def kill(self, handle: H) -> None:
        """After ``cancel``: do not wait for the grace (a second Ctrl-C)."""

    def wait(self, timeout_s: float) -> None:
        """Block until something may have changed, at most ``timeout_s``."""
        time.sleep(timeout_s)

    def drain_notices(self) -> List[str]:
        """Lines for the console since the last call (a job submitted, a job requeued)."""
        return []

    def close(self) -> None:
        """Release what the tracker holds (an agent, connections)."""


class Watcher(JobTracker[H]):
    """Follows jobs that another process submitted and registered."""

    @abc.abstractmethod
    def attach(self, record: JobRecord) -> H:
        """A handle to the registered job, to poll and cancel from here."""


class Backend(JobTracker[H]):
    """Where jobs run: plans are checked against it, jobs submitted to it."""

    #: whether jobs run on when the launcher's process ends and conclude themselves (SLURM's do, inside their
    #: allocation; local ones are the launcher's agent's children). Such a job's records stay after the launcher
    #: concluded it (its own last step may still read them), and a detached launch needs no supervisor.
    survives_launcher: ClassVar[bool] = False

    #: the validated ``hydra.launcher.*`` settings the backend was built from (picklable: a detached supervisor
    #: rebuilds the backend from them)
    settings: Any

    #: whether a launch can drive it from a machine that shares nothing with its cluster, over SSH to a login node
    #: (mmt.remote, ``hydra.launcher.ssh``); such a backend implements the two methods below, and its spec names
    #: its ``cluster_check``
    runs_over_ssh: ClassVar[bool] = False

    def plan_over_ssh(self) -> None:
        """On the launcher's machine: plans are checked without the cluster's commands, which run on the login node."""
        raise NotImplementedError(f"cluster={self.name} cannot be driven over SSH")

    def settings_there(self, local_sweep_dir: str, remote_sweep_dir: str) -> Any:
        """The settings as the login node's side builds the backend from: paths of the sweep dir moved there."""
        return self.settings

    @abc.abstractmethod
    def __init__(self, settings: Any) -> None:
        """A backend from its validated settings."""

    @classmethod
    @abc.abstractmethod
    def from_config(cls, launcher_cfg: DictConfig) -> "Backend[Any]":
        """A backend from the launch's ``hydra.launcher`` config, each value validated (one line on a bad one)."""

    @classmethod
    @abc.abstractmethod
    def watcher(cls, poll_interval_s: float = 1.0) -> Watcher[Any]:
        """A watcher for this backend's registered jobs, from a process that started none of them."""

    @classmethod
    @abc.abstractmethod
    def refresh(cls, record: JobRecord, registry: Registry) -> JobRecord:
        """A registered job that is not final, its state brought up to date from its job dir and scheduler, saved
        when it changed. A job whose launcher died before it could run is concluded FAILED, saying so."""

    @classmethod
    def refresh_all(cls, records: Sequence[JobRecord], registry: Registry) -> List[JobRecord]:
        """Many registered jobs that are not final, brought up to date as by :meth:`refresh`; a backend may ask its
        scheduler once for all of them (SLURM: one squeue and one sacct)."""
        return [cls.refresh(record, registry) for record in records]

    @classmethod
    @abc.abstractmethod
    def stop(cls, record: JobRecord) -> str:
        """Ask a registered job to stop, from any process; returns what was done, as a line for the user.
        ``NotCarriedOut`` when the stop could not be asked (the cluster does not answer), saying why."""

    @classmethod
    def stop_all(cls, records: Sequence[JobRecord]) -> List[str]:
        """Ask many registered jobs to stop (every job of a launch); a backend may ask its scheduler once for all
        of them (SLURM: one scancel). Returns what was done, as lines for the user; ``NotCarriedOut`` (its
        ``done``: the lines of the stops that were asked) when any could not be asked."""
        done: List[str] = []
        failed: List[str] = []
        for record in records:
            try:
                done.append(cls.stop(record))
            except NotCarriedOut as exc:
                failed.append(str(exc))
        if failed:
            raise NotCarriedOut("; ".join(failed), tuple(done))
        return done

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
    def submit(self, submission: Submission) -> H:
        """Accept a job; it may start now or wait for capacity."""

    def submit_all(self, submissions: Sequence[Submission]) -> Iterator[List[Tuple[Submission, H]]]:
        """Accept the jobs of one launch, in batches: each batch the backend accepted at once, every submission with
        its handle, as soon as it is accepted (so that a launch that fails or is interrupted part-way knows which
        it has to cancel). A backend may group them (SLURM: one job array per group of jobs that share their
        resources); by default one at a time, in order."""
        for submission in submissions:
            yield [(submission, self.submit(submission))]

    #: whether it runs a job with roles (roles.<name>.*, docs/roles.md); one that does not refuses such a job
    #: before anything starts (:func:`roles_problems`)
    runs_roles: ClassVar[bool] = False
    #: whether it runs an elastic job (num_nodes=MIN:MAX, docs/elastic.md); one that does not refuses it before
    #: anything starts (:func:`capability_problems`)
    runs_elastic: ClassVar[bool] = False

    # whether warm_up starts anything (the local host agent): the front end then works out what it may preload
    warms_up: ClassVar[bool] = False

    def warm_up(self, preload: Sequence[str] = (), snapshot: Optional[CodeSnapshot] = None) -> None:
        """Get ready to start jobs (the local host agent), while the front end is still composing them; ``preload``:
        what the jobs will most likely import first (the launch's recipe's preload), to import it meanwhile, from
        the launch's ``snapshot`` of the project."""

    def owner_active(self, owner: OwnerRecord) -> bool:
        """Whether the launch recorded in a job dir's owner.json still runs, its launcher gone (a SLURM job)."""
        return False


def capability_problems(backend: Backend[Any], plan: JobPlan) -> List[ConfigError]:
    """What the job asks that the backend's class says it does not run (roles, an elastic node range), checked for
    every backend before its own ``problems``."""
    found = roles_problems(backend, plan)
    if plan.elastic is not None and not backend.runs_elastic:
        found.append(
            ConfigError(
                "num_nodes",
                plan.elastic.label,
                f"cluster={backend.name} does not run an elastic job yet",
                "run it with a backend that does (local, slurm, ray), or give num_nodes a count (a lost node then "
                "fails or restarts the job)",
            )
        )
    return found


def roles_problems(backend: Backend[Any], plan: JobPlan) -> List[ConfigError]:
    """A job with roles on a backend that does not run them: one line naming the roles and who does."""
    if not plan.roles or backend.runs_roles:
        return []
    return [
        ConfigError(
            "roles",
            ", ".join(role.name for role in plan.roles),
            f"cluster={backend.name} does not run a job with roles yet",
            "run it with cluster=local, or each role as a job of its own",
        )
    ]
