"""The engine against a scriptable fake backend: submission, watching, concluding, the registry and the records,
with no process started. The fake backend is defined here only, and plugs in through mmt.backends.registry, as a
third backend would."""

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, List, Optional

import cloudpickle
import pytest
from hydra.core.utils import JobReturn, JobStatus
from omegaconf import OmegaConf

from hydra_plugins.mmt_launcher.config import LocalLauncherConf
from mmt.backends import registry as backends
from mmt.backends.base import Backend, JobHandle, JobSnapshot, Submission, Watcher
from mmt.core.errors import ConfigError, RankFailure, UsageError
from mmt.core.jobdir import JobDir, SweepDir, read_json
from mmt.core.states import JobState
from mmt.launching import engine, prepare
from mmt.launching.console import Console
from mmt.planning.plan import JobPlan, Limits, plan_job
from mmt.records.outcome import JobOutcome
from mmt.records.payload import JobPayload
from mmt.records.registry import JobRecord, Registry
from mmt.service import status


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
        script = self.settings.scripts.get(submission.plan.num, Script())
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
            ret = JobReturn(overrides=list(handle.plan.overrides), _return_value=script.value,
                            status=JobStatus.COMPLETED)
            handle.attempt.primary_return.write_bytes(cloudpickle.dumps(ret))
            return JobOutcome(JobState.COMPLETED, 1.5)
        failure = None
        if script.state == JobState.FAILED:
            failure = RankFailure(rank=script.failing_rank, node_rank=0, exit_code=3, signal=None,
                                  exception="ValueError: boom", traceback=None, log="/dev/null", whole_node=False)
        return JobOutcome(script.state, 1.5, failure=failure, detail="the fake time limit")

    def cancel(self, handle: FakeJob, reason: str) -> None:
        handle.cancelled = reason

    def wait(self, timeout_s: float) -> None:
        time.sleep(0.001)

    @property
    def survives_launcher(self) -> bool:  # type: ignore[override]
        return self.settings.survives_launcher


