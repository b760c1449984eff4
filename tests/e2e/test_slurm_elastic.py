"""Elastic jobs (``num_nodes=MIN:MAX``) on the real SLURM test cluster (scripts/slurm_cluster.sh: three nodes on this
host): recipe=lm on 2:3 nodes x 2, real gloo, real Lightning, one sbatch (``--nodes=2-3 --no-kill``) whose batch
script runs the coordinator, one step per node. A node is lost as a machine is (``slurm_cluster.sh fail-node``: its
slurmd and every process on it SIGKILLed): the coordinator sees its agent's heartbeat stop, forms the world again on
the nodes left (the surviving agents the same PIDs, forking the new ranks), and once the node's slurmd is back
(``revive-node``: started again, ``scontrol update state=resume``) runs a spare step there, which joins right after
the next checkpoint. Below MIN nodes the job fails naming them. After every test nothing is queued or left."""

import subprocess
import time

import pytest

from e2e.test_elastic import forked_since, last_step, launch
from e2e.test_slurm_faults import _job_id
from helpers.app import results
from helpers.elastic import agent_pid, assert_shrank_and_grew_back, attempt_of, training_after, world_changes
from helpers.processes import wait_gone, wait_until
from helpers.slurm import cluster_nodes, lose_node, revive_node

pytestmark = pytest.mark.slurm


@pytest.fixture(autouse=True)
def _cluster(slurm_cluster):
    if cluster_nodes() < 3:
        pytest.skip("a 2:3 job that loses a node needs a test cluster of 3 nodes (MMT_SLURM_NODES=3, the default)")
    yield


@pytest.fixture
def lost_nodes():
    """The nodes a test loses, started again however it ends."""
    lost: list = []
    yield lost
    if lost:
        revive_node(*lost)


def _job_nodes(job_id: str) -> str:
    out = subprocess.run(["squeue", "-h", "-j", job_id, "-o", "%D %N"], capture_output=True, text=True).stdout
    return out.strip()


def test_a_lost_slurm_node_costs_that_node_and_the_node_back_joins_after_the_next_checkpoint(tmp_path, tag, lost_nodes):
    launcher = launch(tmp_path, tag, "cluster=slurm", "recipe.max_steps=90")
    job = tmp_path / "0"
    try:
        wait_until(lambda: last_step(job) >= 24, 300, "step 24 (after the step-20 checkpoint)")
        job_id = _job_id(tmp_path)
        assert _job_nodes(job_id) == "3 node[1-3]"  # --nodes=2-3: all three, where they are free
        attempt = attempt_of(job)
        survivors = {slot: agent_pid(attempt, slot) for slot in (0, 1)}
        lost_at = time.time()
        lost_nodes.append("node3")
        lose_node("node3")
        shrunk = training_after(job, 1)
        # the surviving agents are the same processes; the new world's ranks are their children, forked from their
        # warm interpreters (no second import of torch)
        for slot, pid in survivors.items():
            assert agent_pid(attempt, slot) == pid
            assert len(forked_since(pid, shrunk["formed_at"] - 1.0)) == 2, (slot, pid)
        # the node comes back: a spare step on it in the same allocation, which joins after the next checkpoint
        lost_nodes.remove("node3")
        revive_node("node3")
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
    # seen lost once its agent's heartbeat stopped for 10 s (SLURM does not end a dead node's step)
    assert 5 < shrunk["at"] - lost_at < 40, shrunk
    assert wait_gone(tag, timeout_s=30) == []


def test_below_min_nodes_the_elastic_slurm_job_fails_naming_the_lost_nodes(tmp_path, tag, lost_nodes):
    launcher = launch(tmp_path, tag, "cluster=slurm", "recipe.max_steps=400")
    job = tmp_path / "0"
    try:
        wait_until(lambda: last_step(job) >= 4, 300, "training")
        lost_nodes.append("node3")
        lose_node("node3")
        wait_until(lambda: world_changes(job), 60, "the first change")
        lost_nodes.append("node2")
        lose_node("node2")
        out, _ = launcher.communicate(timeout=180)
    finally:
        launcher.kill()
    assert launcher.returncode != 0
    (result,) = results(tmp_path)
    assert result["status"] == "FAILED", result
    assert result["error"].endswith(
        "lost node 2, 1 (its node agent died): 1 node(s) left, fewer than the 2 that num_nodes=2:3 needs"
    ), result["error"]
    assert wait_gone(tag, timeout_s=30) == []
