"""A scriptable backend for engine tests: each job ends as its script says, with no process started. Defined only in
the tests; it plugs into mmt through mmt.backends.registry, as a third backend would."""

import time
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Tuple

import cloudpickle
from hydra.core.utils import JobReturn, JobStatus
from omegaconf import OmegaConf

from hydra_plugins.mmt_launcher.config import LocalLauncherConf
from mmt.backends.base import Backend, JobHandle, JobSnapshot, Submission, Watcher
from mmt.core.errors import ConfigError, RankFailure
from mmt.core.states import JobState
from mmt.planning.plan import JobPlan, Limits
from mmt.records.outcome import JobOutcome
from mmt.records.registry import JobRecord, Registry


@dataclass
class Script:
    """What the fake backend does with one job: polls before it ends, how it ends, what rank 0 returns."""

    polls: int = 2
    state: JobState = JobState.COMPLETED
    value: Any = None
    failing_rank: int = 1
    refuse_submit: bool = False


@dataclass
class FakeJob(JobHandle):
    submission: Submission
    script: Script
    polls: int = 0
    cancelled: Optional[str] = None
    outcome: Optional[JobOutcome] = None


@dataclass
class FakeSettings:
    scripts: Dict[int, Script] = field(default_factory=dict)
    # a run's own script, by (job number, restart): what a restarted job does on that run
    runs: Dict[Tuple[int, int], Script] = field(default_factory=dict)
    survives_launcher: bool = False


class FakeBackend(Backend[FakeJob], Watcher[FakeJob]):
    """Ends each job as its script says; writes what a job's primary rank would (its JobReturn)."""

    name = "fake"
    stopped: List[str] = []

    def __init__(self, settings: FakeSettings) -> None:
        self.settings = settings
        self.submitted: List[FakeJob] = []

    @classmethod
    def from_config(cls, launcher_cfg: Any) -> "FakeBackend":
        return cls(FakeSettings())

    @classmethod
    def watcher(cls, poll_interval_s: float = 1.0) -> "FakeBackend":
        return cls(FakeSettings())

    @classmethod
    def refresh(cls, record: JobRecord, registry: Registry) -> JobRecord:
        registry.update(record.name, state=JobState.RUNNING.value)
        record.state = JobState.RUNNING.value
        return record

    @classmethod
    def stop(cls, record: JobRecord) -> str:
        cls.stopped.append(record.name)
        return f"{record.name}: stopped by the fake backend"

    @property
    def limits(self) -> Limits:
        return Limits(max_nodes=8, max_devices=8, max_world=64, why="the fake backend's bound")

    def problems(self, plan: JobPlan) -> List[ConfigError]:
        return []

    def describe(self, plan: JobPlan) -> List[str]:
        return ["  backend    fake"]

    def attach(self, record: JobRecord) -> FakeJob:
        raise AssertionError("not used here")

    def submit(self, submission: Submission) -> FakeJob:
        script = self.settings.runs.get((submission.plan.num, submission.restart)) or self.settings.scripts.get(
            submission.plan.num, Script()
        )
        if script.refuse_submit:
            raise RuntimeError(f"the fake scheduler refused job {submission.plan.num}")
        job = FakeJob(submission=submission, script=script)
        self.submitted.append(job)
        return job

    def poll(self, handle: FakeJob) -> JobSnapshot:
        if handle.outcome is None:
            handle.polls += 1
            if handle.cancelled is not None:
                handle.outcome = JobOutcome(JobState.INTERRUPTED, 0.1, detail=handle.cancelled)
            elif handle.polls > handle.script.polls:
                handle.outcome = self._end(handle)
        state = handle.outcome.status if handle.outcome else JobState.RUNNING
        return JobSnapshot(state=state, scheduler_id=f"fake-{handle.plan.num}", outcome=handle.outcome)

    def _end(self, handle: FakeJob) -> JobOutcome:
        script = handle.script
        if script.state == JobState.COMPLETED:
            ret = JobReturn(
                overrides=list(handle.plan.overrides), _return_value=script.value, status=JobStatus.COMPLETED
            )
            handle.attempt.primary_return.write_bytes(cloudpickle.dumps(ret))
            return JobOutcome(JobState.COMPLETED, 1.5)
        failure = None
        if script.state == JobState.FAILED:
            failure = RankFailure(
                rank=script.failing_rank,
                node_rank=0,
                exit_code=3,
                signal=None,
                exception="ValueError: boom",
                traceback=None,
                log="/dev/null",
                whole_node=False,
            )
        return JobOutcome(script.state, 1.5, failure=failure, detail="the fake time limit")

    def cancel(self, handle: FakeJob, reason: str) -> None:
        handle.cancelled = reason

    def wait(self, timeout_s: float) -> None:
        time.sleep(0.001)

    @property
    def survives_launcher(self) -> bool:  # type: ignore[override]
        return self.settings.survives_launcher


def launcher_cfg(**app: Any) -> Any:
    """``hydra.launcher`` as a Hydra app composes it: its per-job fields read the app's top-level keys."""
    root = OmegaConf.create({"num_nodes": 1, "devices": 2, **app})
    root.hydra = {"launcher": OmegaConf.structured(LocalLauncherConf)}
    root.hydra.launcher.summary_metric = "loss"
    return root.hydra.launcher
