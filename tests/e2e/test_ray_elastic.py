"""Elastic jobs (``num_nodes=MIN:MAX``) on the real Ray test cluster (scripts/ray_cluster.sh: a head and three workers
on this host): recipe=lm on 2:3 nodes x 2, real gloo, real Lightning; a worker lost as a machine is lost
(``ray_cluster.sh fail-node``: its raylet and every process on it SIGKILLed). The job's driver forms the world again
on the nodes left: the surviving node agents (children of their nodes' actors) stay, the same PIDs, and fork the new
world's ranks; the lost node's bundle, placed again once the worker is back (``revive-node``), runs a spare that
joins right after the next checkpoint. Below MIN nodes the job fails naming them. After every test no Ray job of mmt
runs and no node actor is alive (test_ray.py's fixture)."""

import subprocess
import time
from pathlib import Path

from e2e.test_elastic import forked_since, last_step, launch
from e2e.test_ray import _cluster, on_ray, placement  # noqa: F401 - fixture
from e2e.test_ray_faults import CLUSTER, _worker_of, lose_node  # noqa: F401 - fixture
from helpers.app import results
from helpers.elastic import agent_pid, attempt_of, world_changes
from helpers.processes import wait_gone, wait_until


def _training_after(job: Path, generation: int) -> dict:
    """World change ``generation`` once its world trains (its rank 0's first step)."""
    return wait_until(
        lambda: next((c for c in world_changes(job) if c["generation"] == generation and c.get("training_at")), None),
        240,
        f"training in world {generation}",
    )


def test_a_lost_ray_node_costs_that_node_and_the_node_back_joins_after_the_next_checkpoint(tmp_path, tag, lose_node):  # noqa: F811 - fixture
    launcher = launch(tmp_path, tag, *on_ray(tag), "recipe.max_steps=90")
    job = tmp_path / "0"
    try:
        wait_until(lambda: last_step(job) >= 24, 300, "step 24 (after the step-20 checkpoint)")
        attempt = attempt_of(job)
        nodes = placement(job)
        assert len({node["ip"] for node in nodes}) == 3, nodes  # three Ray workers of their own
        survivors = {slot: agent_pid(attempt, slot) for slot in (0, 1)}
        lost_at = time.time()
        lose_node(nodes[2]["ip"])
        shrunk = _training_after(job, 1)
        # the surviving agents are the same processes; the new world's ranks are their children, forked from their
        # warm interpreters (no second import of torch)
        for slot, pid in survivors.items():
            assert agent_pid(attempt, slot) == pid
            assert len(forked_since(pid, shrunk["formed_at"] - 1.0)) == 2, (slot, pid)
        # the worker comes back: the lost node's bundle is placed on it again, and a spare there joins the world
        subprocess.run([str(CLUSTER), "revive-node", _worker_of(nodes[2]["ip"])], check=True, timeout=180)
        grown = _training_after(job, 2)
        back = agent_pid(attempt, 2)
        assert len(forked_since(back, grown["formed_at"] - 1.0)) == 2
        assert grown["at"] >= (attempt / "world.ready.2").stat().st_mtime  # it joined once it was ready
        for slot, pid in survivors.items():
            assert agent_pid(attempt, slot) == pid
        out, _ = launcher.communicate(timeout=300)
    finally:
        launcher.kill()
    assert launcher.returncode == 0, out[-4000:]
    (result,) = results(tmp_path)
    assert result["status"] == "COMPLETED", result
    value = result["return_value"]
    assert value["steps"] == 90 and value["world_size"] == 6 and value["resumed_from_checkpoint"] is True
    assert value["global_batch_size"] == 48 and (value["micro_batch_size"], value["grad_accum"]) == (8, 1)
    assert value["weights_in_sync"] is True and len(value["weight_digests"]) == 6
    assert len(set(value["weight_digests"])) == 1
    shrunk, grown = result["world_changes"]
    assert (shrunk["lost"], shrunk["joined"]) == ([2], [])
    assert (shrunk["nodes_before"], shrunk["nodes_after"], shrunk["world_before"], shrunk["world_after"]) == (
        3,
        2,
        6,
        4,
    )
    assert shrunk["batch_before"].startswith("global 48 = 6 ranks x micro 8")
    assert shrunk["batch_after"].startswith("global 48 = 4 ranks x micro 12")
    assert 0 < shrunk["at"] - lost_at < 20, shrunk  # Ray's health checks: about 3 s here
    assert (grown["generation"], grown["lost"], grown["joined"], grown["world_after"]) == (2, [], [2], 6)
    assert "world 1: lost node 2: 3 -> 2 nodes, 6 -> 4 ranks" in out, out[-4000:]
    assert "world 2: node 2 joined: 2 -> 3 nodes, 4 -> 6 ranks" in out
    assert "COMPLETED  3 -> 2 -> 3 x 2" in out
    assert wait_gone(tag, timeout_s=15) == []


def test_below_min_nodes_the_elastic_ray_job_fails_naming_the_lost_nodes(tmp_path, tag, lose_node):  # noqa: F811 - fixture
    launcher = launch(tmp_path, tag, *on_ray(tag), "recipe.max_steps=400")
    job = tmp_path / "0"
    try:
        wait_until(lambda: last_step(job) >= 4, 300, "training")
        nodes = placement(job)
        lose_node(nodes[2]["ip"])
        wait_until(lambda: world_changes(job), 60, "the first change")
        lose_node(nodes[1]["ip"])
        out, _ = launcher.communicate(timeout=180)
    finally:
        launcher.kill()
    assert launcher.returncode != 0
    (result,) = results(tmp_path)
    assert result["status"] == "FAILED", result
    assert result["error"].endswith(
        "lost node 2, 1 (its node agent died): 1 node(s) left, fewer than the 2 that num_nodes=2:3 needs"
    ), result["error"]
    assert wait_gone(tag, timeout_s=15) == []
