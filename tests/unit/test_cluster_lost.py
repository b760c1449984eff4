"""A cluster that stops answering, without a cluster: the silence and its lines, the record of a stop that was asked
and not taken, the watch loop that obeys a signal whatever the backend says, stops that could not be asked, and the
Ray entrypoint's check that the cluster's python can run mmt's driver (run for real, in this host's interpreters).
With the real Ray and SLURM clusters: tests/e2e/test_ray_lost.py, test_slurm_faults.py."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

import mmt
from helpers.fake_backend import FakeBackend
from mmt.backends.ray import task as ray_task
from mmt.backends.silence import GRACE_KEY, Silence
from mmt.core.errors import NotCarriedOut
from mmt.core.jobdir import Attempt
from mmt.core.states import JobState
from mmt.records.registry import JobRecord
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


# The launch runs in a process of its own: its signal trap needs the main thread (a pytest-xdist worker runs tests
# in another), and keeps its handlers until the process exits (by design). A backend whose cluster takes no stop:
# its jobs never end, and every poll says the cluster is silent.
_SILENT_LAUNCH = """
import json, os, signal, sys, threading, time
from pathlib import Path
from helpers.fake_backend import FakeBackend, FakeSettings, Script
from mmt.backends.base import JobSnapshot
from mmt.core.states import JobState
from mmt.launching import engine
from mmt.launching.console import Console
from mmt.records.registry import Registry
from unit.test_engine import _jobs

class Unanswering(FakeBackend):
    def poll(self, handle):
        return JobSnapshot(state=JobState.STOPPING, scheduler_id="x", silent="the fake cluster does not answer")

sweep, signals = Path(sys.argv[1]), [getattr(signal, name) for name in sys.argv[2:]]
def send():
    for sig in signals:
        time.sleep(0.3)
        os.kill(os.getpid(), sig)
sender = threading.Thread(target=send)
registry = Registry()
began = time.monotonic()
sender.start()
console = Console()
report = engine.launch(_jobs(sweep, 1), Unanswering(FakeSettings(scripts={0: Script(polls=10**9)})),
                       engine.LaunchOptions(sweep_dir=sweep, registry=registry), console)
took = time.monotonic() - began - 0.3 * len(signals)
sender.join()
console.close()  # its last lines written before the figures' line, never into it
record = registry.require(report.unconfirmed[0]) if report.unconfirmed else None
print(json.dumps(dict(interrupted_by=report.interrupted_by, jobs=len(report.jobs), unconfirmed=report.unconfirmed,
                      took=took, detached=record.detached if record else None, state=record.state if record else None)))
"""


def _silent_launch(tmp_path: Path, *signals: str) -> dict:
    tests = Path(__file__).parent.parent
    done = subprocess.run(
        [sys.executable, "-c", _SILENT_LAUNCH, str(tmp_path / "sweep"), *signals],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=tests,
        env={**os.environ, "MMT_HOME": str(tmp_path / "home"), "PYTHONPATH": str(tests)},
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_a_signal_ends_the_launch_within_seconds_though_the_cluster_takes_no_stop(tmp_path: Path) -> None:
    seen = _silent_launch(tmp_path, "SIGTERM")
    assert seen["interrupted_by"] == signal.SIGTERM and seen["jobs"] == 0
    assert seen["unconfirmed"] == [_jobs(tmp_path / "sweep", 1)[0].plan.name]
    assert 2.5 < seen["took"] < 5.0, seen  # the stop is waited for 3 s, then left to `mmt list`
    assert seen["detached"] and not JobState(seen["state"]).final  # not concluded: it was not seen to end


def test_a_second_signal_does_not_wait_for_the_stop_at_all(tmp_path: Path) -> None:
    seen = _silent_launch(tmp_path, "SIGINT", "SIGINT")
    assert seen["interrupted_by"] == signal.SIGINT and len(seen["unconfirmed"]) == 1
    assert seen["took"] < 2.0, seen  # against the 3 s a first signal waits


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


SUPERVISED = """
import sys, time
from mmt.backends.ray.driver import Supervisor
supervisor = Supervisor()
print(supervisor.process is not None, flush=True)
sys.stdin.readline()  # the test kills the parent meanwhile
print(supervisor.went(5.0), flush=True)
"""


def test_the_driver_tells_its_head_going_by_its_supervisor_gone() -> None:
    """A real process chain: a parent whose command line names JobSupervisor (as Ray's actor worker's does), the
    driver's check below it. Alive: not gone within the wait; killed: gone."""
    parent = subprocess.Popen(
        [sys.executable, "-c", "import subprocess, sys; subprocess.run(sys.argv[2:])", "ray::JobSupervisor"]
        + [sys.executable, "-c", SUPERVISED],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)},
    )
    try:
        assert parent.stdout is not None and parent.stdin is not None
        assert parent.stdout.readline().strip() == "True"  # found among its ancestors
        parent.kill()
        parent.wait()
        parent.stdin.write("\n")
        parent.stdin.flush()
        assert parent.stdout.readline().strip() == "True"
    finally:
        parent.kill()


def test_a_supervisor_that_stays_is_not_taken_for_a_head_going() -> None:
    from mmt.backends.ray.driver import Supervisor

    supervisor = Supervisor()
    assert supervisor.process is None and not supervisor.went(0.0)  # pytest's own parents: no Ray job
    supervisor.process = __import__("psutil").Process()  # this process: alive
    started = time.monotonic()
    assert not supervisor.went(0.3) and time.monotonic() - started >= 0.3


def test_an_actor_whose_owner_died_is_the_cluster_going_under_the_driver_not_a_node_failure() -> None:
    from mmt.backends.ray.driver import ClusterGone, Driver, NodeEnd, Placed

    driver = Driver.__new__(Driver)  # only _lost_and_died is used: no Ray here
    said = "The actor died unexpectedly before finishing this task. The actor is dead because its owner has died."
    with pytest.raises(ClusterGone, match="Ray holds this driver dead"):
        driver._lost_and_died(Placed(None, [], node_ids=["a"]), {0: NodeEnd(error=said)})
