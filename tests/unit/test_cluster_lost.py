"""A cluster that stops answering, without a cluster: the silence and its lines, the record of a stop that was asked
and not taken, the watch loop that obeys a signal whatever the backend says, stops that could not be asked, and the
Ray entrypoint's check that the cluster's python can run mmt's driver (run for real, in this host's interpreters).
With the real Ray and SLURM clusters: tests/e2e/test_ray_lost.py, test_slurm_faults.py."""

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any, List

import pytest

import mmt
from helpers.fake_backend import FakeBackend, FakeJob, FakeSettings, Script
from mmt.backends.base import JobSnapshot
from mmt.backends.ray import task as ray_task
from mmt.backends.silence import GRACE_KEY, Silence
from mmt.core.errors import NotCarriedOut
from mmt.core.jobdir import Attempt
from mmt.core.states import JobState
from mmt.launching import engine
from mmt.launching.console import Console
from mmt.records.registry import JobRecord, Registry
from mmt.records.scheduler import SchedulerRecord, read_scheduler, write_scheduler
from unit.test_engine import _jobs

# ------------------------------------------------------------------------------------------------ the silence


def test_a_silence_is_over_once_the_grace_has_run_out_and_its_lines_say_who_since_and_what_to_do() -> None:
    since = time.time() - 30
    silence = Silence("the Ray dashboard at http://h:8265", since, "[Errno 111] Connection refused")
    assert silence.over(20) and not silence.over(60)
    waiting = silence.waiting(60, jobs=2)
    assert waiting.startswith("mmt: the Ray dashboard at http://h:8265 does not answer since ")
    assert f"within 30 s ({GRACE_KEY}=60)" in waiting and "2 job(s)" in waiting
    lost = silence.lost(20, "its ranks may run on", "`ray status`")
    assert lost.startswith("lost with its cluster: the Ray dashboard at http://h:8265 has not answered since ")
    assert f"longer than {GRACE_KEY}=20; its ranks may run on. HINT: check with `ray status`" in lost
    assert time.strftime("%H:%M:%S", time.localtime(since)) in lost  # to the second
    back = silence.came_back_without("`ray status`")
    assert "answered again at" in back and "without the job" in back and "longer than" not in back


# ------------------------------------------------------------------------------------------------ scheduler.json


def test_a_stop_the_scheduler_did_not_take_is_recorded_as_unconfirmed_until_it_does(tmp_path: Path) -> None:
    attempt = Attempt(tmp_path / "a").create()
    view = SchedulerRecord(scheduler_id="j", state="RUNNING").unanswered("the Ray dashboard")
    asked = SchedulerRecord(**{**view.__dict__, "stopped_because": "the launcher received SIGTERM"})
    write_scheduler(attempt, asked, None)
    read = read_scheduler(attempt)
    assert read is not None and read.stop_unconfirmed
    assert "its stop not confirmed" in (read.note() or "") and "not confirmed yet" in (read.describe() or "")
    sent = read.stop_sent(now=123.0)
    assert not sent.stop_unconfirmed and sent.stop_sent(now=456.0).stop_sent_at == 123.0  # the first time kept
    write_scheduler(attempt, sent.answered(), read)
    again = read_scheduler(attempt)
    assert again is not None and again.stop_sent_at == 123.0 and again.unreachable_since is None


# ------------------------------------------------------------------------------------------------ the watch loop


class _Unanswering(FakeBackend):
    """A backend whose cluster takes no stop: its jobs never end, and every poll says the cluster is silent."""

    def poll(self, handle: FakeJob) -> JobSnapshot:
        return JobSnapshot(state=JobState.STOPPING, scheduler_id="x", silent="the fake cluster does not answer")


@pytest.fixture
def own_signals() -> Any:
    """The launch's signal trap keeps its handlers for the rest of the process (by design): put pytest's back."""
    saved = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)}
    yield
    for sig, handler in saved.items():
        signal.signal(sig, handler)


def _launch_then(signals: List[int], tmp_path: Path, registry: Registry) -> "tuple[engine.LaunchReport, float]":
    def send() -> None:
        for sig in signals:
            time.sleep(0.3)
            os.kill(os.getpid(), sig)

    backend = _Unanswering(FakeSettings(scripts={0: Script(polls=10**9)}))
    sender = threading.Thread(target=send)
    console = Console()
    began = time.monotonic()
    sender.start()
    try:
        report = engine.launch(
            _jobs(tmp_path, 1), backend, engine.LaunchOptions(sweep_dir=tmp_path, registry=registry), console
        )
    finally:
        console.close()
        sender.join()
    return report, time.monotonic() - began - 0.3 * len(signals)


