"""The node agent of an elastic job (``num_nodes=MIN:MAX``): one interpreter runs the node's ranks world after world.

A lost node costs that node, not the job. The agent watches the job's world (``mmt.records.world``): when its
coordinator decides a new one (a node lost, or a restored one joining), the agent stops its ranks, says they are
gone, and once the new world runs, forks its ranks of that world from the same warm interpreter, with the new rank
contract (a new ``MASTER_PORT``, ``MMT_WORLD_GENERATION`` one higher, the batch split for the new world): no new
submission, no second ``import torch``, the same agent PID. The ranks resume from their last checkpoint. A restored
node's agent starts as a spare (``--spare``): it imports the preload, says it is ready, and waits for a world that
has it.

When its ranks fail with no new world decided (a rank that raised, not a lost peer), the agent waits: the
coordinator, which sees which nodes are gone, either forms a new world or stops the job (SIGTERM), and the agent
exits non-zero then. Its ranks all succeeding ends the agent with 0: the job's training is over.
"""

import pickle
import time
from pathlib import Path
from typing import Callable, Optional

from mmt.agent.node import NodeAgent, NodeRun
from mmt.core.jobdir import Attempt
from mmt.records.payload import open_private
from mmt.records.world import DONE, RUNNING, World, mark_ended, mark_ready

# how often an agent looks at the world file while its ranks run, and while it waits for the next world
_LOOK_S = 0.05


# a world that runs -> this node's ranks of it (where the node builds them itself, as on SLURM)
WorldRun = Callable[[World], NodeRun]


def run_elastic(first: NodeRun, slot: int, spare: bool = False, world_run: Optional[WorldRun] = None) -> int:
    """Run node ``slot``'s ranks of every world it is part of; the code of the last run (0: training is over).
    ``spare``: a node restored after it was lost: it imports the preload, says it is ready, and waits for a world
    that has it (the coordinator adds it at the next re-formation). ``world_run``: how the node's ranks of a later
    world are built (default: read from the file the backend wrote for it)."""
    agent = NodeAgent(first, slot=slot)
    attempt = agent.attempt
    node: Optional[NodeRun] = first
    generation = 0
    if spare:
        world = World.read(attempt)
        generation = world.generation if world is not None else 0
        mark_ready(attempt, slot)
        node = None
    looked = {"at": 0.0, "newer": False}

    def newer_world() -> bool:
        now = time.monotonic()
        if now - looked["at"] >= _LOOK_S:
            looked["at"] = now
            world = World.read(attempt)
            looked["newer"] = world is not None and world.generation > generation
        return bool(looked["newer"])

    code = 0
    while True:
        if node is not None:
            looked.update(at=0.0, newer=False)
            code = agent.run(node, stop_when=newer_world)
            mark_ended(attempt, slot, generation, code)
            if agent.terminated or (code == 0 and not newer_world()):
                break
        world = _next_world(attempt, generation, slot, agent, waiting=node is None)
        if world is None:
            break
        generation = world.generation
        node = world_run(world) if world_run is not None else _node_run(attempt, slot, generation)
    agent.finish(code)
    return code


def _next_world(attempt: Attempt, generation: int, slot: int, agent: NodeAgent, waiting: bool) -> Optional[World]:
    """The first running world after ``generation`` that has node ``slot``; None once the agent is told to stop,
    once training is over, or when that world leaves it out (unless it is ``waiting`` to join: a spare waits on)."""
    while not agent.terminated:
        world = World.read(attempt)
        if world is not None and world.state == DONE:
            return None
        if world is not None and world.generation > generation and world.state == RUNNING:
            if slot in world.slots:
                return world
            if not waiting:
                return None
            generation = world.generation
        time.sleep(_LOOK_S)
    return None


def _node_run(attempt: Attempt, slot: int, generation: int) -> NodeRun:
    with open_private(Path(attempt.elastic_node_run(slot, generation))) as handle:  # written by this user's launcher
        node: NodeRun = pickle.load(handle)
    return node


def main() -> None:
    """``python -m mmt.agent.elastic <node run file> [--spare]``: node ``slot``'s agent of an elastic job, started
    with its ranks of the first world (its slot is the node's rank there), or, restored, as a spare with none."""
    import os
    import sys

    path, *spare = sys.argv[1:]
    with open_private(Path(path)) as handle:  # written by this user's launcher, never by anyone else
        first: NodeRun = pickle.load(handle)
    code = run_elastic(first, slot=first.node_rank, spare=spare == ["--spare"])
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)  # no interpreter teardown (torch's is tenths of a second)


if __name__ == "__main__":
    main()
