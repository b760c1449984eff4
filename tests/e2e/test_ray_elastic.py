"""Elastic jobs (``num_nodes=MIN:MAX``) on the real Ray test cluster (scripts/ray_cluster.sh: a head and three workers
on this host): recipe=lm on 2:3 nodes x 2, real gloo, real Lightning; a worker lost as a machine is lost
(``ray_cluster.sh fail-node``: its raylet and every process on it SIGKILLed). The job's driver forms the world again
on the nodes left: the surviving node agents (children of their nodes' actors) stay, the same PIDs, and fork the new
world's ranks; the lost node's bundle, placed again once the worker is back (``revive-node``), runs a spare that
joins right after the next checkpoint. Below MIN nodes the job fails naming them. After every test no Ray job of mmt
runs and no node actor is alive (test_ray.py's fixture)."""

import subprocess
import time

from e2e.test_elastic import forked_since, last_step, launch
from e2e.test_ray import _cluster, on_ray, placement  # noqa: F401 - fixture
from e2e.test_ray_faults import CLUSTER, _worker_of, lose_node  # noqa: F401 - fixture
from helpers.app import results
from helpers.elastic import agent_pid, assert_shrank_and_grew_back, attempt_of, training_after, world_changes
from helpers.processes import wait_gone, wait_until


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
        shrunk = training_after(job, 1)
        # the surviving agents are the same processes; the new world's ranks are their children, forked from their
        # warm interpreters (no second import of torch)
        for slot, pid in survivors.items():
            assert agent_pid(attempt, slot) == pid
            assert len(forked_since(pid, shrunk["formed_at"] - 1.0)) == 2, (slot, pid)
        # the worker comes back: the lost node's bundle is placed on it again, and a spare there joins the world
        subprocess.run([str(CLUSTER), "revive-node", _worker_of(nodes[2]["ip"])], check=True, timeout=180)
        grown = training_after(job, 2)
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
    shrunk, _ = assert_shrank_and_grew_back(result, out)
    assert 0 < shrunk["at"] - lost_at < 20, shrunk  # Ray's health checks: about 3 s here
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