@pytest.fixture
def registry(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Registry:
    monkeypatch.setenv("MMT_HOME", str(tmp_path / "home"))
    return Registry()


@pytest.fixture
def fake_registered() -> Any:
    backends.register("fake", f"{__name__}:FakeBackend")
    yield
    backends.BACKENDS.pop("fake", None)


def _launcher_cfg(**app: Any) -> Any:
    """``hydra.launcher`` as a Hydra app composes it: its per-job fields read the app's top-level keys."""
    root = OmegaConf.create({"num_nodes": 1, "devices": 2, **app})
    root.hydra = {"launcher": OmegaConf.structured(LocalLauncherConf)}
    root.hydra.launcher.summary_metric = "loss"
    return root.hydra.launcher


def _plan(sweep: Path, num: int) -> JobPlan:
    return plan_job(_launcher_cfg(), num=num, name=f"fake-job-{num}-{sweep.name}", job_id=f"fake-{num}", overrides=[f"x={num}"],
                    job_dir=str(sweep / str(num)), limits=Limits(8, 8, 64, "test"), launcher_env={})


def _jobs(sweep: Path, count: int) -> List[engine.PreparedJob]:
    return [engine.PreparedJob(JobPayload(plan=_plan(sweep, num), callbacks=None, task_function=None, config=None,
                                          singleton_state=None)) for num in range(count)]


def _launch(sweep: Path, jobs: List[engine.PreparedJob], backend: FakeBackend,
            registry: Optional[Registry]) -> engine.LaunchReport:
    console = Console()
    try:
        return engine.launch(jobs, backend, engine.LaunchOptions(sweep_dir=sweep, registry=registry), console)
    finally:
        console.close()


def test_every_job_is_concluded_recorded_and_summarised(tmp_path: Path, registry: Registry) -> None:
    scripts = {0: Script(value={"loss": 0.5}), 1: Script(polls=5, value={"loss": 0.25}),
               2: Script(state=JobState.FAILED, failing_rank=1), 3: Script(state=JobState.TIMEOUT)}
    backend = FakeBackend(FakeSettings(scripts=scripts))
    report = _launch(tmp_path, _jobs(tmp_path, 4), backend, registry)

    states = {job.plan.num: job.outcome.status for job in report.jobs}
    assert states == {0: JobState.COMPLETED, 1: JobState.COMPLETED, 2: JobState.FAILED, 3: JobState.TIMEOUT}
    for num, state in states.items():
        result = read_json(JobDir(tmp_path / str(num)).result)
        assert result is not None and result["status"] == state.value and result["job"] == num
        assert registry.require(f"fake-job-{num}-{tmp_path.name}").state == state.value
        assert not JobDir(tmp_path / str(num)).attempt(result["attempt"]).dir.exists()  # local: the attempt goes
    assert read_json(JobDir(tmp_path / "1").result)["return_value"] == {"loss": 0.25}
    failed = read_json(JobDir(tmp_path / "2").result)
    assert failed["failure"]["rank"] == 1 and "ValueError: boom" in failed["error"]
    csv = SweepDir(tmp_path).summary_csv.read_text()
    assert csv.count("\n") == 5 and "0.25" in csv and "TIMEOUT" in csv


def test_a_completed_job_without_rank_zeros_result_fails(tmp_path: Path, registry: Registry) -> None:
    backend = FakeBackend(FakeSettings(scripts={0: Script()}))
    backend._end = lambda handle: JobOutcome(JobState.COMPLETED, 1.0)  # type: ignore[method-assign]
    report = _launch(tmp_path, _jobs(tmp_path, 1), backend, registry)
    assert report.jobs[0].outcome.status == JobState.FAILED
    assert report.jobs[0].outcome.failure is not None and report.jobs[0].outcome.failure.missing_result


def test_a_taken_name_is_refused_before_anything_is_submitted(tmp_path: Path, registry: Registry) -> None:
    jobs = _jobs(tmp_path, 2)
    backend = FakeBackend(FakeSettings())
    _launch(tmp_path / "first", _jobs(tmp_path, 2)[1:], FakeBackend(FakeSettings()), registry)  # registers job 1's name
    with pytest.raises(UsageError, match="already holds a job named"):
        _launch(tmp_path, jobs, backend, registry)
    assert backend.submitted == []
    assert not (tmp_path / "0").exists() or not any((tmp_path / "0").rglob("job.pkl"))


def test_a_submission_that_fails_cancels_the_submitted_and_leaves_nothing_of_the_rest(
        tmp_path: Path, registry: Registry) -> None:
    backend = FakeBackend(FakeSettings(scripts={1: Script(refuse_submit=True)}))
    with pytest.raises(RuntimeError, match="refused job 1"):
        _launch(tmp_path, _jobs(tmp_path, 3), backend, registry)
    assert [job.plan.num for job in backend.submitted] == [0]
    assert backend.submitted[0].cancelled == "the launch failed"
    names = {record.name for record in registry.list()}
    assert f"fake-job-1-{tmp_path.name}" not in names and f"fake-job-2-{tmp_path.name}" not in names
    assert not list((tmp_path / "2").rglob("job.pkl"))


def test_records_stay_where_jobs_outlive_the_launcher(tmp_path: Path, registry: Registry) -> None:
    backend = FakeBackend(FakeSettings(scripts={0: Script(value=1.0)}, survives_launcher=True))
    report = _launch(tmp_path, _jobs(tmp_path, 1), backend, registry)
    attempt = report.jobs[0].attempt
    assert attempt.dir.exists() and attempt.concluded.exists()  # its own last step may still read them
    assert not list(attempt.dir.glob("job.pkl"))  # the pickled payload (code, secrets) goes all the same
    assert read_json(JobDir(tmp_path / "0").owner) is not None


def test_a_backend_defined_outside_mmt_plugs_in_through_the_registry(
        tmp_path: Path, registry: Registry, fake_registered: Any) -> None:
    assert "fake" in backends.names() and backends.backend_class("fake") is FakeBackend
    cfg = _launcher_cfg()
    cfg.backend = "fake"
    backend = prepare.make_backend(cfg)
    assert isinstance(backend, FakeBackend)
    report = _launch(tmp_path, _jobs(tmp_path, 1), FakeBackend(FakeSettings(scripts={0: Script(value=2)})), registry)
    record = registry.require(report.jobs[0].plan.name)
    assert record.backend == "fake" and record.state == JobState.COMPLETED.value
    registry.update(record.name, state=JobState.PENDING.value)
    assert status.refresh(registry.require(record.name), registry).state == JobState.RUNNING.value
    assert status.stop(registry.require(record.name)).endswith("stopped by the fake backend")
    assert FakeBackend.stopped[-1] == record.name


def test_an_unknown_backend_name_is_one_line(tmp_path: Path) -> None:
    cfg = _launcher_cfg()
    cfg.backend = "kubernetes"
    with pytest.raises(ConfigError) as error:
        prepare.make_backend(cfg)
    assert "hydra.launcher.backend" in str(error.value) and "local, slurm" in str(error.value)
