"""Liveness with real launches: every detach path under a group-writable umask, a job that deletes its own dir while
it runs (still running, still stoppable), a SIGKILLed supervisor (FAILED in the registry, in its job dir and on the
live page), two launches racing into one sweep dir (the loser refused before it writes anything), a planted log
symlink, and a process that drops its tag and leaves the session. Every test runs under the ``tag`` fixture: no
process it started may be left. (Without processes: tests/unit/test_liveness.py.)"""

import json
import os
import signal
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest

from helpers.app import app_command, app_env, results, run_app
from helpers.dashboard import client_for, job_id
from helpers.paths import REPO
from helpers.processes import tagged_pids, wait_gone, wait_until
from helpers.service import registered

PY = sys.executable
MMT = str(Path(sys.executable).with_name("mmt"))


def mmt(*args: str, cwd: Path, tag=None, timeout: float = 120, umask=None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [MMT, *args],
        cwd=cwd,
        env=app_env(tag),
        capture_output=True,
        text=True,
        timeout=timeout,
        preexec_fn=None if umask is None else (lambda: os.umask(umask)),
    )


def _status(cwd: Path, name: str) -> dict:
    done = mmt("list", "--json", cwd=cwd)
    assert done.returncode == 0, done.stderr
    return {row["name"]: row for row in json.loads(done.stdout)}.get(name, {})


def _wait_status(cwd: Path, name: str, status: str, timeout_s: float = 60) -> dict:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        row = _status(cwd, name)
        if row.get("status") == status:
            return row
        time.sleep(0.3)
    pytest.fail(f"{name} never reached {status}: {_status(cwd, name)}")


def _commands(tag: str, needle: str) -> list:
    found = []
    for pid in tagged_pids(tag):
        try:
            if needle in Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode():
                found.append(pid)
        except OSError:
            pass
    return found


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.lstat().st_mode)


# ------------------------------------------------------------------------ 2. every detach path, under any umask


