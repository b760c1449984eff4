"""An elastic local job as its tests watch it: its attempt dir, a node's agent, its world changes; losing a node."""

import json
import os
import signal
from pathlib import Path
from typing import List

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
