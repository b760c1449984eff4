"""The node agent of an elastic job (``num_nodes=MIN:MAX``): one interpreter runs the node's ranks world after world.

A lost node costs that node, not the job. The agent watches the job's world (``mmt.records.world``): when its
coordinator decides a new one (a node lost, or one joined), the agent stops its ranks, says they are gone, and once
the new world runs, forks its ranks of that world from the same warm interpreter, with the new rank contract (a new
``MASTER_PORT``, ``MMT_WORLD_GENERATION`` one higher, the batch split for the new world): no new submission, no
second ``import torch``, the same agent PID. The ranks resume from their last checkpoint.

When its ranks fail with no new world decided (a rank that raised, not a lost peer), the agent waits: the
coordinator, which sees which nodes are gone, either forms a new world or stops the job (SIGTERM), and the agent
exits non-zero then. Its ranks all succeeding ends the agent with 0: the job's training is over.
"""

import pickle
import time
from pathlib import Path
from typing import Optional

from mmt.agent.node import NodeAgent, NodeRun
from mmt.core.jobdir import Attempt
from mmt.records.payload import open_private
from mmt.records.world import RUNNING, World, mark_ended

# how often an agent looks at the world file while its ranks run, and while it waits for the next world
_LOOK_S = 0.05


def run_elastic(first: NodeRun, slot: int) -> int:
    """Run node ``slot``'s ranks of every world it is part of; the code of the last run (0: training is over)."""
    agent = NodeAgent(first, slot=slot)
    attempt = agent.attempt
    node, generation = first, 0
    looked = {"at": 0.0, "newer": False}

    def newer_world() -> bool:
        now = time.monotonic()
        if now - looked["at"] >= _LOOK_S:
            looked["at"] = now
            world = World.read(attempt)
            looked["newer"] = world is not None and world.generation > generation
        return bool(looked["newer"])

    while True:
        looked.update(at=0.0, newer=False)
        code = agent.run(node, stop_when=newer_world)
        mark_ended(attempt, slot, generation, code)
        if agent.terminated or (code == 0 and not newer_world()):
            break
        world = _next_world(attempt, generation, agent)
        if world is None or slot not in world.slots:
            break
        generation = world.generation
        node = _node_run(attempt, slot, generation)
    agent.finish(code)
    return code


def _next_world(attempt: Attempt, generation: int, agent: NodeAgent) -> Optional[World]:
    """The first running world after ``generation``; None once the agent is told to stop."""
    while not agent.terminated:
        world = World.read(attempt)
        if world is not None and world.generation > generation and world.state == RUNNING:
            return world
        time.sleep(_LOOK_S)
    return None


def _node_run(attempt: Attempt, slot: int, generation: int) -> NodeRun:
    with open_private(Path(attempt.elastic_node_run(slot, generation))) as handle:  # written by this user's launcher
        node: NodeRun = pickle.load(handle)
    return node


def main() -> None:
    """``python -m mmt.agent.elastic <node run file>``: node ``slot``'s agent of an elastic job, started with its
    ranks of the first world (its slot is the node's rank there)."""
    import os
    import sys

    (path,) = sys.argv[1:]
    with open_private(Path(path)) as handle:  # written by this user's launcher, never by anyone else
        first: NodeRun = pickle.load(handle)
    code = run_elastic(first, slot=first.node_rank)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)  # no interpreter teardown (torch's is tenths of a second)


if __name__ == "__main__":
    main()
