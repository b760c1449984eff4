"""Jobs that outlive the terminal: detached launches, the registry, the `mmt` CLI and the SDK (local backend; the
SLURM side is in test_slurm_service.py). Real processes: a detached local job runs in a supervisor process that the
test's own session hangup must not reach."""

import json
import os
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import app_env, from_a_terminal, results, run_app, wait_gone

PY = sys.executable
MMT = str(Path(sys.executable).with_name("mmt"))


def mmt(*args: str, cwd: Path, tag=None, timeout: float = 120, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run([MMT, *args], cwd=cwd, env=app_env(tag, **env), capture_output=True, text=True,
                          timeout=timeout)


def _listed(cwd: Path, name: str) -> dict:
    done = mmt("list", "--json", cwd=cwd)
    assert done.returncode == 0, done.stderr
    return {row["name"]: row for row in json.loads(done.stdout)}.get(name, {})


def _wait_status(cwd: Path, name: str, status: str, timeout_s: float = 90) -> dict:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        row = _listed(cwd, name)
        if row.get("status") == status:
            return row
        time.sleep(0.3)
    pytest.fail(f"{name} never reached {status}: {_listed(cwd, name)}")


def test_the_sdk_runs_the_seed_example_on_two_machines(tmp_path, tag):
    code = ("from mmt import MMT, Machine\n"
            "job = MMT.run(command='echo Hello, Lightning!', name='echo-example', machine=Machine.CPU, num_machines=2)\n"
            "print('STATUS', job.wait(timeout=120).value)\n"
            "for machine in job.machines:\n"
            "    print('MACHINE', machine.rank, machine.status.value, repr(machine.logs))\n"
            "print('RESULT', job.result['exit_code'])\n")
    done = subprocess.run([PY, "-c", code], cwd=tmp_path, env=app_env(tag), capture_output=True, text=True,
                          timeout=180)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "STATUS Completed" in done.stdout
    assert "MACHINE 0 Completed 'Hello, Lightning!\\n'" in done.stdout
    assert "MACHINE 1 Completed 'Hello, Lightning!\\n'" in done.stdout
    assert "RESULT 0" in done.stdout
    # another process finds it by name
    again = subprocess.run([PY, "-c", "from mmt import Job; j = Job.get('echo-example'); print(j.status.value, j.dir)"],
                           cwd=tmp_path, env=app_env(), capture_output=True, text=True, timeout=60)
    assert again.stdout.startswith("Completed ") and "outputs/mmt/echo-example/0" in again.stdout


def test_mmt_refuses_lightning_only_parameters_with_the_equivalent(tmp_path):
    done = mmt("run", "--command", "true", "--teamspace", "my-team", cwd=tmp_path)
    assert done.returncode == 2 and "--teamspace is a Lightning AI flag that mmt does not have" in done.stderr
    code = "from mmt import Job\nJob.run(command='true', studio='s')\n"
    sdk = subprocess.run([PY, "-c", code], cwd=tmp_path, env=app_env(), capture_output=True, text=True, timeout=60)
    assert "Invalid studio='s': a Lightning AI parameter that mmt does not have. HINT: mmt runs in this environment" \
        in sdk.stderr
    single = subprocess.run([PY, "-c", "from mmt import MMT\nMMT.run(command='true', num_machines=1)"], cwd=tmp_path,
                            env=app_env(), capture_output=True, text=True, timeout=60)
    assert "Multi-Machine training cannot be run with less than 2 Machines" in single.stderr


def test_the_cli_runs_lists_inspects_logs_and_waits(tmp_path, tag):
    done = mmt("run", "--name", "cli-hello", "--num-machines", "2", "--devices", "2", "--command-mode", "per_rank",
               "--machine", "CPU", "-e", "GREETING=hi $(not a subshell) 'q'", "--command", 'echo "$GREETING from $RANK"',
               cwd=tmp_path, tag=tag)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "[#0 n0 r0] hi $(not a subshell) 'q' from 0" in done.stdout and "COMPLETED" in done.stdout
    assert "hi $(not a subshell)" not in done.stdout.split("mmt summary")[1]  # values are not shown again
    row = _listed(tmp_path, "cli-hello")
    assert (row["status"], row["topology"], row["cluster"]) == ("Completed", "2 x 2", "local")
    logs = mmt("logs", "cli-hello", "--rank", "3", cwd=tmp_path)
    assert logs.stdout == "hi $(not a subshell) 'q' from 3\n"
    inspect = json.loads(mmt("inspect", "cli-hello", "--json", cwd=tmp_path).stdout)
    assert inspect["status"] == "Completed" and [m["status"] for m in inspect["machines"]] == ["Completed"] * 2
    assert mmt("wait", "cli-hello", cwd=tmp_path).returncode == 0  # an ended job: at once, with its status
    dry = mmt("run", "--num-machines", "4", "--machine", "a100_x_8", "--cluster", "slurm", "--command", "true",
              "--dry-run", cwd=tmp_path)
    assert dry.returncode == 0 and "topology   4 nodes x 8 devices = 32 ranks" in dry.stdout
    assert "#SBATCH --nodes=4" in dry.stdout


def test_a_detached_local_job_survives_its_terminal_and_can_be_stopped(tmp_path, tag):
    # a terminal's session: a shell that runs the launcher and stays; its hangup is the terminal closing
    session = subprocess.Popen(["bash", "-c", f"{MMT} run --name survivor --num-machines 2 --detach --command "
                                "'sleep 4; echo done-after-the-hangup'; echo LAUNCHER-RETURNED; sleep 120"],
                               cwd=tmp_path, env=app_env(tag), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                               text=True, start_new_session=True, preexec_fn=from_a_terminal)
    started = time.monotonic()
    lines = []
    while "LAUNCHER-RETURNED" not in "".join(lines):
        lines.append(session.stdout.readline())
        assert time.monotonic() - started < 60, lines
    assert time.monotonic() - started < 10 and "mmt: survivor submitted (local" in "".join(lines)
    os.killpg(session.pid, signal.SIGHUP)  # the terminal goes: the shell and everything in its session hear it
    session.wait(timeout=10)
    assert _listed(tmp_path, "survivor")["status"] in ("Pending", "Running")
    waited = mmt("wait", "survivor", cwd=tmp_path, timeout=90)
    assert waited.returncode == 0, waited.stdout + waited.stderr
    assert "COMPLETED" in waited.stdout
    assert _listed(tmp_path, "survivor")["status"] == "Completed"
    assert "done-after-the-hangup" in mmt("logs", "survivor", "--rank", "1", cwd=tmp_path).stdout

    stopping = subprocess.run([MMT, "run", "--name", "stoppable", "--detach", "--command", "sleep 120"], cwd=tmp_path,
                              env=app_env(tag), capture_output=True, text=True, timeout=60)
    assert stopping.returncode == 0, stopping.stderr
    _wait_status(tmp_path, "stoppable", "Running")
    assert "asked its supervisor" in mmt("stop", "stoppable", cwd=tmp_path).stdout
    row = _wait_status(tmp_path, "stoppable", "Stopped", timeout_s=30)
    assert row["state"] == "INTERRUPTED"
    assert wait_gone(tag, timeout_s=10) == []


def test_a_detached_sweep_returns_handles_and_concludes_itself(tmp_path, tag):
    done = run_app("recipe=probe", "num_nodes=1,2", "devices=2", "hydra.launcher.detach=true",
                   "hydra.launcher.name=detached-probe", sweep_dir=tmp_path / "sweep", tag=tag)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "each job's value is a handle (mmt.Job)" in done.stdout
    for name in ("detached-probe-0", "detached-probe-1"):
        assert subprocess.run([MMT, "wait", name], cwd=tmp_path, env=app_env(), capture_output=True,
                              timeout=120).returncode == 0
    assert [r["status"] for r in results(tmp_path / "sweep")] == ["COMPLETED", "COMPLETED"]
    assert wait_gone(tag, timeout_s=10) == []


def test_a_sweeper_that_needs_values_cannot_detach(tmp_path):
    done = run_app("hydra/sweeper=optuna", "hydra.sweeper.n_trials=1", "recipe=probe", "hydra.launcher.detach=true",
                   sweep_dir=tmp_path)
    assert done.returncode != 0 and "Traceback" not in done.stderr
    assert "decides its next trials from the jobs' return values" in done.stderr


def test_two_launchers_at_once_both_register_and_a_killed_writer_leaves_the_registry_readable(tmp_path, tag):
    launchers = [subprocess.Popen([MMT, "run", "--name", f"twin-{i}", "--command", "true"], cwd=tmp_path,
                                  env=app_env(tag), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
                 for i in range(2)]
    for launcher in launchers:
        assert launcher.wait(timeout=120) == 0, launcher.stderr.read()
    names = {row["name"] for row in json.loads(mmt("list", "--json", cwd=tmp_path).stdout)}
    assert {"twin-0", "twin-1"} <= names
    # a writer killed in the middle of a transaction (what a launcher killed mid-submit does)
    writer = subprocess.Popen([PY, "-c", (
        "import sqlite3, time\nfrom mmt.service.registry import Registry\n"
        "db = sqlite3.connect(Registry().path, isolation_level=None)\ndb.execute('BEGIN IMMEDIATE')\n"
        "db.execute(\"UPDATE jobs SET state = 'CORRUPT' WHERE name = 'twin-0'\")\n"
        "print('in the middle', flush=True)\ntime.sleep(60)\n")], env=app_env(tag), stdout=subprocess.PIPE, text=True)
    assert writer.stdout.readline().strip() == "in the middle"
    writer.kill()
    writer.wait()
    row = _listed(tmp_path, "twin-0")
    assert row["status"] == "Completed"  # the half-done write is gone; the registry reads as before
    from mmt.service.registry import Registry

    with sqlite3.connect(Registry().path) as db:
        assert db.execute("PRAGMA integrity_check").fetchone() == ("ok",)


def test_a_name_in_use_is_refused_before_anything_starts(tmp_path, tag):
    assert mmt("run", "--name", "taken", "--command", "true", cwd=tmp_path, tag=tag).returncode == 0
    again = mmt("run", "--name", "taken", "--command", "true", cwd=tmp_path, tag=tag)
    assert again.returncode == 2 and "the registry already holds a job named 'taken'" in again.stderr
    assert mmt("delete", "taken", cwd=tmp_path).returncode == 0
    assert mmt("run", "--name", "taken", "--command", "true", cwd=tmp_path, tag=tag).returncode == 0
