"""An elastic SLURM job (``num_nodes=MIN:MAX``, docs/elastic.md): its batch script runs this coordinator in place of
the one srun step of every node (``sbatch.with_elastic_coordinator``), in an allocation of MIN to MAX nodes that a
failed node does not end (``--no-kill``).

    python -m mmt.backends.slurm.elastic srun <the job's srun options> <python> -u -m mmt.backends.slurm.task <file>

* Each node of the allocation runs its elastic node agent in a step of its own (the job's srun line, ``-N1 -w
  <host>``, running ``mmt.backends.slurm.elastic_node``): a lost node ends its own step, not the others'. The nodes
  build each world's ranks themselves; the coordinator decides the worlds (``mmt.backends.elastic``) and writes
  where their nodes are.
* A node is lost when its step ends non-zero, or when its agent's heartbeat stops for ``SILENT_S``: SLURM does not
  end the step of a node whose slurmd died (nor holds the node down before ``SlurmdTimeout``), so the coordinator
  sees it first and ends that step itself.
* A lost node stays in the allocation (``--no-kill``): once its slurmd has started again and answers (``scontrol
  update state=resume`` after a node went down), the node gets a new step in the same allocation (``--overlap``:
  the dead step stays on record), whose agent is a spare that joins right after the next checkpoint. A new step that
  SLURM refuses a moment after the node came back is tried again. Never more than the allocation's nodes.
* Below MIN nodes, or when a rank fails with no node lost, every step is stopped and the coordinator exits 1: the
  batch script's restart loop (``max_restarts``) or its conclusion takes it from there (``world.failed`` says why).
"""

import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field, replace
from typing import Dict, List, Optional, Tuple

from mmt.backends.elastic import ElasticJob, WorldCoordinator, first_world
from mmt.backends.slurm.nodes import held_lost, node_hosts
from mmt.backends.slurm.task import SlurmTask, master_port
from mmt.core.jobdir import Attempt
from mmt.core.rank_env import MMT_RESTART_COUNT
from mmt.planning.plan import JobPlan
from mmt.records.payload import read_task
from mmt.records.world import DONE, World, record_failure

# a node whose agent has not beaten for this long is lost (its agent beats every second)
SILENT_S = 10.0
# a node's step that has not beaten once this long after it started is lost (its srun never reached the node)
FIRST_BEAT_S = 120.0
# how often the coordinator looks at its nodes, asks SLURM after its lost ones, tries again a step SLURM refused
LOOK_S, PROBE_S, RETRY_S = 0.2, 2.0, 3.0
# how long the steps may take to stop their ranks when the run stops, before they are killed
STOP_S = 30.0
# the module each node's step runs in place of the task runner
NODE_MODULE = "mmt.backends.slurm.elastic_node"


@dataclass(frozen=True)
class LostSlot:
    """A node lost from the world: when its slurmd had started (it comes back once that changes), and when to try it
    again after a step on it failed at once."""

    slurmd_started: str
    retry_at: float = 0.0


@dataclass
class NodeStep:
    """One node's step: its srun, and its agent's last heartbeat."""

    slot: int
    process: "subprocess.Popen[bytes]"
    spare_of: Optional[LostSlot] = None  # a node back: how it was lost (a step refused at once is tried again)
    started: float = field(default_factory=time.monotonic)
    beat: Optional[float] = None  # the heartbeat file's last mtime seen
    beat_seen: Optional[float] = None  # when it last changed (monotonic: the node's clock may differ)

    def silent(self, attempt: Attempt) -> bool:
        """Has its agent stopped beating (or never begun, FIRST_BEAT_S after its step started)?"""
        now = time.monotonic()
        try:
            mtime: Optional[float] = attempt.node_alive(self.slot).stat().st_mtime
        except FileNotFoundError:
            mtime = None
        if mtime is not None and mtime != self.beat:
            self.beat, self.beat_seen = mtime, now
        if self.beat_seen is None:
            return now - self.started > FIRST_BEAT_S
        return now - self.beat_seen > SILENT_S


