"""Jobs that outlive the terminal: detached launches, the registry, the `mmt` CLI and the SDK (local backend; the
SLURM side is in test_slurm_service.py). Real processes: a detached local job runs in a supervisor process that the
test's own session hangup must not reach."""

import hashlib
import json
import os
import signal
import sqlite3
import subprocess
import sys
import threading
import time
from contextlib import closing
from pathlib import Path
from typing import List

import pytest

from helpers.app import app_command, app_env, results, run_app
from helpers.paths import REPO
from helpers.processes import from_a_terminal, wait_gone
from helpers.service import killed_at_submit, registered, registry_files_holding

PY = sys.executable
MMT = str(Path(sys.executable).with_name("mmt"))


def mmt(*args: str, cwd: Path, tag=None, timeout: float = 120, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [MMT, *args], cwd=cwd, env=app_env(tag, **env), capture_output=True, text=True, timeout=timeout
    )


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
    code = (
        "from mmt import MMT, Machine\n"
        "job = MMT.run(command='echo Hello, Lightning!', name='echo-example', machine=Machine.CPU, num_machines=2)\n"
        "print('STATUS', job.wait(timeout=120).value)\n"
        "for machine in job.machines:\n"
        "    print('MACHINE', machine.rank, machine.status.value, repr(machine.logs))\n"
        "print('RESULT', job.result['exit_code'])\n"
    )
    done = subprocess.run([PY, "-c", code], cwd=tmp_path, env=app_env(tag), capture_output=True, text=True, timeout=180)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "STATUS Completed" in done.stdout
    assert "MACHINE 0 Completed 'Hello, Lightning!\\n'" in done.stdout
    assert "MACHINE 1 Completed 'Hello, Lightning!\\n'" in done.stdout
    assert "RESULT 0" in done.stdout
    # another process finds it by name
    again = subprocess.run(
        [PY, "-c", "from mmt import Job; j = Job.get('echo-example'); print(j.status.value, j.dir)"],
        cwd=tmp_path,
        env=app_env(),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert again.stdout.startswith("Completed ") and "outputs/mmt/echo-example/0" in again.stdout


def test_mmt_refuses_lightning_only_parameters_with_the_equivalent(tmp_path):
    done = mmt("run", "--command", "true", "--teamspace", "my-team", cwd=tmp_path)
    assert done.returncode == 2 and "--teamspace is a Lightning AI flag that mmt does not have" in done.stderr
    code = "from mmt import Job\nJob.run(command='true', studio='s')\n"
    sdk = subprocess.run([PY, "-c", code], cwd=tmp_path, env=app_env(), capture_output=True, text=True, timeout=60)
    assert (
        "Invalid studio='s': a Lightning AI parameter that mmt does not have. HINT: mmt runs in this environment"
        in sdk.stderr
    )
    single = subprocess.run(
        [PY, "-c", "from mmt import MMT\nMMT.run(command='true', num_machines=1)"],
        cwd=tmp_path,
        env=app_env(),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert "Multi-Machine training cannot be run with less than 2 Machines" in single.stderr


def test_the_cli_runs_lists_inspects_logs_and_waits(tmp_path, tag):
    done = mmt(
        "run",
        "--name",
        "cli-hello",
        "--num-machines",
        "2",
        "--devices",
        "2",
        "--command-mode",
        "per_rank",
        "--machine",
        "CPU",
        "-e",
        "GREETING=hi $(not a subshell) 'q'",
        "--command",
        'echo "$GREETING from $RANK"',
        cwd=tmp_path,
        tag=tag,
    )
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
    dry = mmt(
        "run",
        "--num-machines",
        "4",
        "--machine",
        "a100_x_8",
        "--cluster",
        "slurm",
        "--command",
        "true",
        "--dry-run",
        cwd=tmp_path,
    )
    assert dry.returncode == 0 and "topology   4 nodes x 8 devices = 32 ranks" in dry.stdout
    assert "#SBATCH --nodes=4" in dry.stdout


def test_a_detached_local_job_survives_its_terminal_and_can_be_stopped(tmp_path, tag):
    # a terminal's session: a shell that runs the launcher and stays; its hangup is the terminal closing
    session = subprocess.Popen(
        [
            "bash",
            "-c",
            f"{MMT} run --name survivor --num-machines 2 --detach --command "
            "'sleep 4; echo done-after-the-hangup'; echo LAUNCHER-RETURNED; sleep 120",
        ],
        cwd=tmp_path,
        env=app_env(tag),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
        preexec_fn=from_a_terminal,
    )
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

    stopping = subprocess.run(
        [MMT, "run", "--name", "stoppable", "--detach", "--command", "sleep 120"],
        cwd=tmp_path,
        env=app_env(tag),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert stopping.returncode == 0, stopping.stderr
    _wait_status(tmp_path, "stoppable", "Running")
    assert "asked its supervisor" in mmt("stop", "stoppable", cwd=tmp_path).stdout
    row = _wait_status(tmp_path, "stoppable", "Stopped", timeout_s=30)
    assert row["state"] == "INTERRUPTED"
    assert wait_gone(tag, timeout_s=10) == []


# train.py's sweep through Hydra's own multirun, which hands back what the sweeper got: each job's JobReturn
# (argv: the config dir, the overrides). Prints one JSON line per job, from its value: whether it is a job handle,
# its name, its status once waited on, and the ranks in its result.
SWEEP_VALUES = """
import json, sys
import hydra
from hydra.core.global_hydra import GlobalHydra
from mmt import Job

def task(cfg):
    return hydra.utils.instantiate(cfg.recipe, _partial_=True, _convert_="all")()

with hydra.initialize_config_dir(config_dir=sys.argv[1], job_name="train", version_base="1.3"):
    [batch] = GlobalHydra.instance().hydra.multirun(config_name="train", task_function=task, overrides=sys.argv[2:])
for ret in batch:
    value = ret.return_value
    print(json.dumps({"status": ret.status.name, "handle": isinstance(value, Job), "name": value.name,
                      "waited": value.wait(timeout=120).value, "ranks": len(value.result["ranks"])}), flush=True)
"""


def test_a_detached_sweep_returns_handles_and_concludes_itself(tmp_path, tag):
    done = subprocess.run(
        [
            PY,
            "-c",
            SWEEP_VALUES,
            str(REPO / "conf"),
            "recipe=probe",
            "num_nodes=1,2",
            "devices=2",
            "hydra.launcher.detach=true",
            f"hydra.launcher.name=detached-{tag[:6]}",
            f"hydra.sweep.dir={tmp_path / 'sweep'}",
        ],
        cwd=REPO,
        env=app_env(tag),
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert "each job's value is a handle (mmt.Job)" in done.stdout
    values = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    assert values == [
        {
            "status": "COMPLETED",
            "handle": True,
            "name": f"detached-{tag[:6]}-{num}",
            "waited": "Completed",
            "ranks": 2 * (num + 1),
        }
        for num in (0, 1)
    ]
    assert [r["status"] for r in results(tmp_path / "sweep")] == ["COMPLETED", "COMPLETED"]
    assert wait_gone(tag, timeout_s=10) == []


def test_a_sweeper_that_needs_values_cannot_detach(tmp_path):
    done = run_app(
        "hydra/sweeper=optuna",
        "hydra.sweeper.n_trials=1",
        "recipe=probe",
        "hydra.launcher.detach=true",
        sweep_dir=tmp_path,
    )
    assert done.returncode != 0 and "Traceback" not in done.stderr
    assert "decides its next trials from the jobs' return values" in done.stderr


# Launchers released together: the CLI imported once, then forked into one `mmt run` per name, each of which waits
# at a barrier just before its registry write and notes when it was released (argv: <notes dir> <name ...>). This
# process holds the registry's write lock across the release, so every one of them meets a busy database. The last
# line: every exit code.
FORKED_LAUNCHERS = """
import json, multiprocessing, os, sqlite3, sys, time
from pathlib import Path
# what `mmt run` imports, once, before the fork
import hydra, mmt.launching.prepare, hydra_plugins.mmt_launcher._core, mmt.service.submit
from mmt.cli.main import main
from mmt.records.registry import Registry

notes, names, real_add = Path(sys.argv[1]), sys.argv[2:], Registry.add
barrier = multiprocessing.get_context("fork").Barrier(len(names) + 1)

def add_at_the_barrier(self, records):
    barrier.wait(timeout=60)
    (notes / records[0].name).write_text(repr(time.time()))
    return real_add(self, records)

Registry.add = add_at_the_barrier
pids = []
for name in names:
    pid = os.fork()
    if pid == 0:
        code = main(["run", "--name", name, "--command", "true"])
        sys.stdout.flush()
        os._exit(code)
    pids.append(pid)
Registry().names_taken([])  # the database exists
holder = sqlite3.connect(Registry().path, isolation_level=None)
holder.execute("BEGIN IMMEDIATE")
barrier.wait(timeout=60)
time.sleep(0.5)
holder.execute("COMMIT")
print(json.dumps({"codes": [os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]) for pid in pids]}), flush=True)
"""


def test_eight_launchers_released_together_all_register_and_a_killed_writer_leaves_the_registry_readable(tmp_path, tag):
    names = [f"twin-{tag[:6]}-{i}" for i in range(8)]
    notes = tmp_path / "released"
    notes.mkdir()
    done = subprocess.run(
        [PY, "-c", FORKED_LAUNCHERS, str(notes), *names],
        cwd=tmp_path,
        env=app_env(tag),
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert done.returncode == 0 and json.loads(done.stdout.splitlines()[-1]) == {"codes": [0] * 8}, (
        done.stdout[-3000:] + done.stderr[-3000:]
    )
    released = [float((notes / name).read_text()) for name in names]
    assert max(released) - min(released) < 0.5  # they wrote at once, not one by one
    rows = {row["name"]: row for row in json.loads(mmt("list", "--json", cwd=tmp_path).stdout)}
    assert [rows[name]["status"] for name in names] == ["Completed"] * 8
    # a writer killed in the middle of a transaction (what a launcher killed mid-submit does)
    writer = subprocess.Popen(
        [
            PY,
            "-c",
            (
                "import sqlite3, sys, time\nfrom mmt.records.registry import Registry\n"
                "db = sqlite3.connect(Registry().path, isolation_level=None)\ndb.execute('BEGIN IMMEDIATE')\n"
                "db.execute(\"UPDATE jobs SET state = 'CORRUPT' WHERE name = ?\", (sys.argv[1],))\n"
                "print('in the middle', flush=True)\ntime.sleep(60)\n"
            ),
            names[0],
        ],
        env=app_env(tag),
        stdout=subprocess.PIPE,
        text=True,
    )
    assert writer.stdout.readline().strip() == "in the middle"
    writer.kill()
    writer.wait()
    assert _listed(tmp_path, names[0])["status"] == "Completed"  # the half-done write is gone
    from mmt.records.registry import Registry

    with sqlite3.connect(Registry().path) as db:
        assert db.execute("PRAGMA integrity_check").fetchone() == ("ok",)


def test_a_local_launcher_killed_mid_submit_leaves_no_job_pending(tmp_path, tag):
    prefix = f"cut-{tag[:6]}"
    killed_at_submit(
        app_command("recipe=probe", "devices=1", "+x=range(0,4)", f"hydra.launcher.name={prefix}", sweep_dir=tmp_path),
        1,
        tag,
    )
    records = registered(prefix)
    assert len(records) == 4 and {r["state"] for r in records.values()} <= {"PENDING", "RUNNING"}, records
    listed = mmt("list", "--json", cwd=tmp_path)
    assert listed.returncode == 0, listed.stderr
    rows = {row["name"]: row for row in json.loads(listed.stdout) if row["name"].startswith(prefix)}
    assert len(rows) == 4 and {row["status"] for row in rows.values()} == {"Failed"}, rows
    errors = sorted(record["result"]["error"] for record in registered(prefix).values())
    never_started = [error for error in errors if "ended before the job was started" in error]
    assert len(never_started) >= 3, errors  # jobs 1-3; job 0 too when the agent had not yet started it
    assert all("(killed?)" in error for error in errors), errors
    for name in rows:
        assert mmt("delete", name, cwd=tmp_path).returncode == 0
    assert registered(prefix) == {}
    assert wait_gone(tag, timeout_s=10) == []


def test_a_name_in_use_is_refused_before_anything_starts(tmp_path, tag):
    assert mmt("run", "--name", "taken", "--command", "true", cwd=tmp_path, tag=tag).returncode == 0
    again = mmt("run", "--name", "taken", "--command", "true", cwd=tmp_path, tag=tag)
    assert again.returncode == 2 and "the registry already holds a job named 'taken'" in again.stderr
    assert mmt("delete", "taken", cwd=tmp_path).returncode == 0
    assert mmt("run", "--name", "taken", "--command", "true", cwd=tmp_path, tag=tag).returncode == 0


# The SDK side of the CLI/SDK walk-through (argv: the two job names, the gate file, the secret). The first job
# prints two lines, then waits for the gate, then a digest of the secret it got through env=; the second sleeps.
SDK_WALKTHROUGH = """
import json, sys, time
from mmt import Job, Status

followed_name, stopped_name, gate, secret = sys.argv[1:]

def running(job):
    deadline = time.monotonic() + 60
    while job.status != Status.Running:
        assert time.monotonic() < deadline, job.status
        time.sleep(0.05)
    return job

command = (f"echo first; echo second; while [ ! -e {gate} ]; do sleep 0.1; done; "
           "printf %s \\"$PASSPHRASE\\" | sha256sum | cut -c1-16")
job = running(Job.run(command=command, name=followed_name, env={"PASSPHRASE": secret}))
try:
    job.wait(timeout=0.1)
except TimeoutError as exc:
    print("TIMEOUT", exc, flush=True)
print("RUNNING", flush=True)
lines = list(job.logs(rank=0, follow=True))
print("FOLLOWED", json.dumps(lines), job.status.value, flush=True)
sleeper = running(Job.run(command="sleep 60", name=stopped_name))
sleeper.stop()
print("STOPPED", sleeper.wait(timeout=30).value, flush=True)
"""


def _table_row(table: str, name: str) -> List[str]:
    """The cells of ``name``'s row in a plain `mmt list` table ([] when it is not listed)."""
    return next((line.split() for line in table.splitlines() if line.split()[:1] == [name]), [])


def test_the_cli_and_sdk_follow_tail_list_inspect_wait_stop_and_pass_env(tmp_path, tag):
    followed, stopped, secret = f"follow-{tag[:6]}", f"stop-{tag[:6]}", f"pass-{tag}"
    gate = tmp_path / "gate"
    sdk = subprocess.Popen(
        [PY, "-c", SDK_WALKTHROUGH, followed, stopped, str(gate), secret],
        cwd=tmp_path,
        env=app_env(tag),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    said = [sdk.stdout.readline(), sdk.stdout.readline()]
    assert said == [f"TIMEOUT job {followed} is still Running after 0.1 s\n", "RUNNING\n"], said + [sdk.stderr.read()]
    follower = subprocess.Popen(
        [MMT, "logs", followed, "-f"],
        cwd=tmp_path,
        env=app_env(tag),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert follower.stdout.readline() == "first\n"
    assert _listed(tmp_path, followed)["status"] == "Running"  # it follows a running job
    gate.touch()
    # and ends by itself when the job ends. Read on through the same buffered pipe: readline() may have buffered
    # the next lines already, which communicate() (reading the raw pipe) would never see
    watchdog = threading.Timer(60, follower.kill)
    watchdog.start()
    try:
        rest, errors = follower.stdout.read(), follower.stderr.read()
        follower.wait()
    finally:
        watchdog.cancel()
    digest = hashlib.sha256(secret.encode()).hexdigest()[:16]
    assert (follower.returncode, "first\n" + rest) == (0, f"first\nsecond\n{digest}\n"), errors
    out, err = sdk.communicate(timeout=120)
    assert sdk.returncode == 0, err[-3000:]
    assert f'FOLLOWED ["first\\n", "second\\n", "{digest}\\n"] Completed\n' in out  # the env value reached the command
    assert "STOPPED Stopped\n" in out
    assert mmt("logs", followed, "--tail", "1", cwd=tmp_path).stdout == f"{digest}\n"

    table = mmt("list", cwd=tmp_path).stdout
    assert _table_row(table, followed)[:6] == [followed, "Completed", "local", "cpu", "1", "x"]
    assert _table_row(table, stopped)[:2] == [stopped, "Stopped"]
    inspected = mmt("inspect", followed, cwd=tmp_path).stdout.splitlines()
    assert f"name          {followed}" in inspected and "status        Completed" in inspected
    assert "machines      0: Completed" in inspected and "topology      1 x 1" in inspected
    # a job ended more than 7 days ago: only --all lists it
    from mmt.records.registry import Registry

    with closing(sqlite3.connect(Registry().path, timeout=30)) as db, db:
        db.execute("UPDATE jobs SET created_at = created_at - 8 * 86400 WHERE name = ?", (stopped,))
    assert _table_row(mmt("list", cwd=tmp_path).stdout, stopped) == []
    assert _table_row(mmt("list", "--all", cwd=tmp_path).stdout, stopped)[:2] == [stopped, "Stopped"]

    shown = out + err + table + "\n".join(inspected) + mmt("inspect", followed, "--json", cwd=tmp_path).stdout
    assert secret not in shown  # mmt never prints the value
    kept = [path for path in tmp_path.rglob("*") if path.is_file() and secret.encode() in path.read_bytes()]
    assert kept == [] and registry_files_holding(secret) == []  # nor leaves it in a file
    assert wait_gone(tag, timeout_s=10) == []


def test_each_machine_of_a_running_job_has_its_own_status(tmp_path, tag):
    # node 1's command ends at once, node 0's waits for a gate: while the job runs, its machines say so apiece
    gate = tmp_path / "gate"
    script = f"""
import sys, time
from mmt import Job, Status
job = Job.run(name="apiece-{tag[:6]}", num_machines=2,
              command='[ "$NODE_RANK" = 1 ] || while [ ! -e {gate} ]; do sleep 0.1; done')
deadline = time.monotonic() + 60
while [m.status for m in job.machines] != [Status.Running, Status.Completed]:
    assert time.monotonic() < deadline, [m.status for m in job.machines]
    time.sleep(0.1)
print("APIECE", job.status.value, [m.status.value for m in job.machines], flush=True)
open("{gate}", "w").close()
print("ENDED", job.wait(timeout=60).value, [m.status.value for m in job.machines], flush=True)
"""
    done = subprocess.run(
        [PY, "-c", script], cwd=tmp_path, env=app_env(tag), capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert "APIECE Running ['Running', 'Completed']" in done.stdout
    assert "ENDED Completed ['Completed', 'Completed']" in done.stdout