def _detach(path: str, name: str, tmp_path: Path, tag: str, umask: int) -> Path:
    """Launch ``sleep 3`` detached through ``path`` under ``umask``; returns its job dir once the launcher returned."""
    if path == "cli":
        command, cwd, job_dir = (
            [MMT, "run", "--name", name, "--detach", "--command", "sleep 3"],
            tmp_path,
            tmp_path / "outputs" / "mmt" / name / "0",
        )
    elif path == "sdk":
        command, cwd, job_dir = (
            [PY, "-c", f"from mmt import Job\nJob.run(command='sleep 3', name={name!r})"],
            tmp_path,
            tmp_path / "outputs" / "mmt" / name / "0",
        )
    else:  # hydra.launcher.detach=true; the job's name gets its number
        command = app_command(
            "hydra.launcher.detach=true",
            "command='sleep 3'",
            f"hydra.launcher.name={name[:-2]}",
            sweep_dir=tmp_path / "sweep",
        )
        cwd, job_dir = REPO, tmp_path / "sweep" / "0"
    done = subprocess.run(
        command,
        cwd=cwd,
        env=app_env(tag),
        capture_output=True,
        text=True,
        timeout=120,
        preexec_fn=lambda: os.umask(umask),
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    return job_dir


@pytest.mark.parametrize(
    "path, umask",
    [("cli", 0o002), ("sdk", 0o002), ("hydra", 0o002), ("cli", 0o000)],
    ids=["mmt-run-002", "job-run-002", "hydra-detach-002", "mmt-run-000"],
)
def test_every_detach_path_runs_under_a_umask_that_makes_the_sweep_dir_writable_by_others(path, umask, tmp_path, tag):
    name = f"umask-{path}-{tag[:6]}-0"
    job_dir = _detach(path, name, tmp_path, tag, umask)
    sweep = job_dir.parent
    assert _mode(sweep) == 0o777 & ~umask  # the user's umask made it, and it is not what guards the pickles
    # while the job runs, its pickles lie in private dirs only (the payload stays until the job is concluded)
    [attempt] = wait_until(lambda: list((job_dir / ".mmt" / "attempts").glob("*/job.pkl")), 10, "the payload")
    attempt = attempt.parent
    for private in (job_dir / ".mmt", attempt.parent, attempt):
        assert _mode(private) == 0o700, private
    for pickled in ("plan.pkl", "job.pkl", "job.json"):
        assert _mode(attempt / pickled) == 0o600, pickled
    assert not list(sweep.glob(".mmt/supervisor-*.pkl"))  # the jobs handed over: read by the supervisor, removed
    waited = mmt("wait", name, cwd=tmp_path, timeout=90)
    assert waited.returncode == 0 and "COMPLETED" in waited.stdout, waited.stdout + waited.stderr
    log = "".join(p.read_text() for p in sweep.glob("supervisor-*.log"))
    assert "UnsafePayloadError" not in log and "Traceback" not in log, log
    assert json.loads((job_dir / "result.json").read_text())["status"] == "COMPLETED"
    assert wait_gone(tag) == []


# --------------------------------------------------------------------- 3. a job that deletes its own dir


def test_a_job_that_deletes_its_own_dir_runs_on_and_can_still_be_stopped(tmp_path, tag):
    name = f"self-deleting-{tag[:6]}"
    # rank 0 deletes the dir once every rank runs its command (before, a rank still starting would need its payload)
    ready = tmp_path / "ready"
    ready.mkdir()
    command = (
        f'touch {ready}/$RANK; if [ "$RANK" = 0 ]; then while [ "$(ls {ready} | wc -l)" -lt 4 ]; do sleep 0.1; '
        'done; rm -rf "$MMT_JOB_DIR"; fi; sleep 120'
    )
    started = mmt(
        "run",
        "--name",
        name,
        "--num-machines",
        "2",
        "--devices",
        "2",
        "--command-mode",
        "per_rank",
        "--detach",
        "--command",
        command,
        cwd=tmp_path,
        tag=tag,
    )
    assert started.returncode == 0, started.stderr[-3000:]
    job_dir = tmp_path / "outputs" / "mmt" / name / "0"
    # its 4 ranks (each a shell and its sleep) run on, their job dir gone: lock, owner.json, attempt dir and all
    wait_until(lambda: len(_commands(tag, "sleep 120")) >= 8 and not job_dir.exists(), 60, "4 ranks, their dir gone")
    for _ in range(5):  # not once by luck
        row = _status(tmp_path, name)
        assert (row["status"], row["state"]) == ("Running", "RUNNING"), row
        time.sleep(0.4)
    stopped = mmt("stop", name, cwd=tmp_path)
    assert "asked its supervisor" in stopped.stdout and "already ended" not in stopped.stdout, stopped.stdout
    row = _wait_status(tmp_path, name, "Stopped", timeout_s=30)
    assert row["state"] == "INTERRUPTED"
    assert wait_gone(tag) == []  # its 8 processes and its supervisor
    # what users read is written again: how it ended
    assert json.loads((job_dir / "result.json").read_text())["status"] == "INTERRUPTED"


# --------------------------------------------------------------------- 8. a SIGKILLed supervisor


def test_a_killed_supervisors_job_is_failed_in_its_job_dir_and_on_the_live_page(tmp_path, tag):
    name = f"orphaned-{tag[:6]}"
    started = mmt(
        "run", "--name", name, "--num-machines", "2", "--detach", "--command", "sleep 120", cwd=tmp_path, tag=tag
    )
    assert started.returncode == 0, started.stderr[-3000:]
    root = tmp_path / "outputs" / "mmt" / name / "0"
    _wait_status(tmp_path, name, "Running")
    wait_until(lambda: len(_commands(tag, "sleep 120")) >= 2, 30, "both nodes' commands")
    os.kill(registered(name)[name]["supervisor_pid"], signal.SIGKILL)  # the OOM killer, kill -9
    assert wait_gone(tag) == []  # its agent saw it go and took every rank with it
    page = client_for(root.parent)
    assert page.get(f"/api/jobs/{job_id(root)}").json()["status"] == "RUNNING"  # nothing has concluded it yet
    row = _status(tmp_path, name)  # mmt list concludes it
    assert (row["status"], row["state"]) == ("Failed", "FAILED"), row
    result = json.loads((root / "result.json").read_text())
    assert result["status"] == "FAILED" and result["attempt"] == registered(name)[name]["attempt"]
    assert "ended without concluding it (killed?)" in result["error"]
    shown = page.get(f"/api/jobs/{job_id(root)}").json()
    assert shown["status"] == "FAILED" and "ended without concluding it" in shown["error"]


def test_a_supervisor_killed_10_s_in_ends_its_job_at_its_last_sign_of_life_not_when_found(tmp_path, tag):
    """The duration of a job whose supervisor died ends at its last beat (every 2 s), however late `mmt list`
    notices: not 10 s in + the 20 s until it looked."""
    name = f"beat-{tag[:6]}"
    started = mmt("run", "--name", name, "--detach", "--command", "sleep 120", cwd=tmp_path, tag=tag)
    assert started.returncode == 0, started.stderr[-3000:]
    _wait_status(tmp_path, name, "Running")
    running_at = registered(name)[name]["started_at"]
    time.sleep(max(0.0, running_at + 10 - time.time()))
    os.kill(registered(name)[name]["supervisor_pid"], signal.SIGKILL)
    assert wait_gone(tag) == []
    time.sleep(20)  # noticed long after
    row = _status(tmp_path, name)
    assert row["status"] == "Failed", row
    assert 8 <= row["duration_s"] < 15, row


# --------------------------------------------------------------------- 12. two launches into one sweep dir at once


# The app run until its launcher's launch() (argv: <ready file> <go file> <app> <overrides ...>): there it says it
# is ready (past setup(), the sweeper has written multirun.yaml) and waits until told to go on.
PAUSED_AT_LAUNCH = """
import os, runpy, sys, time
from pathlib import Path
from hydra_plugins.mmt_launcher import _core  # Hydra's plugin scan loads the launcher class anew, never _core

ready, go = Path(sys.argv[1]), Path(sys.argv[2])
launch = _core.launch

def launch_when_told(launcher, job_overrides, initial_job_idx):
    ready.touch()
    deadline = time.monotonic() + 90
    while not go.exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    return launch(launcher, job_overrides, initial_job_idx)

_core.launch = launch_when_told
sys.argv = sys.argv[3:]
sys.path[0] = os.path.dirname(os.path.abspath(sys.argv[0]))
runpy.run_path(sys.argv[0], run_name="__main__")
"""


def test_of_two_launches_into_one_sweep_dir_the_refused_one_writes_nothing(tmp_path, tag):
    sweep = tmp_path / "sweep"
    wrapper = tmp_path / "paused_at_launch.py"
    wrapper.write_text(PAUSED_AT_LAUNCH)

    def start(who: str) -> subprocess.Popen:
        command = app_command(
            "command_mode=per_rank", f"command='echo {who}-ran'", f"hydra.launcher.name=race-{who}", sweep_dir=sweep
        )
        return subprocess.Popen(
            [PY, str(wrapper), str(tmp_path / f"{who}.ready"), str(tmp_path / f"{who}.go"), *command[1:]],
            cwd=REPO,
            env=app_env(tag),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )

    first = start("first")
    wait_until(lambda: (tmp_path / "first.ready").exists() or first.poll() is not None, 60, "the first launch")
    assert first.poll() is None, first.communicate()
    written = (sweep / "multirun.yaml").read_bytes()
    assert b"first-ran" in written
    # the second starts while the first is past its checks and has claimed no job dir yet
    second = start("second")
    wait_until(lambda: (tmp_path / "second.ready").exists() or second.poll() is not None, 60, "the second launch")
    (tmp_path / "first.go").touch()
    out, err = first.communicate(timeout=120)
    (tmp_path / "second.go").touch()
    refused_out, refused_err = second.communicate(timeout=120)
    assert first.returncode == 0, err[-3000:]
    assert second.returncode != 0 and "is in use by a live launch" in refused_err, refused_err[-3000:]
    assert (sweep / "multirun.yaml").read_bytes() == written  # byte for byte the winner's
    [result] = results(sweep)
    assert (result["status"], result["name"]) == ("COMPLETED", "race-first-0")
    assert "first-ran" in (sweep / "0" / "logs" / "node0.rank0.log").read_text()
    assert wait_gone(tag) == []


# ------------------------------------------------------------------------------------------------------- lows


def test_a_log_symlink_planted_in_the_job_dir_is_never_written_through(tmp_path, tag):
    sweep = tmp_path / "sweep"
    logs = sweep / "0" / "logs"
    logs.mkdir(parents=True)
    victim = tmp_path / "elsewhere" / "victim.log"
    victim.parent.mkdir()
    (logs / "node0.rank0.log").symlink_to(victim)
    done = run_app("command_mode=per_rank", "command='echo written-through'", sweep_dir=sweep, tag=tag)
    assert done.returncode != 0 and "Traceback" not in done.stderr, done.stderr[-3000:]
    assert not victim.exists()  # nothing was created, written or truncated through the link
    assert (logs / "node0.rank0.log").is_symlink()
    [result] = results(sweep)
    assert result["status"] == "FAILED" and result["failure"]["rank"] == 0
    assert "cannot open its log" in result["error"] and "symlink" in result["error"], result["error"]
    assert wait_gone(tag) == []


def test_a_process_that_drops_its_tag_and_calls_setsid_goes_with_its_killed_rank_wrapper(tmp_path, tag):
    escaper = "setsid env -u MMT_JOB_ID sleep 300 & sleep 300"
    launcher = subprocess.Popen(
        app_command("num_nodes=1", "devices=2", "command_mode=per_rank", f"command='{escaper}'", sweep_dir=tmp_path),
        cwd=REPO,
        env=app_env(tag),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )

    def untagged() -> list:
        return [
            pid
            for pid in _commands(tag, "sleep 300")
            if b"MMT_JOB_ID=" not in Path(f"/proc/{pid}/environ").read_bytes()
            and Path(f"/proc/{pid}/cmdline").read_bytes() == b"sleep\x00300\x00"
        ]

    strays = wait_until(
        lambda: (lambda found: found if len(found) >= 2 else None)(untagged()),
        60,
        "each rank's setsid'd, untagged sleep",
    )
    assert all(os.getsid(pid) == pid for pid in strays)  # a session of its own, no MMT_JOB_ID: only its ancestry
    time.sleep(0.6)  # the agent notes what descends from the ranks every 0.2 s
    [shell] = [
        pid
        for pid in _commands(tag, f"sh -c {escaper}")
        if b"RANK=1" in Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    ]
    wrapper = int(Path(f"/proc/{shell}/status").read_text().split("PPid:\t")[1].split()[0])
    os.kill(wrapper, signal.SIGKILL)  # the OOM killer: the untagged sleep is the agent's (a subreaper) now
    deadline = time.monotonic() + 1 + 1  # kill_grace_s (1) + 1 s
    while [pid for pid in tagged_pids(tag) if pid != launcher.pid] and time.monotonic() < deadline:
        time.sleep(0.05)
    left = [pid for pid in tagged_pids(tag) if pid != launcher.pid]
    assert left == [], [Path(f"/proc/{pid}/cmdline").read_bytes() for pid in left if Path(f"/proc/{pid}").exists()]
    launcher.communicate(timeout=30)
    result = results(tmp_path)[0]
    assert result["status"] == "FAILED" and result["failure"]["rank"] == 1
    assert wait_gone(tag) == []


def _gone(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    except OSError:
        return True


def test_a_descendant_that_dropped_its_tag_and_left_the_session_is_stopped_with_its_job(tmp_path):
    from mmt.agent.jobs import JobProcesses
    from mmt.core import proctree
    from mmt.core.jobdir import Attempt

    attempt = Attempt(tmp_path / "job" / ".mmt" / "attempts" / "a").create()
    job = JobProcesses("tagless-job", attempt, kill_grace_s=0.5)
    marker = tmp_path / "stray.pid"
    rank = subprocess.Popen(
        ["sh", "-c", f"setsid env -u MMT_JOB_ID sh -c 'echo $$ > {marker}; exec sleep 300' & sleep 300"],
        env={**os.environ, "MMT_JOB_ID": "tagless-job"},
        start_new_session=True,
    )
    job.started(0, rank.pid)
    deadline = time.monotonic() + 10
    while not (marker.exists() and marker.read_text().strip()) and time.monotonic() < deadline:
        time.sleep(0.05)
    stray = int(marker.read_text())
    try:
        assert b"MMT_JOB_ID=tagless-job" not in Path(f"/proc/{stray}/environ").read_bytes()
        assert os.getsid(stray) != os.getsid(rank.pid)
        time.sleep(0.3)
        job.tick()  # while the rank runs, the agent notes what descends from it
        os.kill(rank.pid, signal.SIGKILL)  # the rank's wrapper, killed outright: its children are orphans now
        rank.wait()
        job.exited(rank.pid, -signal.SIGKILL)
        deadline = time.monotonic() + 5
        while not job.ended and time.monotonic() < deadline:
            job.tick()
            proctree.reap_any()
            time.sleep(0.02)
        assert _gone(stray), "the tagless descendant outlived its job"
        assert job.ended
    finally:
        for pid in (stray, *proctree.tagged({"MMT_JOB_ID": "tagless-job"})):
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