class SlurmWorlds(WorldCoordinator):
    """The worlds of an elastic SLURM job: each world's MASTER_PORT derives from the job id and its generation,
    which every node computes alike, as it builds its own ranks: nothing to hand out."""

    # a lost node's peers fail in their collective at once; the node is seen lost SILENT_S later
    loss_grace_s = SILENT_S + 5.0

    def __init__(self, job_id: str) -> None:
        super().__init__(restore_after_s=None)  # a lost node comes back when SLURM says its slurmd answers again
        self.job_id = job_id

    def _start_world(self, job: ElasticJob, plan: JobPlan, slots: Tuple[int, ...]) -> bool:
        job.port = master_port(self.job_id, plan.generation)
        return True


def node_state(host: str) -> Tuple[str, str]:
    """(SLURM's state of ``host``, when its slurmd started), from ``scontrol show node``; ("", "") when unknown."""
    try:
        out = subprocess.run(
            ["scontrol", "show", "node", "--oneliner", host], capture_output=True, text=True, timeout=30
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return "", ""
    fields = dict(word.split("=", 1) for word in out.split() if "=" in word)
    return fields.get("State", ""), fields.get("SlurmdStartTime", "")


def node_step(srun: List[str], host: str, slot: int, spare: bool) -> List[str]:
    """The job's srun line (``srun <options> <python> -u -m mmt.backends.slurm.task <task file>``) for node ``slot``
    alone: one task on ``host``, its elastic node agent, its logs by slot (SLURM's ``%t`` is 0 in every one-task
    step); a spare with ``--overlap``."""
    head, *rest = srun
    words = [head, "--nodes=1", "--ntasks=1", f"--nodelist={host}", "--kill-on-bad-exit=0"]
    words += ["--overlap"] if spare else []
    words += [word.replace("%t", str(slot)) for word in rest[:-1] if not word.startswith("--kill-on-bad-exit")]
    words = [NODE_MODULE if word == "mmt.backends.slurm.task" else word for word in words]
    return [*words, rest[-1], str(slot), *(["--spare"] if spare else [])]


def answers(state: str) -> bool:
    """A node back for a step: SLURM does not hold it lost, nor has an admin drained it."""
    return bool(state) and not held_lost(state) and "DRAIN" not in state.upper()


class Coordinator:
    """Runs one elastic job's run in its allocation: a step per node, the worlds, the lost nodes back."""

    def __init__(self, task: SlurmTask, srun: List[str]) -> None:
        self.task, self.srun = task, srun
        self.job_id = os.environ["SLURM_JOB_ID"]
        self.hosts = node_hosts(os.environ["SLURM_JOB_NODELIST"])
        plan = task.plan.at_world(len(self.hosts), 0)  # --nodes=MIN-MAX: SLURM gave what it could
        restart = int(os.environ.get(MMT_RESTART_COUNT) or 0)
        self.job = first_world(plan, task.attempt, master_port(self.job_id), cwd=os.getcwd(), restart=restart)
        self.worlds = SlurmWorlds(self.job_id)
        self.steps: Dict[int, NodeStep] = {}
        self.lost: Dict[int, LostSlot] = {}  # lost slots, until they come back
        self.probed = 0.0
        self.stopping = False

    def run(self) -> int:
        signal.signal(signal.SIGTERM, self._terminate)  # scancel, the time limit: the steps stop with the script
        try:
            for slot in self.job.running.slots:
                self.steps[slot] = NodeStep(slot, self._srun(slot, spare=False))
            failure: Optional[str] = None
            while self.steps and not self.stopping and failure is None:
                failure = self._look()
                time.sleep(LOOK_S)
            if failure is not None or self.stopping:
                self._say(f"stopping every node: {failure or 'the job was told to stop'}")
                self._stop_all()
                return 1
            return 0 if not self.job.alive else 1
        finally:
            world = World.read(self.task.attempt)  # a spare still waiting to join goes
            if world is not None and world.state != DONE:
                World(world.generation, world.slots, DONE).write(self.task.attempt)

    def _look(self) -> Optional[str]:
        """One look at the nodes and the world; the run's failure, if it must stop."""
        attempt = self.task.attempt
        for slot, step in list(self.steps.items()):
            code = step.process.poll()
            if code is None and not step.silent(attempt):
                continue
            del self.steps[slot]
            if code == 0:
                self.worlds.node_done(self.job, slot)
                continue
            if code is None:  # silent: its node is gone (or its agent hangs): its step goes
                self._say(f"node {slot} ({self.hosts[slot]}) has not answered for {SILENT_S:g} s: lost")
                step.process.kill()
                step.process.wait()
            if step.spare_of is not None and step.beat_seen is None:  # SLURM refused the step: again, later
                self.job.spares.discard(slot)
                self.lost[slot] = replace(step.spare_of, retry_at=time.monotonic() + RETRY_S)
                continue
            if slot in self.job.spares:  # a spare that went after it started is given up, as on every backend
                self.worlds.node_lost(self.job, slot)
                continue
            self.lost[slot] = LostSlot(node_state(self.hosts[slot])[1])
            too_few = self.worlds.node_lost(self.job, slot)
            if too_few is not None:
                record_failure(attempt, too_few)
                return too_few
            if self.job.change is not None:
                self._say(self.job.change.describe())
        failure = self.worlds.tick(self.job)
        if failure is None and self.lost and self.job.alive and time.monotonic() - self.probed >= PROBE_S:
            self.probed = time.monotonic()
            self._probe_lost()
        return failure

    def _probe_lost(self) -> None:
        """A lost node whose slurmd started again and answers: a new step on it, a spare."""
        now = time.monotonic()
        for slot, lost in list(self.lost.items()):
            if now < lost.retry_at:
                continue
            state, started = node_state(self.hosts[slot])
            if answers(state) and started and started != lost.slurmd_started:
                del self.lost[slot]
                self.worlds.node_back(self.job, slot)
                self.steps[slot] = NodeStep(slot, self._srun(slot, spare=True), spare_of=lost)
                self._say(f"node {slot} ({self.hosts[slot]}) is back; it joins the world after the next checkpoint")

    def _srun(self, slot: int, spare: bool) -> "subprocess.Popen[bytes]":
        """The job's srun line for node ``slot`` alone: one task there, its agent (a spare: ``--overlap``, since
        the step that died with the node stays on record)."""
        self.task.attempt.node_alive(slot).unlink(missing_ok=True)
        return subprocess.Popen(node_step(self.srun, self.hosts[slot], slot, spare), stdin=subprocess.DEVNULL)

    def _stop_all(self) -> None:
        """Every step's agent told to stop its ranks (SIGTERM, which srun passes on); killed after STOP_S."""
        for step in self.steps.values():
            step.process.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + STOP_S
        for step in self.steps.values():
            try:
                step.process.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                step.process.kill()
                step.process.wait()

    def _terminate(self, signum: int, frame: object) -> None:
        self.stopping = True

    def _say(self, what: str) -> None:
        stamp = time.strftime("%H:%M:%S")
        print(f"mmt: {stamp} {self.task.plan.name}: {what}", file=sys.stderr, flush=True)


def main(argv: List[str]) -> int:
    """``srun <options> <python> -u -m mmt.backends.slurm.task <task file>``: the job's srun line."""
    if not argv or argv[0] != "srun":
        raise SystemExit("usage: python -m mmt.backends.slurm.elastic srun <the job's srun line>")
    task = read_task(argv[-1], SlurmTask, "an mmt SLURM task")
    return Coordinator(task, argv).run()


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
