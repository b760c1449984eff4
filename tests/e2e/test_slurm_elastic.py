"""Elastic jobs (``num_nodes=MIN:MAX``) on the real SLURM test cluster (scripts/slurm_cluster.sh: three nodes on this
host): recipe=lm on 2:3 nodes x 2, real gloo, real Lightning, one sbatch (``--nodes=2-3 --no-kill``) whose batch
script runs the coordinator, one step per node. A node is lost as a machine is (``slurm_cluster.sh fail-node``: its
slurmd and every process on it SIGKILLed): the coordinator sees its agent's heartbeat stop, forms the world again on
the nodes left (the surviving agents the same PIDs, forking the new ranks), and once the node's slurmd is back
(``revive-node``: started again, ``scontrol update state=resume``) runs a spare step there, which joins right after
the next checkpoint. Below MIN nodes the job fails naming them. After every test nothing is queued or left."""

import json
import subprocess
import time
from pathlib import Path

import pytest

from e2e.test_elastic import forked_since, last_step, launch
from helpers.app import results
from helpers.elastic import agent_pid, attempt_of, world_changes
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


def _training_after(job: Path, generation: int) -> dict:
    """World change ``generation`` once its world trains (its rank 0's first step)."""
    return wait_until(
        lambda: next((c for c in world_changes(job) if c["generation"] == generation and c.get("training_at")), None),
        240,
        f"training in world {generation}",
    )


def _job_nodes(job_id: str) -> str:
    out = subprocess.run(["squeue", "-h", "-j", job_id, "-o", "%D %N"], capture_output=True, text=True).stdout
    return out.strip()


def _scheduler_id(job: Path) -> str:
    def found() -> str:
        record = next(iter((job / ".mmt" / "attempts").glob("*/scheduler.json")), None)
        return str(json.loads(record.read_text()).get("scheduler_id") or "") if record is not None else ""

    return wait_until(found, 60, "the SLURM job id")


def test_a_lost_slurm_node_costs_that_node_and_the_node_back_joins_after_the_next_checkpoint(tmp_path, tag, lost_nodes):
    launcher = launch(tmp_path, tag, "cluster=slurm", "recipe.max_steps=90")
    job = tmp_path / "0"
    try:
        wait_until(lambda: last_step(job) >= 24, 300, "step 24 (after the step-20 checkpoint)")
        job_id = _scheduler_id(job)
        assert _job_nodes(job_id) == "3 node[1-3]"  # --nodes=2-3: all three, where they are free
        attempt = attempt_of(job)
        survivors = {slot: agent_pid(attempt, slot) for slot in (0, 1)}
        lost_at = time.time()
        lost_nodes.append("node3")
        lose_node("node3")
        shrunk = _training_after(job, 1)
        # the surviving agents are the same processes; the new world's ranks are their children, forked from their
        # warm interpreters (no second import of torch)
        for slot, pid in survivors.items():
            assert agent_pid(attempt, slot) == pid
            assert len(forked_since(pid, shrunk["formed_at"] - 1.0)) == 2, (slot, pid)
        # the node comes back: a spare step on it in the same allocation, which joins after the next checkpoint
        lost_nodes.remove("node3")
        revive_node("node3")
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
    assert value["weights_in_sync"] is True and len(set(value["weight_digests"])) == 1
    assert len(value["weight_digests"]) == 6
    shrunk, grown = result["world_changes"]
    assert (shrunk["lost"], shrunk["joined"], shrunk["world_before"], shrunk["world_after"]) == ([2], [], 6, 4)
    assert shrunk["batch_before"].startswith("global 48 = 6 ranks x micro 8")
    assert shrunk["batch_after"].startswith("global 48 = 4 ranks x micro 12")
    # seen lost once its agent's heartbeat stopped for 10 s (SLURM does not end a dead node's step)
    assert 5 < shrunk["at"] - lost_at < 40, shrunk
    assert (grown["generation"], grown["lost"], grown["joined"], grown["world_after"]) == (2, [], [2], 6)
    assert "world 1: lost node 2: 3 -> 2 nodes, 6 -> 4 ranks" in out, out[-4000:]
    assert "world 2: node 2 joined: 2 -> 3 nodes, 4 -> 6 ranks" in out
    assert "COMPLETED  3 -> 2 -> 3 x 2" in out
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
