"""cluster=ray when things go wrong, on the real Ray test cluster (scripts/ray_cluster.sh): a worker node lost mid-job
(its raylet and every process on it SIGKILLed), jobs that outlive their launcher (detached, a SIGKILLed launcher,
a SIGKILLed driver too), `mmt logs`, `mmt stop`, `mmt wait`, the SDK, the live page, Ctrl-C. After every test no Ray
job of mmt runs and no node actor is alive (test_ray.py's fixture)."""

import json
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from e2e.test_dashboard import dashboard
from e2e.test_ray import PROBE, _cluster, address, on_ray, placement, running_on_cluster  # noqa: F401 - fixture
from helpers.app import app_command, app_env, results, run_app
from helpers.paths import REPO
from helpers.processes import from_a_terminal, wait_gone, wait_until

MMT = str(Path(sys.executable).with_name("mmt"))
CLUSTER = REPO / "scripts" / "ray_cluster.sh"


def mmt(*args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run([MMT, *args], cwd=REPO, env=app_env(), capture_output=True, text=True, timeout=timeout)


def _row(name: str) -> dict:
    rows = json.loads(mmt("list", "--json").stdout)
    return {row["name"]: row for row in rows}.get(name, {})


def _ranks_running(job: Path, ranks: int = 4) -> bool:
    """Every rank of the probe (2 x 2: 4) is in its hold, past its collectives (the probe's ``hold`` mark in the
    timeline: a fault injected earlier may fail a rank's rendezvous first), and the run's placement is recorded."""
    attempts, marks = job / ".mmt" / "attempts", job / "timeline.jsonl"
    if not (attempts.exists() and any(attempts.glob("*/placement.0.json")) and marks.exists()):
        return False
    holding = {line for line in marks.read_text().splitlines() if '"phase":"hold"' in line}
    return len(holding) >= ranks


def _worker_of(ip: str) -> str:
    """The test cluster's worker number of a Ray node's address (127.0.0.6 is worker 1)."""
    return str(int(ip.rsplit(".", 1)[1]) - 5)


@pytest.fixture
def lose_node():
    """``lose(ip)``: the worker at ``ip`` lost as a machine is lost (ray_cluster.sh fail-node); revived after the
    test, whatever happened."""
    lost = []

    def lose(ip: str) -> None:
        subprocess.run([str(CLUSTER), "fail-node", _worker_of(ip)], check=True, capture_output=True, timeout=60)
        lost.append(ip)

    yield lose
    for ip in lost:
        subprocess.run([str(CLUSTER), "revive-node", _worker_of(ip)], check=True, capture_output=True, timeout=180)


def _json(url: str):
    with urllib.request.urlopen(url, timeout=10) as answer:
        return json.load(answer)


def _live_jobs(url: str) -> list:
    """Every job the live page (``mmt dashboard``) lists, over its own API."""
    return [job for sweep in _json(url + "api/jobs")["sweeps"] for job in sweep["jobs"]]


def _ray_cli(*args: str) -> str:
    """Ray's own command line (``ray job list``, ``ray list actors``) against the test cluster."""
    ray = str(Path(sys.executable).with_name("ray"))
    done = subprocess.run(
        [ray, *args, "--address", address()], capture_output=True, text=True, timeout=120, env=app_env()
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    return done.stdout


def _driver_pid(submission_id: str) -> int:
    with urllib.request.urlopen(f"{address()}/api/jobs/{submission_id}", timeout=10) as answer:
        return int(json.load(answer)["driver_info"]["pid"])


# ------------------------------------------------------------------------------------------------ a lost node


def test_a_lost_worker_node_fails_the_job_naming_the_node_and_its_ranks(tmp_path, tag, lose_node):
    name = f"lost-{tag[:6]}"
    done = run_app(
        *on_ray(tag), *PROBE, "recipe.hold_s=120", "hydra.launcher.detach=true", f"hydra.launcher.name={name}",
        sweep_dir=tmp_path, tag=tag, timeout=60,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    wait_until(lambda: _ranks_running(tmp_path / "0"), 90, "every rank to start")
    node1 = placement(tmp_path / "0")[1]
    lost_at = time.monotonic()
    lose_node(node1["ip"])
    wait_until(lambda: _row(f"{name}-0").get("status") == "Failed", 60, "the job to fail")
    assert time.monotonic() - lost_at < 30  # Ray's health checks (about 3 s here), not a collective's timeout
    [result] = results(tmp_path)
    assert result["status"] == "FAILED", result
    named = f"lost node {node1['ip']} (Ray node {node1['node_id'][:8]}): node 1 of the job, ranks 2-3"
    assert result["error"] == f"job 0: Ray job {result['scheduler_id']} {named}", result["error"]
    assert "earlier_runs" not in result
    assert wait_gone(tag, timeout_s=15) == []


def test_a_lost_worker_node_with_max_restarts_1_restarts_the_job_on_the_nodes_left(tmp_path, tag, lose_node):
    launcher = subprocess.Popen(
        app_command(*on_ray(tag), *PROBE, "recipe.hold_s=12", "hydra.launcher.max_restarts=1", sweep_dir=tmp_path),
        cwd=REPO,
        env=app_env(tag),
        preexec_fn=from_a_terminal,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        wait_until(lambda: _ranks_running(tmp_path / "0"), 90, "every rank to start")
        first = placement(tmp_path / "0")
        lose_node(first[1]["ip"])
        output, _ = launcher.communicate(timeout=180)
    finally:
        launcher.kill()
    assert launcher.returncode == 0, output[-3000:]
    named = f"lost node {first[1]['ip']} (Ray node {first[1]['node_id'][:8]}): node 1 of the job, ranks 2-3"
    notice = next((line for line in output.splitlines() if "run 0 failed" in line), "")
    assert named in notice and "restart 1 of 1 on the nodes that are left" in notice, output[-3000:]
    [result] = results(tmp_path)
    assert result["status"] == "COMPLETED" and result["return_value"]["all_reduce"] == 10.0, result
    [earlier] = result["earlier_runs"]
    assert earlier["restart"] == 0 and named in earlier["error"]
    # the restart: a new placement group, on two distinct nodes that are left
    second = placement(tmp_path / "0", run=1)
    assert len({n["ip"] for n in second}) == 2 and first[1]["ip"] not in {n["ip"] for n in second}, second
    assert wait_gone(tag, timeout_s=15) == []


def test_a_lost_node_when_the_nodes_left_cannot_hold_the_job_fails_it_saying_both(tmp_path, tag, lose_node):
    """3 nodes x 1 on three workers, max_restarts=1: once one is lost, two are left, so the restart cannot be placed.
    The job is FAILED at once (never pending for ever), naming the lost node and what it asks and what is left."""
    name = f"nofit-{tag[:6]}"
    done = run_app(
        *on_ray(tag), "recipe=probe", "num_nodes=3", "devices=1", "recipe.hold_s=120", "hydra.launcher.max_restarts=1",
        "hydra.launcher.detach=true", f"hydra.launcher.name={name}", sweep_dir=tmp_path, tag=tag, timeout=60,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    wait_until(lambda: _ranks_running(tmp_path / "0", ranks=3), 90, "every rank to start")
    node2 = placement(tmp_path / "0")[2]
    lose_node(node2["ip"])
    wait_until(lambda: _row(f"{name}-0").get("status") == "Failed", 60, "the job to fail")
    [result] = results(tmp_path)
    named = f"lost node {node2['ip']} (Ray node {node2['node_id'][:8]}): node 2 of the job, rank 2"
    asks = "it cannot restart: job 0 asks 3 Ray nodes with {CPU: 4} each (STRICT_SPREAD: one node per mmt node, 3 x 1"
    assert result["status"] == "FAILED" and named in result["error"] and asks in result["error"], result["error"]
    left = result["error"].split(asks)[1]  # what the cluster has: the two nodes left, not the lost one
    assert "the cluster has 2 that can hold one" in left and node2["ip"] not in left, left
    assert "earlier_runs" not in result  # the failed run is the job's last: no restart ran
    assert wait_gone(tag, timeout_s=15) == []


# ---------------------------------------------------------------------------------------- outliving the launcher


def test_mmt_logs_of_rank_3_shows_rank_3s_own_output_of_a_detached_job(tmp_path, tag):
    name = f"echo-{tag[:6]}"
    done = subprocess.run(
        [
            MMT, "run", "--name", name, "--cluster", "ray", "--num-machines", "2", "--devices", "2",
            "--command-mode", "per_rank", "--command", 'echo "from $RANK"', "--detach",
            "--set", f"hydra.sweep.dir={tmp_path}", "--set", f"+hydra.launcher.runtime_env.env_vars.LEFTOVER_TAG={tag}",
        ],
        cwd=REPO, env=app_env(tag), capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    wait_until(lambda: _row(name).get("status") == "Completed", 90, "Completed")
    assert mmt("logs", name, "--rank", "3").stdout == "from 3\n"
    assert mmt("logs", name, "--rank", "2").stdout == "from 2\n"


def test_the_sdk_submits_a_ray_job_and_follows_it_to_its_end(tmp_path, tag):
    name = f"sdk-{tag[:6]}"
    script = f"""
from mmt import MMT
job = MMT.run(name={name!r}, num_machines=2, devices=2, cluster="ray", command_mode="per_rank",
              command='echo "sdk $RANK on $MMT_NODE_ADDR"',
              overrides=["hydra.sweep.dir={tmp_path}", "+hydra.launcher.runtime_env.env_vars.LEFTOVER_TAG={tag}"])
print("SUBMITTED", job.name, flush=True)
print("ENDED", job.wait(timeout=90).value, [m.status.value for m in job.machines], flush=True)
print("RANK3", repr(job.logs(rank=3)), flush=True)
"""
    done = subprocess.run(
        [sys.executable, "-c", script], cwd=REPO, env=app_env(tag), capture_output=True, text=True, timeout=150
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    assert f"SUBMITTED {name}" in done.stdout, done.stdout
    assert "ENDED Completed ['Completed', 'Completed']" in done.stdout, done.stdout
    row = _row(name)
    assert row["status"] == "Completed" and row["cluster"] == "ray" and row["scheduler_id"].startswith("mmt-"), row
    nodes = [n["ip"] for n in placement(Path(row["dir"]))]
    assert len(set(nodes)) == 2, nodes
    assert f"RANK3 'sdk 3 on {nodes[1]}\\n'" in done.stdout, done.stdout


def test_mmt_stop_stops_a_detached_job_and_nothing_is_left_on_the_cluster(tmp_path, tag):
    name = f"halt-{tag[:6]}"
    done = run_app(
        *on_ray(tag), *PROBE, "recipe.hold_s=120", "hydra.launcher.detach=true", f"hydra.launcher.name={name}",
        sweep_dir=tmp_path, tag=tag, timeout=60,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    wait_until(lambda: _ranks_running(tmp_path / "0"), 90, "every rank to start")
    assert _row(f"{name}-0")["status"] == "Running"
    with dashboard([tmp_path], tag) as url:
        # the live page follows the Ray job as any other: RUNNING, its four ranks' logs, both nodes' metrics
        [live] = wait_until(lambda: _live_jobs(url), 30, "the live page to list the job")
        assert live["status"] == "RUNNING" and live["backend"] == "ray", live
        assert live["scheduler_id"] == json.loads(next((tmp_path / "0").rglob("ray.json")).read_text())["submission_id"]
        detail = wait_until(
            lambda: (d := _json(f"{url}api/jobs/{live['id']}"))["metric_nodes"] == [0, 1] and d,
            30,
            "both nodes' metrics on the live page",
        )
        assert [(log["node"], log["rank"]) for log in detail["logs"]] == [(0, 0), (0, 1), (1, 2), (1, 3)], detail
        nodes = _json(f"{url}api/jobs/{live['id']}/metrics")["nodes"]
        assert [n["node"] for n in nodes] == [0, 1] and all(n["t"] for n in nodes), nodes
        stopped = mmt("stop", f"{name}-0")
        assert stopped.returncode == 0 and "stopped" in stopped.stdout, stopped.stdout + stopped.stderr
        wait_until(lambda: (tmp_path / "0" / "result.json").exists(), 30, "the job's own result")
        wait_until(lambda: _live_jobs(url)[0]["status"] == "INTERRUPTED", 15, "the live page to show it stopped")
    [result] = results(tmp_path)
    assert result["status"] == "INTERRUPTED" and result["error"] == "job 0: stopped: stopped on request (mmt stop)"
    wait_until(lambda: not running_on_cluster(), 15, "nothing left in ray job list / ray list actors")
    # Ray's own command line agrees: the job STOPPED, no actor of it alive
    sid = result["scheduler_id"]
    [line] = [line for line in _ray_cli("job", "list").split("JobDetails(")[1:] if f"submission_id='{sid}'" in line]
    assert "status=<JobStatus.STOPPED: 'STOPPED'>" in line, line
    actors = json.loads(_ray_cli("list", "actors", "--format", "json", "--limit", "10000"))
    assert not [a for a in actors if (a.get("name") or "").startswith(sid) and a["state"] != "DEAD"], actors
    assert mmt("wait", f"{name}-0").returncode == 1
    assert _row(f"{name}-0")["status"] == "Stopped"
    assert wait_gone(tag, timeout_s=15) == []


def test_a_sigkilled_launchers_job_runs_on_and_mmt_wait_reattaches_to_it(tmp_path, tag):
    name = f"kill-{tag[:6]}"
    launcher = subprocess.Popen(
        app_command(*on_ray(tag), *PROBE, "recipe.hold_s=8", f"hydra.launcher.name={name}", sweep_dir=tmp_path),
        cwd=REPO,
        env=app_env(tag),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    wait_until(lambda: _ranks_running(tmp_path / "0"), 90, "every rank to start")
    launcher.kill()  # SIGKILL: it concludes nothing
    launcher.wait()
    assert _row(f"{name}-0")["status"] == "Running"
    waited = mmt("wait", f"{name}-0", timeout=120)
    assert waited.returncode == 0, waited.stdout + waited.stderr
    assert "COMPLETED" in waited.stdout
    [result] = results(tmp_path)
    assert result["status"] == "COMPLETED" and result["return_value"]["all_reduce"] == 10.0
    assert _row(f"{name}-0")["status"] == "Completed"
    assert wait_gone(tag, timeout_s=15) == []


def test_a_job_whose_launcher_and_driver_were_sigkilled_is_concluded_by_mmt_list(tmp_path, tag):
    name = f"orphan-{tag[:6]}"
    launcher = subprocess.Popen(
        app_command(*on_ray(tag), *PROBE, "recipe.hold_s=120", f"hydra.launcher.name={name}", sweep_dir=tmp_path),
        cwd=REPO,
        env=app_env(tag),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    wait_until(lambda: _ranks_running(tmp_path / "0"), 90, "every rank to start")
    launcher.kill()
    launcher.wait()
    submission_id = json.loads(next((tmp_path / "0" / ".mmt" / "attempts").glob("*/ray.json")).read_text())[
        "submission_id"
    ]
    subprocess.run(["kill", "-9", str(_driver_pid(submission_id))], check=True)
    # the driver's actors go with it (Ray's fate sharing), its node agents with them, their ranks with those
    wait_until(lambda: _row(f"{name}-0").get("status") == "Failed", 60, "mmt list to conclude it")
    [result] = results(tmp_path)
    assert result["status"] == "FAILED", result
    assert result["error"].startswith(f"job 0: Ray job {submission_id} ended FAILED before its driver concluded it"), (
        result["error"]
    )
    assert wait_gone(tag, timeout_s=15) == []


def test_ctrl_c_on_an_attached_launcher_stops_its_job(tmp_path, tag):
    launcher = subprocess.Popen(
        app_command(*on_ray(tag), *PROBE, "recipe.hold_s=120", sweep_dir=tmp_path),
        cwd=REPO,
        env=app_env(tag),
        preexec_fn=from_a_terminal,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    wait_until(lambda: _ranks_running(tmp_path / "0"), 90, "every rank to start")
    launcher.send_signal(signal.SIGINT)
    output, _ = launcher.communicate(timeout=60)
    assert launcher.returncode == 130, output[-3000:]
    [result] = results(tmp_path)
    assert result["status"] == "INTERRUPTED" and "stopped: the launcher received SIGINT" in result["error"], result
    wait_until(lambda: not running_on_cluster(), 15, "nothing left in ray job list / ray list actors")
    assert wait_gone(tag, timeout_s=15) == []
