"""The engine against a scriptable fake backend (tests/helpers/fake_backend.py): submission, watching, concluding,
the registry and the records, with no process started."""

from pathlib import Path
from typing import Any, List, Optional

import pytest

from helpers.fake_backend import FakeBackend, FakeSettings, Script, launcher_cfg
from mmt.backends import registry as backends
from mmt.core.errors import ConfigError, UsageError
from mmt.core.jobdir import JobDir, SweepDir, read_json
from mmt.core.states import JobState
from mmt.launching import engine, prepare
from mmt.launching.console import Console
from mmt.planning.plan import JobPlan, Limits, plan_job
from mmt.records.outcome import JobOutcome
from mmt.records.payload import JobPayload
from mmt.records.registry import Registry
from mmt.service import status


@pytest.fixture
def registry(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Registry:
    monkeypatch.setenv("MMT_HOME", str(tmp_path / "home"))
    return Registry()


@pytest.fixture
def fake_registered() -> Any:
    backends.register("fake", "helpers.fake_backend:FakeBackend")
    yield
    backends.BACKENDS.pop("fake", None)


def _plan(sweep: Path, num: int) -> JobPlan:
    return plan_job(
        launcher_cfg(),
        num=num,
        name=f"fake-job-{num}-{sweep.name}",
        job_id=f"fake-{num}",
        overrides=[f"x={num}"],
        job_dir=str(sweep / str(num)),
        limits=Limits(8, 8, 64, "test"),
        launcher_env={},
    )


def _jobs(sweep: Path, count: int) -> List[engine.PreparedJob]:
    return [
        engine.PreparedJob(
            JobPayload(plan=_plan(sweep, num), callbacks=None, task_function=None, config=None, singleton_state=None)
        )
        for num in range(count)
    ]


def _launch(
    sweep: Path, jobs: List[engine.PreparedJob], backend: FakeBackend, registry: Optional[Registry]
) -> engine.LaunchReport:
    console = Console()
    try:
        return engine.launch(jobs, backend, engine.LaunchOptions(sweep_dir=sweep, registry=registry), console)
    finally:
        console.close()


def test_every_job_is_concluded_recorded_and_summarised(tmp_path: Path, registry: Registry) -> None:
    scripts = {
        0: Script(value={"loss": 0.5}),
        1: Script(polls=5, value={"loss": 0.25}),
        2: Script(state=JobState.FAILED, failing_rank=1),
        3: Script(state=JobState.TIMEOUT),
    }
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
    tmp_path: Path, registry: Registry
) -> None:
    backend = FakeBackend(FakeSettings(scripts={1: Script(refuse_submit=True)}))
    with pytest.raises(RuntimeError, match="refused job 1"):
        _launch(tmp_path, _jobs(tmp_path, 3), backend, registry)
    assert [job.plan.num for job in backend.submitted] == [0]
    assert backend.submitted[0].cancelled == "the launch failed: the fake scheduler refused job 1"  # saying why
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
    tmp_path: Path, registry: Registry, fake_registered: Any
) -> None:
    assert "fake" in backends.names() and backends.backend_class("fake") is FakeBackend
    cfg = launcher_cfg()
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
    cfg = launcher_cfg()
    cfg.backend = "kubernetes"
    with pytest.raises(ConfigError) as error:
        prepare.make_backend(cfg)
    assert "hydra.launcher.backend" in str(error.value) and "local, ray, slurm" in str(error.value)
