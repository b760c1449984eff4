"""cluster=slurm on a real multi-node SLURM cluster started by scripts/slurm_cluster.sh (no fake sbatch). (Hydra's own
conformance suites on the same cluster: tests/conformance/test_slurm_conformance.py.)"""

import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
import uuid

import pytest

from helpers.app import app_command, app_env, results, run_app
from helpers.paths import REPO
from helpers.processes import CLUSTER_DRAIN_S, assert_none_left, from_a_terminal, wait_gone

pytestmark = pytest.mark.slurm
SLURM_PROBE = ("cluster=slurm", "recipe=probe", "devices=2")


@pytest.fixture(autouse=True)
def _cluster(slurm_cluster):
    yield


def _squeue() -> str:
    return subprocess.run(["squeue", "-h", "-o", "%i"], capture_output=True, text=True).stdout.strip()


def test_probe_sweep_one_and_two_nodes_one_agent_per_node(tmp_path, tag):
    done = run_app(*SLURM_PROBE, "num_nodes=1,2", sweep_dir=tmp_path, tag=tag, timeout=180)
    assert done.returncode == 0, done.stderr[-3000:]
    one, two = results(tmp_path)
    assert (one["status"], two["status"]) == ("COMPLETED", "COMPLETED")
    assert one["scheduler_id"] != two["scheduler_id"]
    ranks = two["return_value"]["ranks"]
    assert [r["rank"] for r in ranks] == [0, 1, 2, 3]
    assert [r["node_rank"] for r in ranks] == [0, 0, 1, 1]
    hosts = [r["hostname"] for r in ranks]  # real, distinct nodes (which two: wherever SLURM had room)
    assert hosts[0] == hosts[1] != hosts[2] == hosts[3] and all(h.startswith("node") for h in hosts), hosts
    # one SLURM task per node: its node agent forked both ranks of the node (one parent per node, two agents)
    parents = [r["ppid"] for r in ranks]
    assert parents[0] == parents[1] and parents[2] == parents[3] and parents[0] != parents[2]
    [attempt] = (tmp_path / "1" / ".mmt" / "attempts").iterdir()
    agents = [json.loads((attempt / f"agent.{n}.json").read_text()) for n in (0, 1)]
    assert [a["host"] for a in agents] == [hosts[0], hosts[2]] and [a["pid"] for a in agents] == [
        parents[0],
        parents[2],
    ]
    # the ranks see the contract, not SLURM's per-task variables (Lightning picks LightningEnvironment)
    assert {r["slurm_procid"] for r in ranks} == {None}
    assert {r["master"] for r in ranks} == {f"{hosts[0]}:{10000 + int(two['scheduler_id']) % 20000}"}
    assert two["return_value"]["all_reduce"] == 10.0
    assert len({r["hostname"] for r in one["return_value"]["ranks"]}) == 1  # one node, whichever had room


def test_per_rank_tasks_map_slurms_own_ids_onto_the_contract(tmp_path, tag):
    done = run_app(
        *SLURM_PROBE, "num_nodes=2", "hydra.launcher.tasks=per_rank", sweep_dir=tmp_path, tag=tag, timeout=180
    )
    assert done.returncode == 0, done.stderr[-3000:]
    ranks = results(tmp_path)[0]["return_value"]["ranks"]
    hosts = [r["hostname"] for r in ranks]  # two distinct nodes of the cluster, two ranks each
    assert hosts[0] == hosts[1] != hosts[2] == hosts[3] and all(h.startswith("node") for h in hosts), hosts
    assert [r["slurm_procid"] for r in ranks] == ["0", "1", "2", "3"]
    assert [r["slurm_nodeid"] for r in ranks] == ["0", "0", "1", "1"]
    [attempt] = (tmp_path / "0" / ".mmt" / "attempts").iterdir()
    assert not list(attempt.glob("agent.*.json"))  # every rank is a SLURM task of its own: no node agent


