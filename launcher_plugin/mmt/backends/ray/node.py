"""mmt's node agent on a Ray node: ``python -u -m mmt.backends.ray.node [--elastic [--spare]]``, started by the node's
actor (``mmt.backends.ray.actor``) with the node's :class:`~mmt.agent.node.NodeRun` on its stdin (an elastic job's:
``mmt.agent.elastic``, its first world's ranks, or a spare's none).

It runs the same agent as a SLURM node (``mmt.agent.node.run``): imports the job's preload once, forks the node's
ranks, stops them all when one fails, watches the job for hangs, samples the node's metrics. It never imports ray:
a plain interpreter, whose forked ranks inherit no Ray worker threads. It dies with its actor (parent-death signal:
SIGTERM, so that its ranks are stopped, as on ``ray.kill`` or a lost worker process).
"""

import os
import pickle
import signal
import sys
from pathlib import Path

from mmt.agent.elastic import run_elastic
from mmt.agent.node import NodeRun
from mmt.agent.node import run as run_node
from mmt.core import proctree, timeline
from mmt.core.jobdir import Attempt


def main() -> int:
    parent = os.getppid()
    proctree.set_parent_death_signal(signal.SIGTERM)
    if os.getppid() != parent:  # the actor went before the signal was armed
        return 1
    node = pickle.load(sys.stdin.buffer)
    if not isinstance(node, NodeRun):
        raise TypeError(f"stdin holds a {type(node).__name__}, not an mmt NodeRun")
    path = Attempt(Path(node.attempt_dir)).timeline
    timeline.mark_at(path, timeline.TASK_START, timeline.process_start_time(), node=node.node_rank)
    timeline.mark_at(path, timeline.AGENT_START, node=node.node_rank)
    args = sys.argv[1:]
    if "--elastic" in args:  # an elastic job's node: its ranks world after world (its slot: its node of world 0)
        return run_elastic(node, slot=node.node_rank, spare="--spare" in args)
    return run_node(node)


if __name__ == "__main__":
    sys.exit(main())
