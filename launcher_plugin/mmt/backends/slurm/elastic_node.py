"""One node of an elastic SLURM job, in a step of its own that the job's coordinator started
(``mmt.backends.slurm.elastic``):

    python -u -m mmt.backends.slurm.elastic_node <task file> <slot> [--spare]

Its agent (``mmt.agent.elastic``) runs the node's ranks world after world. Each world's ranks are built here, from
the world's record and the allocation's hosts (slot i: its i-th host), with this node's environment, as every node
builds its own; the world's node 0 holds its MASTER_PORT (derived from the job id and the world's generation) while
its ranks start. The agent beats (``node.<slot>.alive``) every second: SLURM does not end the step of a node whose
slurmd died, the coordinator sees the silence. A spare (a lost node back) joins at the next re-formation.
"""

import contextlib
import os
import signal
import sys
import threading
from pathlib import Path
from typing import List

from mmt.agent.elastic import run_elastic
from mmt.agent.node import NodeRun
from mmt.backends.elastic import spare_run
from mmt.backends.slurm.nodes import node_hosts
from mmt.backends.slurm.task import SLURM_ENV, SlurmTask, hold_or_report, master_port
from mmt.core import timeline
from mmt.core.jobdir import JobDir
from mmt.planning.environment import Rendezvous
from mmt.records.payload import read_task
from mmt.records.world import World

# how often the agent beats
BEAT_S = 1.0


def run(task: SlurmTask, slot: int, spare: bool = False) -> int:
    """Node ``slot``'s agent until training is over (0), or until it is stopped or its ranks fail (non-zero)."""
    attempt = task.attempt
    facts = {key: os.environ.get(name, "") for key, name in SLURM_ENV.items()}
    hosts = node_hosts(facts["nodelist"])
    signal.signal(signal.SIGTERM, signal.SIG_DFL)  # its agent takes SIGTERM over once it runs
    JobDir(Path(task.plan.job_dir)).logs.mkdir(parents=True, exist_ok=True)
    timeline.mark_at(attempt.timeline, timeline.TASK_START, timeline.process_start_time(), node=slot)
    stop = threading.Event()
    threading.Thread(target=_beat, args=(attempt.node_alive(slot), stop), daemon=True).start()
    code = 1
    with contextlib.ExitStack() as held:

        def world_run(world: World) -> NodeRun:
            plan = task.plan.at_world(len(world.slots), world.generation)
            addrs = tuple(hosts[s] for s in world.slots)
            meet = Rendezvous(addrs[0], master_port(facts["job_id"], world.generation), node_addrs=addrs)
            rank = world.slots.index(slot)
            if rank == 0:
                held.close()  # the world before's port goes: its ranks are gone
                if not hold_or_report(int(str(meet.master_port)), "MASTER_PORT", attempt, 0, held):
                    raise RuntimeError(f"MASTER_PORT {meet.master_port} is in use on {addrs[0]}")
            return task.node_run(facts, rank, meet, plan=plan)

        try:
            if spare:  # no ranks until a world has it
                first = spare_run(task.plan, task.attempt_dir, slot, task.kill_grace_s, task.start_method)
            else:
                world = World.read(attempt)
                assert world is not None, "the coordinator writes world 0 before it starts the nodes"
                first = world_run(world)
            code = run_elastic(first, slot, spare=spare, world_run=world_run)
        finally:
            stop.set()
    return code


def _beat(path: Path, stop: threading.Event) -> None:
    path.touch()
    while not stop.wait(BEAT_S):
        path.touch()


def main(argv: List[str]) -> int:
    task_file, slot, *rest = argv
    task = read_task(task_file, SlurmTask, "an mmt SLURM task")
    code = run(task, int(slot), spare=rest == ["--spare"])
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)  # no interpreter teardown (torch's is tenths of a second)


if __name__ == "__main__":
    main(sys.argv[1:])