def test_a_signal_ends_the_launch_within_seconds_though_the_cluster_takes_no_stop(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, own_signals: Any
) -> None:
    monkeypatch.setenv("MMT_HOME", str(tmp_path / "home"))
    registry = Registry()
    report, took = _launch_then([signal.SIGTERM], tmp_path, registry)
    assert report.interrupted_by == signal.SIGTERM and report.jobs == []
    assert report.unconfirmed == [_jobs(tmp_path, 1)[0].plan.name]
    assert 2.5 < took < 5.0  # the stop is waited for 3 s, then left to `mmt list`
    record = registry.require(report.unconfirmed[0])
    assert record.detached and not JobState(record.state).final  # not concluded: it was not seen to end


def test_a_second_signal_does_not_wait_for_the_stop_at_all(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, own_signals: Any
) -> None:
    monkeypatch.setenv("MMT_HOME", str(tmp_path / "home"))
    report, took = _launch_then([signal.SIGINT, signal.SIGINT], tmp_path, Registry())
    assert report.interrupted_by == signal.SIGINT and len(report.unconfirmed) == 1
    assert took < 1.0


# ------------------------------------------------------------------------------------------------ stops


class _StopsSome(FakeBackend):
    @classmethod
    def stop(cls, record: JobRecord) -> str:
        if record.name.endswith("b"):
            raise NotCarriedOut(f"{record.name}: the cluster did not take the stop")
        return f"{record.name}: stopped"


def test_stopping_many_jobs_says_what_was_stopped_and_fails_for_those_that_were_not() -> None:
    records = [
        JobRecord(
            name=name, job_id=name, backend="fake", job_dir="/x", sweep_dir="/", attempt="1", num_nodes=1, devices=1,
            machine="cpu", command=None, command_mode="per_rank", overrides=[], state="RUNNING",
        )
        for name in ("a", "b", "c")
    ]  # fmt: skip
    with pytest.raises(NotCarriedOut) as raised:
        _StopsSome.stop_all(records)
    assert raised.value.done == ("a: stopped", "c: stopped")
    assert str(raised.value) == "b: the cluster did not take the stop"


# ------------------------------------------------------------------------------------------------ the Ray entrypoint


def _check(python: str, version: str, minor: str, **env: str) -> subprocess.CompletedProcess:
    """The entrypoint's check, run by ``python`` as Ray runs it (``python -u -c <check> <task> <mmt> <Python>``)."""
    script = ray_task._BOOTSTRAP
    return subprocess.run(
        [python, "-u", "-c", script, "/nonexistent/task.pkl", version, minor],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, **env},
        cwd="/",
    )


MINOR = "%d.%d" % sys.version_info[:2]


def test_the_entrypoint_names_a_python_without_mmt() -> None:
    bare = sys._base_executable  # type: ignore[attr-defined]  # the interpreter this venv was made from
    done = _check(bare, mmt.__version__, MINOR, PYTHONPATH="")
    assert done.returncode == ray_task.DRIVER_CANNOT_RUN, done
    found = ray_task.cannot_run(done.stdout)
    assert found is not None and found.python == bare and found.why.startswith("it has no mmt")
    line = found.line("http://h:8265")
    assert f"found `python` = {bare} (Python {sys.version.split()[0]})" in line
    assert "HINT:" in line and "runtime_env.pip" in line and "\n" not in line


@pytest.mark.parametrize(
    "version, minor, why",
    [
        ("0.0.1", MINOR, f"its mmt is {mmt.__version__}, the launcher's is 0.0.1"),
        (mmt.__version__, "3.9", f"it is Python {MINOR}, the launcher's is 3.9"),
    ],
)
def test_the_entrypoint_names_another_mmt_or_python_version(version: str, minor: str, why: str) -> None:
    done = _check(sys.executable, version, minor)
    assert done.returncode == ray_task.DRIVER_CANNOT_RUN, done
    found = ray_task.cannot_run(done.stdout)
    assert found is not None and found.why == why and found.python == sys.executable


def test_the_entrypoint_runs_the_driver_when_it_can() -> None:
    done = _check(sys.executable, mmt.__version__, MINOR)
    # the driver itself ran: it could not read the task file (no marker, not the check's exit code)
    assert done.returncode not in (0, ray_task.DRIVER_CANNOT_RUN), done
    assert "mmt/backends/ray/driver.py" in done.stderr and "No such file or directory: '/nonexistent'" in done.stderr
    assert ray_task.cannot_run(done.stdout + done.stderr) is None


def test_a_log_without_the_mark_or_with_a_damaged_one_is_not_read_as_one() -> None:
    assert ray_task.cannot_run("Traceback ...\nValueError: boom") is None
    assert ray_task.cannot_run(f"{ray_task.CANNOT_RUN_MARK} {{not json") is None
