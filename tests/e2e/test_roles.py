"""Jobs with roles on this host (cluster=local), as a user runs them: examples/roles/ (Lightning trainers, 2 x 2 DDP,
calling a scorer role over TCP), a sweep over a role's node count, a role that fails, a role that ends early, the
logs of a role's rank, bad input; every process gone afterwards (``tag``)."""

import json
import re
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import List, Tuple

from helpers.app import app_env, results, run_app
from helpers.paths import REPO
from helpers.processes import from_a_terminal

EXAMPLE = REPO / "examples" / "roles" / "app.py"


def run_example(*overrides: str, sweep_dir: Path, tag: str, timeout: float = 300, **env: str):
    return subprocess.run(
        [sys.executable, str(EXAMPLE), *overrides, f"hydra.sweep.dir={sweep_dir}"],
        cwd=REPO,
        env=app_env(tag, **env),
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def role_lines(job: Path) -> List[str]:
    return [
        line
        for path in sorted((job / "logs").glob("*/*.log"))
        for line in path.read_text().splitlines()
        if line.startswith("ROLE ")
    ]


def trainers_stopped_after_s(job: Path) -> float:
    """Seconds from the scorer's exit (process 4; the trainers are processes 0-3 on nodes 0-1) to the trainers'
    end: their ranks' exits, or their node agents' ends where the ranks had not even started (a loaded host: the
    trainers' agents still imported torch when the scorer failed, and SLURM ended them), by the job's timeline."""
    events = [json.loads(line) for line in (job / "timeline.jsonl").read_text().splitlines() if line.strip()]
    exits = {event["process"]: event["t"] for event in events if event.get("phase") == "rank_exit"}
    ends = [event["t"] for event in events if event.get("phase") == "agent_end" and event.get("node") in (0, 1)]
    trainers = [exits[i] for i in range(4) if i in exits]
    assert len(trainers) == 4 or len(ends) == 2, events
    return max(trainers + ends) - exits[4]


def role_counts(found: List[dict]) -> List[List[tuple]]:
    """Each job's roles as (name, nodes, whether it ended well): the trainer COMPLETED; a scorer COMPLETED, or
    STOPPED when one of its nodes was still starting as the trainer ended (a loaded host; the job completed all the
    same), never FAILED."""
    shapes = []
    for result in found:
        assert result["status"] == "COMPLETED", result
        shapes.append(
            [
                (r["name"], r["num_nodes"], r["status"] in ("COMPLETED", "STOPPED") and r["failed"] == 0)
                for r in result["roles"]
            ]
        )
    return shapes


def test_the_example_trainers_reach_the_scorer_each_role_its_own_world(tmp_path, tag):
    done = run_example(sweep_dir=tmp_path, tag=tag)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "trainer 2 x 2 + scorer 1 x 1" in done.stdout  # the launch line and the summary
    (result,) = results(tmp_path)
    job = tmp_path / "0"
    roles = json.loads((job / "roles.json").read_text())["roles"]
    scorer_at = f"scorer@{roles['scorer']['addrs'][0]}:{roles['scorer']['port']}"
    trainer_at = f"trainer@{','.join(roles['trainer']['addrs'])}:{roles['trainer']['port']}"
    # every rank of both roles: its role, its rank in its role's own world, the other role's address
    assert sorted(role_lines(job)) == sorted(
        [f"ROLE trainer rank {r} of 4 (node {r // 2}); others: {scorer_at}" for r in range(4)]
        + [f"ROLE scorer rank 0 of 1 (node 0); others: {trainer_at}"]
    )
    assert roles["trainer"]["master_port"] != roles["scorer"]["master_port"]
    # the trainers reached the scorer: every rank's losses were aggregated (20 steps, every 5th: 4 per rank)
    scored = json.loads((job / "scorer.json").read_text())
    assert scored["count"] == 16 and scored["ranks"] == 4
    assert result["status"] == "COMPLETED" and result["return_value"]["steps"] == 20
    assert result["return_value"]["scored"] >= 4 and result["return_value"]["scorer_mean_loss"] > 0
    # the result holds both roles' outcomes: the trainer completed; the scorer ended when mmt stopped it, cleanly
    assert [(r["name"], r["primary"], r["num_nodes"], r["devices"], r["status"]) for r in result["roles"]] == [
        ("trainer", True, 2, 2, "COMPLETED"),
        ("scorer", False, 1, 1, "COMPLETED"),
    ]
    # mmt logs NAME --role R --rank N reads that role's rank's log; the primary's by default
    name = result["name"]
    mmt = [sys.executable, "-m", "mmt.cli.main", "logs", name]
    scorer_log = subprocess.run([*mmt, "--role", "scorer"], capture_output=True, text=True, env=app_env(tag), cwd=REPO)
    assert scorer_log.returncode == 0 and "SCORER listening on port" in scorer_log.stdout, scorer_log.stderr
    rank3 = subprocess.run([*mmt, "--rank", "3"], capture_output=True, text=True, env=app_env(tag), cwd=REPO)
    assert "ROLE trainer rank 3 of 4" in rank3.stdout, rank3.stderr
    bad = subprocess.run([*mmt, "--role", "scorer", "--rank", "1"], capture_output=True, text=True, env=app_env(tag))
    assert bad.returncode != 0
    assert "Invalid --rank 1: expected rank 0 of role scorer" in bad.stderr


def test_ctrl_c_stops_every_role_and_the_views_know_roles(tmp_path, tag):
    """Ctrl-C while both roles run: every process of every role goes, the job is INTERRUPTED with each role's
    outcome; ``mmt inspect`` and the SDK's machines see its three nodes by role."""
    launcher = subprocess.Popen(
        [sys.executable, str(EXAMPLE), "steps=100000", "score_every=50", f"hydra.sweep.dir={tmp_path}"],
        cwd=REPO,
        env=app_env(tag),
        preexec_fn=from_a_terminal,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    lines: List[str] = []
    while not any("TRAINER" in line or "Initializing distributed" in line for line in lines):
        line = launcher.stdout.readline()
        assert line, "".join(lines)
        lines.append(line)
    scorer_log = tmp_path / "0" / "logs" / "scorer" / "node0.rank0.log"
    deadline = time.monotonic() + 60
    while "SCORER listening" not in (scorer_log.read_text() if scorer_log.exists() else ""):
        assert time.monotonic() < deadline
        time.sleep(0.2)
    launcher.send_signal(signal.SIGINT)
    launcher.communicate(timeout=60)
    assert launcher.returncode != 0
    (result,) = results(tmp_path)
    assert result["status"] == "INTERRUPTED"
    trainer, scorer = result["roles"]
    # the scorer takes SIGTERM and exits 0 (COMPLETED), unless a loaded host keeps it past the kill grace
    assert (trainer["name"], trainer["status"], scorer["name"]) == ("trainer", "STOPPED", "scorer")
    assert scorer["status"] in ("COMPLETED", "STOPPED") and scorer["failed"] == 0
    inspect = subprocess.run(
        [sys.executable, "-m", "mmt.cli.main", "inspect", result["name"], "--json"],
        capture_output=True,
        text=True,
        env=app_env(tag),
        cwd=REPO,
    )
    facts = json.loads(inspect.stdout)
    assert facts["topology"] == "trainer 2 x 2 + scorer 1 x 1" and len(facts["machines"]) == 3
    sdk = subprocess.run(
        [sys.executable, "-c", f"from mmt import Job; print(Job.get({result['name']!r}).machines[2].logs)"],
        capture_output=True,
        text=True,
        env=app_env(tag),
        cwd=REPO,
    )
    assert "ROLE scorer rank 0 of 1" in sdk.stdout, sdk.stderr
    waited = subprocess.run(
        [sys.executable, "-m", "mmt.cli.main", "wait", result["name"]],
        capture_output=True,
        text=True,
        env=app_env(tag),
        cwd=REPO,
    )
    assert "INTERRUPTED  trainer 2 x 2 + scorer 1 x 1" in waited.stdout, waited.stdout + waited.stderr


def test_a_sweep_over_a_roles_node_count_runs_each_count(tmp_path, tag):
    done = run_example("roles.scorer.num_nodes=1,2", "steps=5", sweep_dir=tmp_path, tag=tag)
    assert done.returncode == 0, done.stdout + done.stderr
    found = results(tmp_path)
    assert [r["status"] for r in found] == ["COMPLETED", "COMPLETED"]
    assert [[(r["name"], r["num_nodes"]) for r in result["roles"]] for result in found] == [
        [("trainer", 2), ("scorer", 1)],
        [("trainer", 2), ("scorer", 2)],
    ]
    assert len([line for line in role_lines(tmp_path / "1") if line.startswith("ROLE scorer")]) == 2


def test_a_scorer_that_raises_stops_the_trainers_within_seconds(tmp_path, tag):
    started = time.monotonic()
    done = run_example("steps=100000", "+roles.scorer.env.SCORER_FAIL_AFTER=3", sweep_dir=tmp_path, tag=tag)
    took = time.monotonic() - started
    assert done.returncode != 0
    (result,) = results(tmp_path)
    assert result["status"] == "FAILED"
    assert result["failure"]["role"] == "scorer" and result["failure"]["rank"] == 0
    assert "role scorer rank 0 (node 0) raised RuntimeError: the scorer broke" in done.stderr + done.stdout
    assert [(r["name"], r["status"]) for r in result["roles"]] == [("trainer", "STOPPED"), ("scorer", "FAILED")]
    assert trainers_stopped_after_s(tmp_path / "0") < 10
    assert result["stop_latency_s"] < 10 and trainers_stopped_after_s(tmp_path / "0") < 10
    assert took < 120, took  # 100,000 steps were never going to finish: the trainers were stopped


def test_a_role_that_may_not_end_first_fails_the_job_one_that_may_does_not(tmp_path, tag):
    common = ["+roles.trainer.command='sleep 3'", "+roles.helper.command='exit 0'", "+roles.helper.num_nodes=1"]
    failed = run_app(*common, sweep_dir=tmp_path / "fail", tag=tag)
    assert failed.returncode != 0
    (result,) = results(tmp_path / "fail")
    assert result["status"] == "FAILED" and result["failure"]["ended_early"] is True
    assert "the command on role helper node 0 exited before the primary role ended" in failed.stdout
    fine = run_app(*common, "+roles.helper.early_exit=ok", sweep_dir=tmp_path / "ok", tag=tag)
    assert fine.returncode == 0, fine.stdout + fine.stderr
    (result,) = results(tmp_path / "ok")
    assert [(r["name"], r["status"]) for r in result["roles"]] == [("trainer", "COMPLETED"), ("helper", "COMPLETED")]


def test_dry_run_shows_each_role_and_bad_input_is_one_line(tmp_path, tag):
    dry = run_example("hydra.launcher.dry_run=true", sweep_dir=tmp_path / "dry", tag=tag)
    assert dry.returncode == 0, dry.stderr
    assert "topology   trainer 2 x 2 + scorer 1 x 1 = 3 nodes, 5 ranks" in dry.stdout
    assert re.search(
        r"role scorer \(early_exit=fail\): 1 nodes x 1 devices = 1 ranks on cpu_small: 2 vCPU.*, runs the task",
        dry.stdout,
    )
    assert "MMT_ROLE_SCORER_ADDRS=<scorer0>" in dry.stdout and not (tmp_path / "dry" / "0" / "logs").exists()
    for overrides, message in (
        (
            ["+roles.scorer.primary=true", "+roles.trainer.primary=true"],
            "is primary already; a job has one primary role",
        ),
        (["roles.scorer.num_nodes=0"], "Invalid roles.scorer.num_nodes=0: expected a whole number >= 1"),
    ):
        bad = run_example(*overrides, sweep_dir=tmp_path / "bad", tag=tag)
        assert bad.returncode != 0
        lines = [line for line in bad.stderr.splitlines() if line.startswith("Invalid")]
        assert len(lines) == 1 and message in lines[0], bad.stderr
        assert not list((tmp_path / "bad").glob("*/logs"))
    # a role the app does not have: Hydra's own refusal names the key and how to add it
    typo = run_example("roles.scorr.num_nodes=2", sweep_dir=tmp_path / "typo", tag=tag)
    assert typo.returncode != 0 and "Could not override 'roles.scorr.num_nodes'" in typo.stderr


# ------------------------------------------------------------------------------------------------ on SLURM


def _sdiag_submits() -> Tuple[int, int]:
    """slurmctld's counts of sbatch submissions so far: of plain jobs and of heterogeneous ones (sdiag's
    REQUEST_SUBMIT_BATCH_JOB and REQUEST_SUBMIT_BATCH_HET_JOB; absent until the first of its kind)."""
    out = subprocess.run(["sdiag"], capture_output=True, text=True, check=True).stdout

    def count(rpc: str) -> int:
        found = re.search(rf"{rpc}\s+\(\s*\d+\)\s+count:(\d+)", out)
        return int(found.group(1)) if found else 0

    return count("REQUEST_SUBMIT_BATCH_JOB"), count("REQUEST_SUBMIT_BATCH_HET_JOB")


def test_on_slurm_the_example_is_one_heterogeneous_job(slurm_cluster, tmp_path, tag):
    before = _sdiag_submits()
    done = run_example("cluster=slurm", sweep_dir=tmp_path, tag=tag)
    assert done.returncode == 0, done.stdout + done.stderr
    after = _sdiag_submits()
    assert (after[0] - before[0], after[1] - before[1]) == (0, 1)  # one submission, heterogeneous, for both roles
    (result,) = results(tmp_path)
    job = tmp_path / "0"
    # its components, each with its own nodes and CPUs: the trainer's 2 nodes of machine=cpu (4 CPUs a node agent),
    # the scorer's 1 node of its own machine, cpu_small (2)
    shown = subprocess.run(["scontrol", "show", "job", result["scheduler_id"]], capture_output=True, text=True).stdout
    components = re.findall(r"HetJobOffset=(\d+).*?NumNodes=(\d+) NumCPUs=(\d+)", shown, re.S)
    assert components == [("0", "2", "8"), ("1", "1", "2")], shown
    roles = json.loads((job / "roles.json").read_text())["roles"]
    assert roles["trainer"]["addrs"] != roles["scorer"]["addrs"]  # different hosts of the cluster
    scorer_at = f"scorer@{roles['scorer']['addrs'][0]}:{roles['scorer']['port']}"
    trainer_at = f"trainer@{','.join(roles['trainer']['addrs'])}:{roles['trainer']['port']}"
    assert sorted(role_lines(job)) == sorted(
        [f"ROLE trainer rank {r} of 4 (node {r // 2}); others: {scorer_at}" for r in range(4)]
        + [f"ROLE scorer rank 0 of 1 (node 0); others: {trainer_at}"]
    )
    assert json.loads((job / "scorer.json").read_text())["count"] == 16
    assert result["status"] == "COMPLETED" and result["return_value"]["steps"] == 20
    assert [(r["name"], r["num_nodes"], r["status"]) for r in result["roles"]] == [
        ("trainer", 2, "COMPLETED"),
        ("scorer", 1, "COMPLETED"),
    ]


def test_on_slurm_a_scorer_that_raises_stops_the_trainers(slurm_cluster, tmp_path, tag):
    started = time.monotonic()
    done = run_example(
        "cluster=slurm", "steps=100000", "+roles.scorer.env.SCORER_FAIL_AFTER=3", sweep_dir=tmp_path, tag=tag
    )
    assert done.returncode != 0 and time.monotonic() - started < 120
    (result,) = results(tmp_path)
    assert result["status"] == "FAILED" and result["failure"]["role"] == "scorer"
    assert "role scorer rank 0 (node 0) raised RuntimeError: the scorer broke" in done.stdout
    assert [(r["name"], r["status"]) for r in result["roles"]] == [("trainer", "STOPPED"), ("scorer", "FAILED")]
    assert trainers_stopped_after_s(tmp_path / "0") < 10


def test_on_slurm_a_sweep_over_the_scorers_nodes(slurm_cluster, tmp_path, tag):
    # the test cluster has 3 nodes: a trainer of 1 node beside a scorer of 1, then of 2
    done = run_example(
        "cluster=slurm",
        "roles.trainer.num_nodes=1",
        "roles.scorer.num_nodes=1,2",
        "steps=5",
        sweep_dir=tmp_path,
        tag=tag,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    found = results(tmp_path)
    assert role_counts(found) == [
        [("trainer", 1, True), ("scorer", 1, True)],
        [("trainer", 1, True), ("scorer", 2, True)],
    ]
    # the second job's scorer had two nodes of the cluster (a node still starting as the short trainer ended may
    # never print its line: the roles file says where both were)
    assert len(json.loads((tmp_path / "1" / "roles.json").read_text())["roles"]["scorer"]["addrs"]) == 2


# ------------------------------------------------------------------------------------------------ on Ray


def test_on_ray_one_placement_group_with_each_roles_bundles(ray_cluster, tmp_path, tag):
    dry = run_example("cluster=ray", "hydra.launcher.dry_run=true", sweep_dir=tmp_path / "dry", tag=tag)
    assert dry.returncode == 0, dry.stderr
    assert (
        "its 3 node(s) one placement group (STRICT_SPREAD: a Ray node each) of bundles trainer 2 x {CPU: 4} + "
        "scorer 1 x {CPU: 2}" in dry.stdout
    )  # the scorer's machine is cpu_small: 2 CPUs
    done = run_example("cluster=ray", sweep_dir=tmp_path / "run", tag=tag)
    assert done.returncode == 0, done.stdout + done.stderr
    (result,) = results(tmp_path / "run")
    job = tmp_path / "run" / "0"
    roles = json.loads((job / "roles.json").read_text())["roles"]
    # STRICT_SPREAD: every node of every role on a Ray node of its own
    assert len(set(roles["trainer"]["addrs"] + roles["scorer"]["addrs"])) == 3
    scorer_at = f"scorer@{roles['scorer']['addrs'][0]}:{roles['scorer']['port']}"
    trainer_at = f"trainer@{','.join(roles['trainer']['addrs'])}:{roles['trainer']['port']}"
    assert sorted(role_lines(job)) == sorted(
        [f"ROLE trainer rank {r} of 4 (node {r // 2}); others: {scorer_at}" for r in range(4)]
        + [f"ROLE scorer rank 0 of 1 (node 0); others: {trainer_at}"]
    )
    assert json.loads((job / "scorer.json").read_text())["count"] == 16
    assert [(r["name"], r["status"]) for r in result["roles"]] == [("trainer", "COMPLETED"), ("scorer", "COMPLETED")]


def test_on_ray_a_scorer_that_raises_stops_the_trainers(ray_cluster, tmp_path, tag):
    started = time.monotonic()
    done = run_example(
        "cluster=ray", "steps=100000", "+roles.scorer.env.SCORER_FAIL_AFTER=3", sweep_dir=tmp_path, tag=tag
    )
    assert done.returncode != 0 and time.monotonic() - started < 120
    (result,) = results(tmp_path)
    assert result["status"] == "FAILED" and result["failure"]["role"] == "scorer"
    assert [(r["name"], r["status"]) for r in result["roles"]] == [("trainer", "STOPPED"), ("scorer", "FAILED")]
    assert trainers_stopped_after_s(tmp_path / "0") < 10


def test_on_ray_a_sweep_over_the_scorers_nodes(ray_cluster, tmp_path, tag):
    done = run_example(
        "cluster=ray", "roles.trainer.num_nodes=1", "roles.scorer.num_nodes=1,2", "steps=5", sweep_dir=tmp_path, tag=tag
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert role_counts(results(tmp_path)) == [
        [("trainer", 1, True), ("scorer", 1, True)],
        [("trainer", 1, True), ("scorer", 2, True)],
    ]