def test_a_rank_that_raises_ends_the_job_quickly_and_is_named(tmp_path, tag):
    done = run_app(*SLURM_PROBE, "num_nodes=2", "recipe.fail_rank=2", sweep_dir=tmp_path, tag=tag, timeout=180)
    assert done.returncode == 1
    [result] = results(tmp_path)
    assert result["status"] == "FAILED"
    assert (result["failure"]["rank"], result["failure"]["node_rank"]) == (2, 1)
    assert result["failure"]["exception"] == "ProbeFault: injected failure on rank 2"
    # --kill-on-bad-exit: the other ranks, blocked joining the group, did not wait for the 120 s init timeout; they
    # ended within seconds of rank 2 (timed from the timeline: a loaded CI host took 18 s to import a node's preload)
    marks = [json.loads(line) for line in (tmp_path / "0" / "timeline.jsonl").read_text().splitlines()]
    exits = {mark["process"]: mark["t"] for mark in marks if mark["phase"] == "rank_exit"}
    assert sorted(exits) == [0, 1, 2, 3] and max(exits.values()) - exits[2] < 10, exits
    assert result["duration_s"] < 100
    assert "rank 2 (node 1) raised ProbeFault" in done.stderr


def test_a_rank_that_exits_137_is_named_from_sruns_report(tmp_path, tag):
    done = run_app(
        *SLURM_PROBE,
        "num_nodes=2",
        "recipe.fail_rank=3",
        "recipe.fail_mode=exit",
        "recipe.exit_code=137",
        sweep_dir=tmp_path,
        tag=tag,
        timeout=180,
    )
    assert done.returncode == 1
    failure = results(tmp_path)[0]["failure"]
    assert (failure["rank"], failure["node_rank"], failure["exit_code"]) == (3, 1, 137)


