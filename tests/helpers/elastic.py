"""An elastic local job as its tests watch it: its attempt dir, a node's agent, its world changes; losing a node."""

import json
import os
import signal
from pathlib import Path
from typing import List, Tuple

from helpers.processes import wait_until


def attempt_of(job: Path) -> Path:
    return wait_until(lambda: next(iter((job / ".mmt" / "attempts").glob("*/")), None), 60, "the job's attempt dir")


def agent_pid(attempt: Path, slot: int) -> int:
    return int(json.loads((attempt / f"agent.{slot}.json").read_text())["pid"])


def world_changes(job: Path) -> List[dict]:
    try:
        return [json.loads(line) for line in (job / "world.jsonl").read_text().splitlines() if line.strip()]
    except FileNotFoundError:
        return []


def lose_node(job: Path, slot: int) -> int:
    """SIGKILL node ``slot``'s agent (its ranks die with it: parent-death signal); the pid it had."""
    pid = agent_pid(attempt_of(job), slot)
    os.kill(pid, signal.SIGKILL)
    return pid


def training_after(job: Path, generation: int) -> dict:
    """World change ``generation`` once its world trains (its rank 0's first step)."""
    return wait_until(
        lambda: next((c for c in world_changes(job) if c["generation"] == generation and c.get("training_at")), None),
        240,
        f"training in world {generation}",
    )


def assert_shrank_and_grew_back(result: dict, out: str) -> Tuple[dict, dict]:
    """recipe=lm 2:3 x 2, 90 steps, global batch 48, node 2 lost and back: the job completed on 6 ranks with the
    weights identical on all, the batch held through 6 -> 4 -> 6 ranks, and the console said each change; the two
    changes (for the backend's own checks)."""
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
    assert (grown["generation"], grown["lost"], grown["joined"], grown["world_after"]) == (2, [], [2], 6)
    assert "world 1: lost node 2: 3 -> 2 nodes, 6 -> 4 ranks" in out, out[-4000:]
    assert "world 2: node 2 joined: 2 -> 3 nodes, 4 -> 6 ranks" in out
    assert "COMPLETED  3 -> 2 -> 3 x 2" in out
    return shrunk, grown
