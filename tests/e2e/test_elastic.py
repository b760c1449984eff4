"""Elastic jobs (``num_nodes=MIN:MAX``) on cluster=local, as a user runs them: recipe=lm on 2:3 nodes x 2, a node's
agent SIGKILLed mid-run (its ranks die with it), real gloo, real Lightning. The surviving agents stay (the same
PIDs), fork the new world's ranks from their warm interpreters, and the job completes on the nodes left; below MIN
nodes it fails naming them; a rank that fails with no node lost fails the job as before. Nothing is left running
(``tag``)."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import List

import psutil

from helpers.app import app_command, app_env, results
from helpers.elastic import agent_pid, attempt_of, world_changes
from helpers.paths import REPO
from helpers.processes import from_a_terminal, wait_until

ELASTIC_LM = ("recipe=lm", "num_nodes=2:3", "devices=2", "batch.global_size=48")


def launch(tmp_path: Path, tag: str, *overrides: str) -> subprocess.Popen:
    return subprocess.Popen(
        app_command(*ELASTIC_LM, *overrides, sweep_dir=tmp_path),
        cwd=REPO,
        env=app_env(tag),
        preexec_fn=from_a_terminal,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


def last_step(job: Path) -> int:
    try:
        rows = (job / "metrics.csv").read_text().splitlines()[1:]
    except FileNotFoundError:
        return -1
    return max((int(row.split(",")[1]) for row in rows if row.count(",") >= 3), default=-1)


def forked_since(agent: int, since: float) -> List[psutil.Process]:
    """The processes ``agent`` forked since ``since`` that still run its own program (forked, never exec'd: no new
    interpreter, so no second import of torch)."""
    parent = psutil.Process(agent)
    found = []
    for child in parent.children():
        try:
            if child.create_time() >= since and child.cmdline() == parent.cmdline():
                found.append(child)
        except psutil.NoSuchProcess:
            continue
    return found


def test_a_lost_node_costs_that_node_the_survivors_form_a_smaller_world_and_finish(tmp_path, tag):
    launcher = launch(tmp_path, tag, "recipe.max_steps=60")
    job = tmp_path / "0"
    wait_until(lambda: last_step(job) >= 24, 240, "step 24 (after the step-20 checkpoint)")
    attempt = attempt_of(job)
    survivors = {slot: agent_pid(attempt, slot) for slot in (0, 1)}
    lost_at = time.time()
    os.kill(agent_pid(attempt, 2), signal.SIGKILL)  # the node: its agent, and its ranks with it (parent-death signal)
    change = wait_until(
        lambda: next((c for c in world_changes(job) if c.get("training_at")), None), 120, "training in the new world"
    )
    # the surviving agents are the same processes, and the new world's ranks are their children, forked from their
    # warm interpreters (no second import of torch); they run the new world's contract (below: 4 ranks, micro 12)
    for slot, pid in survivors.items():
        assert agent_pid(attempt, slot) == pid
        assert len(forked_since(pid, change["formed_at"] - 1.0)) == 2, (slot, pid)
    out, _ = launcher.communicate(timeout=300)
    assert launcher.returncode == 0, out
    (result,) = results(tmp_path)
    assert result["status"] == "COMPLETED"
    value = result["return_value"]
    # the job finished on the nodes left, from its last checkpoint, with the same global batch
    assert value["steps"] == 60 and value["world_size"] == 4 and value["resumed_from_checkpoint"] is True
    assert value["global_batch_size"] == 48 and (value["micro_batch_size"], value["grad_accum"]) == (12, 1)
    assert value["weights_in_sync"] is True and len(set(value["weight_digests"])) == 1
    assert len(value["weight_digests"]) == 4
    # the result says what changed: node 2 lost, 6 -> 4 ranks, the global batch unchanged
    (recorded,) = result["world_changes"]
    assert recorded["generation"] == 1 and recorded["lost"] == [2] and recorded["joined"] == []
    assert (recorded["nodes_before"], recorded["nodes_after"]) == (3, 2)
    assert (recorded["world_before"], recorded["world_after"]) == (6, 4)
    assert recorded["batch_before"].startswith("global 48 = 6 ranks x micro 8")
    assert recorded["batch_after"].startswith("global 48 = 4 ranks x micro 12")
    assert 0 < recorded["at"] - lost_at < 5 and recorded["to_training_s"] == change["training_at"] - change["at"]
    assert "world 1: lost node 2: 3 -> 2 nodes, 6 -> 4 ranks" in out
    assert "COMPLETED  3 -> 2 x 2" in out  # the summary: the nodes it started and ended with
    inspected = subprocess.run(
        [sys.executable, "-m", "mmt.cli.main", "inspect", result["name"]], capture_output=True, text=True, env=app_env()
    )
    assert "world 1       lost node 2: 3 -> 2 nodes, 6 -> 4 ranks; training again" in inspected.stdout, inspected
    assert "topology      3 -> 2 x 2\n" in inspected.stdout, inspected.stdout  # as the summary says it
    listed = subprocess.run(
        [sys.executable, "-m", "mmt.cli.main", "list", "--json"], capture_output=True, text=True, env=app_env()
    )
    (row,) = [row for row in json.loads(listed.stdout) if row["name"] == result["name"]]
    assert row["topology"] == "3 -> 2 x 2", row


def test_a_restored_node_joins_after_the_next_checkpoint_and_the_world_grows_back(tmp_path, tag):
    """Node 2 lost at step 24, restored a second later (its agent started again, as a spare): once it is ready, the
    world of 2 grows back to 3 right after its next checkpoint, and the job completes on 6 ranks."""
    launcher = launch(tmp_path, tag, "recipe.max_steps=90", "hydra.launcher.restore_lost_nodes_after_s=1")
    job = tmp_path / "0"
    wait_until(lambda: last_step(job) >= 24, 240, "step 24 (after the step-20 checkpoint)")
    attempt = attempt_of(job)
    survivors = {slot: agent_pid(attempt, slot) for slot in (0, 1)}
    lost = agent_pid(attempt, 2)
    os.kill(lost, signal.SIGKILL)
    grown = wait_until(
        lambda: next((c for c in world_changes(job) if c["joined"] and c.get("training_at")), None),
        240,
        "training in the grown world",
    )
    restored = agent_pid(attempt, 2)
    assert restored != lost
    # the survivors stayed through both changes; the restored agent forked its ranks of the new world itself
    for slot, pid in survivors.items():
        assert agent_pid(attempt, slot) == pid
    assert len(forked_since(restored, grown["formed_at"] - 1.0)) == 2
    # it joined after it was ready, at a checkpoint the smaller world wrote after that
    ready = (attempt / "world.ready.2").stat().st_mtime
    assert grown["at"] >= ready
    out, _ = launcher.communicate(timeout=300)
    assert launcher.returncode == 0, out
    (result,) = results(tmp_path)
    value = result["return_value"]
    assert result["status"] == "COMPLETED" and value["steps"] == 90 and value["world_size"] == 6
    assert value["global_batch_size"] == 48 and (value["micro_batch_size"], value["grad_accum"]) == (8, 1)
    assert value["weights_in_sync"] is True and len(value["weight_digests"]) == 6
    assert len(set(value["weight_digests"])) == 1
    shrunk, grown = result["world_changes"]
    assert (shrunk["lost"], shrunk["joined"], shrunk["world_after"]) == ([2], [], 4)
    assert (grown["generation"], grown["lost"], grown["joined"]) == (2, [], [2])
    assert (grown["nodes_before"], grown["nodes_after"], grown["world_before"], grown["world_after"]) == (2, 3, 4, 6)
    assert grown["batch_before"].startswith("global 48 = 4 ranks x micro 12")
    assert grown["batch_after"].startswith("global 48 = 6 ranks x micro 8")
    assert "node 2 restored: it joins the world after the next checkpoint" in out
    assert "world 2: node 2 joined: 2 -> 3 nodes, 4 -> 6 ranks" in out
    assert "COMPLETED  3 -> 2 -> 3 x 2" in out


def lose_nodes_2_then_1(job: Path) -> None:
    """Once training runs, node 2 is lost, and node 1 once the world formed without it: 1 node of 2:3 left."""
    wait_until(lambda: last_step(job) >= 2, 240, "training")
    attempt = attempt_of(job)
    os.kill(agent_pid(attempt, 2), signal.SIGKILL)
    wait_until(lambda: world_changes(job), 60, "the first change")
    os.kill(agent_pid(attempt, 1), signal.SIGKILL)


def test_below_its_minimum_the_job_fails_naming_the_lost_nodes(tmp_path, tag):
    launcher = launch(tmp_path, tag, "recipe.max_steps=400")
    lose_nodes_2_then_1(tmp_path / "0")
    out, _ = launcher.communicate(timeout=120)
    assert launcher.returncode != 0
    (result,) = results(tmp_path)
    assert result["status"] == "FAILED"
    assert (
        "lost node 2, 1 (its node agent died): 1 node(s) left, fewer than the 2 that num_nodes=2:3 needs"
        in (result["error"])
    ), result["error"]


def test_below_its_minimum_with_max_restarts_the_job_starts_again_on_every_node(tmp_path, tag):
    launcher = launch(tmp_path, tag, "recipe.max_steps=60", "hydra.launcher.max_restarts=1")
    lose_nodes_2_then_1(tmp_path / "0")
    out, _ = launcher.communicate(timeout=400)
    assert launcher.returncode == 0, out
    (result,) = results(tmp_path)
    assert result["status"] == "COMPLETED" and result["restarts"] == 1
    assert "lost node 2, 1 (its node agent died)" in result["earlier_runs"][0]["error"]
    # the restart is the whole job again, every node back (its world 0); the run before's change stays recorded
    assert result["return_value"]["world_size"] == 6 and result["return_value"]["steps"] == 60
    assert [(c["restart"], c["generation"], c["lost"]) for c in result["world_changes"]] == [(0, 1, [2])]


def test_ctrl_c_after_a_change_stops_every_node_and_leaves_nothing(tmp_path, tag):
    launcher = launch(tmp_path, tag, "recipe.max_steps=400")
    job = tmp_path / "0"
    wait_until(lambda: last_step(job) >= 2, 240, "training")
    attempt = attempt_of(job)
    os.kill(agent_pid(attempt, 0), signal.SIGKILL)  # node 0: the world's first node goes; 1 and 2 are the new 0 and 1
    change = wait_until(lambda: next((c for c in world_changes(job) if c.get("training_at")), None), 120, "a new world")
    assert change["lost"] == [0]
    launcher.send_signal(signal.SIGINT)
    out, _ = launcher.communicate(timeout=60)
    assert launcher.returncode != 0, out
    (result,) = results(tmp_path)
    assert result["status"] == "INTERRUPTED" and len(result["world_changes"]) == 1


def test_a_rank_that_dies_with_no_node_lost_fails_the_job_naming_it(tmp_path, tag):
    started = time.monotonic()
    launcher = launch(tmp_path, tag, "recipe.max_steps=400", "recipe.fail_rank=3", "recipe.fail_step=3")
    out, _ = launcher.communicate(timeout=300)
    assert launcher.returncode != 0, out
    (result,) = results(tmp_path)
    assert result["status"] == "FAILED" and world_changes(tmp_path / "0") == []
    assert result["failure"]["rank"] == 3 and result["failure"]["signal"] == "SIGKILL", result["failure"]
    assert time.monotonic() - started < 240


def test_the_dry_run_shows_each_worlds_batch_and_bad_ranges_are_one_line(tmp_path, tag):
    dry = subprocess.run(
        app_command(*ELASTIC_LM, "hydra.launcher.dry_run=true", sweep_dir=tmp_path),
        cwd=REPO,
        env=app_env(tag),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert dry.returncode == 0, dry.stderr
    assert "3 nodes x 2 devices = 6 ranks at the start; elastic (num_nodes=2:3)" in dry.stdout
    assert "on 2 nodes: global 48 = 4 ranks x micro 12 x accumulate 1" in dry.stdout
    for overrides, said in (
        (("num_nodes=3:2",), "Invalid num_nodes='3:2': an elastic range needs 1 <= MIN < MAX"),
        (("num_nodes=2:3", "devices=2"), "Invalid batch.global_size=64: an elastic job (num_nodes=2:3, devices=2)"),
        (
            (*ELASTIC_LM, "hydra.launcher.restore_lost_nodes_after_s=-1"),
            "Invalid hydra.launcher.restore_lost_nodes_after_s=-1: expected a number > 0",
        ),
    ):
        bad = subprocess.run(
            [sys.executable, str(REPO / "train.py"), "-m", *overrides, f"hydra.sweep.dir={tmp_path / 'bad'}"],
            cwd=REPO,
            env=app_env(tag),
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert bad.returncode != 0
        lines = [line for line in bad.stderr.splitlines() if line.strip()]
        assert lines[0].startswith(said), bad.stderr
        assert len(lines) == 1 or lines[1].startswith("Set the environment variable HYDRA_FULL_ERROR"), bad.stderr
        assert not (tmp_path / "bad").exists() or not list((tmp_path / "bad").glob("*/logs"))