def _start_holding(tmp_path, tag, *extra):
    command = app_command(*SLURM_PROBE, "num_nodes=2", "recipe.hold_s=120", *extra, sweep_dir=tmp_path)
    launcher = subprocess.Popen(
        command,
        cwd=REPO,
        env=app_env(tag),
        preexec_fn=from_a_terminal,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    deadline = time.monotonic() + 90
    while time.monotonic() < deadline:
        state = subprocess.run(["squeue", "-h", "-o", "%i %T"], capture_output=True, text=True).stdout.split()
        if len(state) == 2 and state[1] == "RUNNING" and (tmp_path / "0" / "logs").exists():
            return launcher, state[0]
        time.sleep(0.5)
    launcher.kill()
    pytest.fail(f"the job did not start: {launcher.communicate()[0]}")


def test_scancel_from_outside_is_reported_not_waited_on(tmp_path, tag):
    launcher, job_id = _start_holding(tmp_path, tag)
    subprocess.run(["scancel", job_id], check=True)
    output, _ = launcher.communicate(timeout=60)
    assert launcher.returncode == 1
    [result] = results(tmp_path)
    assert result["status"] == "INTERRUPTED"
    assert f"SLURM job {job_id} was cancelled outside the launcher (scancel)" in result["error"]
    assert _squeue() == ""


def test_ctrl_c_on_the_launcher_cancels_its_jobs(tmp_path, tag):
    launcher, job_id = _start_holding(tmp_path, tag)
    launcher.send_signal(signal.SIGINT)
    output, _ = launcher.communicate(timeout=60)
    assert launcher.returncode == 130, output
    assert results(tmp_path)[0]["status"] == "INTERRUPTED"
    deadline = time.monotonic() + 30
    while _squeue() and time.monotonic() < deadline:
        time.sleep(0.5)
    assert _squeue() == ""
    state = subprocess.run(
        ["sacct", "-X", "-n", "-P", "-j", job_id, "-o", "State"], capture_output=True, text=True
    ).stdout
    assert state.startswith("CANCELLED")
    assert wait_gone(tag, timeout_s=15) == []


def test_ctrl_c_while_jobs_are_being_submitted_leaves_no_job_unknown_or_unreported(tmp_path, tag):
    """A terminal's Ctrl-C reaches the launcher's whole process group, an sbatch in flight included. That sbatch
    still reports the job it submitted (which is then cancelled and reported), the jobs not submitted yet never
    are, and the summary names every job."""
    slow = tmp_path / "bin"  # an sbatch that takes its time, as a busy slurmctld does
    slow.mkdir()
    (slow / "sbatch").write_text(f'#!/bin/sh\nsleep 2\nexec {shutil.which("sbatch")} "$@"\n')
    (slow / "sbatch").chmod(0o755)
    env = app_env(tag, PATH=f"{slow}:{os.environ['PATH']}")
    before = set(_squeue().split())
    launcher = subprocess.Popen(
        # jobs of different sizes: an sbatch each (jobs alike would go out as one job array, in one sbatch)
        app_command(*SLURM_PROBE, "num_nodes=1,2,3", "recipe.hold_s=60", sweep_dir=tmp_path),
        cwd=REPO,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        preexec_fn=from_a_terminal,
        start_new_session=True,
    )
    seen = []
    for line in launcher.stdout:  # the first sbatch starts right after this line
        seen.append(line)
        if "mmt: launching 3 job(s)" in line:
            break
    time.sleep(1.0)
    os.killpg(launcher.pid, signal.SIGINT)
    output = "".join(seen) + launcher.communicate(timeout=90)[0]
    assert launcher.returncode == 130, output
    [submitted] = results(tmp_path)
    assert submitted["status"] == "INTERRUPTED" and submitted["scheduler_id"], output
    assert output.count("not started: the launcher received SIGINT before it was submitted") == 2, output
    assert not (tmp_path / "1" / ".mmt" / "attempts").exists() or not any(
        (tmp_path / "1" / ".mmt" / "attempts").iterdir()
    )
    deadline = time.monotonic() + 30
    while set(_squeue().split()) - before and time.monotonic() < deadline:
        time.sleep(0.5)
    assert set(_squeue().split()) - before == set()
    state = subprocess.run(
        ["sacct", "-X", "-n", "-P", "-j", submitted["scheduler_id"], "-o", "State"], capture_output=True, text=True
    ).stdout
    assert state.startswith("CANCELLED"), state
    assert wait_gone(tag, timeout_s=15) == []


def test_a_master_port_another_process_holds_fails_the_job_at_once_naming_it(tmp_path, tag):
    """On SLURM the port derives from the job id and node 0's agent holds it from its start; a port already held
    by someone else fails the job in seconds, naming it, instead of a rendezvous that waits for the time limit."""
    from mmt.backends.slurm.task import master_port

    last = subprocess.run(
        ["sacct", "-X", "-n", "-P", "-a", "-S", "2000-01-01", "-o", "JobID"], capture_output=True, text=True
    ).stdout.split()
    upcoming = max((int(i) for i in last if i.isdigit()), default=0) + 1
    listeners = []
    for job_id in range(upcoming, upcoming + 5):  # the next job ids (the tests run one at a time)
        sock = socket.socket()
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(("", master_port(str(job_id))))
        sock.listen()
        listeners.append(sock)
    try:
        started = time.monotonic()
        done = run_app(*SLURM_PROBE, "num_nodes=2", sweep_dir=tmp_path, tag=tag, timeout=120)
        elapsed = time.monotonic() - started
    finally:
        for sock in listeners:
            sock.close()
    assert done.returncode != 0
    [result] = results(tmp_path)
    port = master_port(result["scheduler_id"])
    assert result["status"] == "FAILED", result
    assert re.search(rf"MASTER_PORT {port} on node\d is in use", result["error"]), result  # the job's node 0
    assert elapsed < 60, elapsed  # not the 120 s rendezvous timeout (a loaded CI host took 18 s for a node's preload)
    assert _squeue() == ""


def test_commands_on_slurm_run_with_the_launchers_python_and_torchrun_on_a_path_that_lacks_them(tmp_path, tag):
    bare_path = "/usr/bin:/bin"  # SLURM's commands are there; this environment's python and torchrun are not
    env = app_env(tag, PATH=bare_path)
    env.pop("VIRTUAL_ENV", None)
    command = (
        'python -c "import sys, omegaconf; print(sys.executable)" && echo VENV=$VIRTUAL_ENV '
        "&& echo TORCHRUN_AT=$(command -v torchrun)"
    )
    done = subprocess.run(
        app_command(
            "cluster=slurm",
            "recipe=probe",
            "num_nodes=2",
            "devices=1",
            "command_mode=per_rank,per_node",
            f"command='{command}'",
            sweep_dir=tmp_path,
        ),
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    venv_bin = os.path.dirname(os.path.abspath(sys.executable))
    logs = sorted((tmp_path).glob("*/logs/*.log"))
    assert len(logs) == 4, logs  # 2 ranks per_rank, 2 nodes per_node
    for log in logs:
        lines = log.read_text().splitlines()
        assert os.path.abspath(sys.executable) in lines and f"VENV={sys.prefix}" in lines, (log, lines)
        assert f"TORCHRUN_AT={venv_bin}/torchrun" in lines, (log, lines)


SLURM_LM = ("cluster=slurm", "num_nodes=2", "devices=2", "hydra.launcher.poll_interval_s=0.5")


@pytest.fixture(scope="module")
def straight_lm(slurm_cluster, tmp_path_factory) -> dict:
    """The result of one uninterrupted 2 x 2 LM run on SLURM (tasks=per_node, the default), trained once for this
    module: the Lightning test checks it, and the requeued run must end with its weights bit for bit. Nothing it
    started may be left running (its own tag, as the ``tag`` fixture checks)."""
    sweep, tag = tmp_path_factory.mktemp("straight-lm"), uuid.uuid4().hex
    done = run_app(*SLURM_LM, "hydra.launcher.tasks=per_node", sweep_dir=sweep, tag=tag, timeout=300)
    assert_none_left(tag, CLUSTER_DRAIN_S)
    assert done.returncode == 0, done.stderr[-3000:]
    return results(sweep)[0]


@pytest.mark.parametrize("tasks, environment", [("per_node", "LightningEnvironment"), ("per_rank", "SLURMEnvironment")])
def test_lightning_two_by_two_on_slurm_trains_one_model(tasks, environment, request, tmp_path, tag):
    if tasks == "per_node":
        value = request.getfixturevalue("straight_lm")["return_value"]
    else:
        done = run_app(*SLURM_LM, f"hydra.launcher.tasks={tasks}", sweep_dir=tmp_path, tag=tag, timeout=300)
        assert done.returncode == 0, done.stderr[-3000:]
        value = results(tmp_path)[0]["return_value"]
    # per node, the agent's ranks carry the contract and Lightning uses it; per rank, Lightning picks its SLURM
    # environment and validates num_nodes/devices against SLURM's own view
    assert value["cluster_environment"] == environment
    assert value["world_size"] == 4
    assert len(value["weight_digests"]) == 4 and len(set(value["weight_digests"])) == 1
    assert value["train_loss_last"] < value["train_loss_first"]


def _wait_for(predicate, timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.2)
    pytest.fail(f"timed out waiting for {what}")


def test_requeue_signal_checkpoints_requeues_and_resumes_to_the_uninterrupted_result(straight_lm, tmp_path, tag):
    expected = straight_lm["return_value"]

    command = app_command(*SLURM_LM, sweep_dir=tmp_path / "requeued")
    launcher = subprocess.Popen(
        command,
        cwd=REPO,
        env=app_env(tag),
        preexec_fn=from_a_terminal,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    metrics = tmp_path / "requeued" / "0" / "metrics.csv"
    _wait_for(lambda: metrics.exists() and len(metrics.read_text().splitlines()) > 3, 120, "training to start")
    job_id = subprocess.run(["squeue", "-h", "-o", "%i"], capture_output=True, text=True).stdout.split()[0]
    # what SLURM does before a preemption or the time limit: USR2 to every task of the job
    subprocess.run(["scancel", "--signal=USR2", job_id], check=True)
    output, _ = launcher.communicate(timeout=300)
    assert launcher.returncode == 0, output[-3000:]
    assert f"job 0 (SLURM {job_id}) was requeued (restart 1)" in output
    result = results(tmp_path / "requeued")[0]
    value = result["return_value"]
    assert result["scheduler_id"] == job_id and value["resumed_from_checkpoint"] is True
    assert value["steps"] == expected["steps"]
    # the same weights, bit for bit, as the run that was never interrupted
    assert value["weight_digests"] == expected["weight_digests"]
    assert value["val_loss"] == expected["val_loss"]
