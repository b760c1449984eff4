"""How an elastic job's world changes (``num_nodes=MIN:MAX``, docs/elastic.md), for every backend that runs one.

Every node of the job is a node agent of its own (``mmt.agent.elastic``) that runs its ranks world after world; the
backend's coordinator (a :class:`WorldCoordinator`, in the process that watches the job) decides the world
(``mmt.records.world``). A backend says only how a world's ranks reach its node agents (:meth:`_start_world`: the
new world's MASTER_PORT held, each agent's run written) and how a lost node comes back.

* A node agent that dies (killed, crashed, its machine lost) is a lost node. With at least MIN nodes left, the world
  forms again: the coordinator writes the new world as ``forming``; every surviving agent stops its ranks and says
  so; then the coordinator sets the old world's records aside, plans the new world (the same global batch, split for
  it; a new ``MASTER_PORT``; ``MMT_WORLD_GENERATION`` one higher), has each agent's ranks written and marks the world
  ``running``, and the agents fork them from their warm interpreters. Fewer than MIN: the job fails, naming the lost
  nodes.
* A rank that fails while no node is lost (it raised) fails the job, as in any job: the agents wait for the
  coordinator's word, which, after ``LOSS_GRACE_S`` without a lost node, is to stop.
* A node that comes back runs its agent as a spare: it imports the preload, says it is ready, and joins at the next
  re-formation: the next loss, or right after the running world's next checkpoint (its ranks touch
  ``MMT_CHECKPOINT_MARK``), so at most once per checkpoint interval and without losing the training since. A spare
  that dies before it joins is given up.
* Each change is a line of ``world.jsonl`` (:class:`mmt.records.world.WorldChange`), with the time from the loss to
  the new world's first training step (its rank 0's first heartbeat).
"""

import time
from dataclasses import dataclass, field, replace
from typing import Dict, List, Optional, Set, Tuple

from mmt.agent.node import NodeRun
from mmt.agent.processes import ProcessSpec
from mmt.core.jobdir import Attempt
from mmt.core.rank_env import MMT_CHECKPOINT_MARK
from mmt.core.stacks import HEARTBEAT_VAR
from mmt.planning.plan import JobPlan
from mmt.records.world import DONE, FORMING, RUNNING, World, WorldChange, ended_code, ready_at, record_change

# a rank failure with no lost node is the job's failure once this long has passed without one: a lost node's peers
# may fail in their collective a moment before the backend learns that the lost node's agent is gone
LOSS_GRACE_S = 1.0


@dataclass
class ElasticJob:
    """One elastic job's world, as its coordinator keeps it."""

    plan: JobPlan  # the plan of the world that runs (or ran last, while the next forms)
    attempt: Attempt
    running: World  # the world that runs (or ran last)
    alive: Set[int]  # the node slots of the world whose agents are alive
    port: int  # the running world's MASTER_PORT
    cwd: str
    restart: int = 0  # the job's run (MMT_RESTART_COUNT)
    forming: Optional[World] = None
    change: Optional[WorldChange] = None  # the last change, until its first training step is seen
    failed_seen: Optional[float] = None
    lost: List[int] = field(default_factory=list)
    lost_at: Dict[int, float] = field(default_factory=dict)  # lost slots to restore: when they were lost (monotonic)
    spares: Set[int] = field(default_factory=set)  # slots back whose agents run, in no world yet
    given_up: Set[int] = field(default_factory=set)  # slots back whose agents died before they joined

    @property
    def world(self) -> World:
        return self.forming or self.running


def first_world(plan: JobPlan, attempt: Attempt, port: int, cwd: str, restart: int = 0) -> ElasticJob:
    """World 0 of a run, every node of the plan, written for the agents. A restart (``restart``: its count) starts
    from world 0 again, every node back: the records of the run before's worlds go."""
    stale = (
        "world.ended.*",
        "world.ready.*",
        "node.*.g*.pkl",
        "node.*.alive",
        attempt.checkpoint_mark.name,
        attempt.world_failed.name,
    )
    for path in [found for pattern in stale for found in attempt.dir.glob(pattern)]:
        path.unlink(missing_ok=True)
    slots = tuple(range(plan.num_nodes))
    job = ElasticJob(
        plan=plan,
        attempt=attempt,
        running=World(0, slots, RUNNING),
        alive=set(slots),
        port=port,
        cwd=cwd,
        restart=restart,
    )
    job.running.write(attempt)
    return job


def elastic_rank(attempt: Attempt, spec: ProcessSpec) -> ProcessSpec:
    """An elastic world's rank, told where to mark its checkpoints and, where hangs are not watched, where to beat:
    rank 0's first beat in a new world is its first training step (the change's ``to_training_s``)."""
    mark = {MMT_CHECKPOINT_MARK: str(attempt.checkpoint_mark)}
    return replace(spec, env={HEARTBEAT_VAR: str(attempt.heartbeat_file(spec.index)), **spec.env, **mark})


def spare_run(plan: JobPlan, attempt_dir: str, slot: int, kill_grace_s: float, start_method: str) -> NodeRun:
    """What a node back after it was lost starts its agent with: no ranks until a world has it."""
    return NodeRun(
        job_id=plan.job_id,
        node_rank=slot,
        job_dir=plan.job_dir,
        attempt_dir=attempt_dir,
        kill_grace_s=kill_grace_s,
        preload=plan.preload,
        method=start_method,
        processes=(),
        metrics_interval_s=plan.metrics_interval_s,
        snapshot=plan.snapshot,
    )


class WorldCoordinator:
    """Forms an elastic job's world again as nodes are lost and come back; a backend says how a world starts."""

    # how long a rank failure with no node lost waits for a loss before it is the job's failure (None: LOSS_GRACE_S)
    loss_grace_s: Optional[float] = None

    def __init__(self, restore_after_s: Optional[float] = None) -> None:
        self.restore_after_s = restore_after_s  # a lost node comes back this long after (None: it stays lost)

    def _start_world(self, job: ElasticJob, plan: JobPlan, slots: Tuple[int, ...]) -> bool:
        """Hold the MASTER_PORT of world ``plan.generation`` (``job.port``; the running world's is free now) and
        write each of its node agents' ranks (``attempt.elastic_node_run(slot, generation)``), ``slots`` in
        node-rank order. False: a node of it went meanwhile (the world stays forming: its loss forms it again)."""
        raise NotImplementedError

    def release(self, job: ElasticJob) -> None:
        """The job ended: what it holds (its world's MASTER_PORT) goes."""

    def node_lost(self, job: ElasticJob, slot: int) -> Optional[str]:
        """Node ``slot``'s agent died: form the world again without it (with the spares ready to join); the job's
        failure when too few are left. A spare that dies is given up."""
        if slot in job.spares:
            job.spares.discard(slot)
            job.given_up.add(slot)
            return None
        if slot not in job.alive:
            return None
        job.alive.discard(slot)
        job.lost.append(slot)
        if self.restore_after_s is not None:
            job.lost_at[slot] = time.monotonic()
        elastic = job.plan.elastic
        assert elastic is not None
        joining = self._ready_spares(job)
        if len(job.alive) + len(joining) < elastic.min_nodes:
            return (
                f"lost node {', '.join(map(str, job.lost))} (its node agent died): {len(job.alive)} node(s) left, "
                f"fewer than the {elastic.min_nodes} that num_nodes={elastic.label} needs"
            )
        self._form(job, lost=(slot,), joining=joining)
        return None

    def node_back(self, job: ElasticJob, slot: int) -> None:
        """Node ``slot``'s agent runs again, as a spare: it joins once it says it is ready (``world.ready.<slot>``)."""
        job.lost_at.pop(slot, None)
        job.attempt.world_ready(slot).unlink(missing_ok=True)
        job.spares.add(slot)

    def node_done(self, job: ElasticJob, slot: int) -> None:
        """Node ``slot``'s agent ended well (its ranks finished training): no world forms with it any more."""
        job.alive.discard(slot)
        job.spares.discard(slot)
        if job.forming is not None and slot in job.forming.slots:
            job.forming = replace(job.forming, slots=tuple(s for s in job.forming.slots if s != slot))
            job.forming.write(job.attempt)
        if not job.alive:  # training is over: a spare waiting to join goes, and no lost node comes back
            replace(job.world, state=DONE).write(job.attempt)
            job.lost_at.clear()

    def due_back(self, job: ElasticJob) -> List[int]:
        """The lost slots whose time to come back has come (``restore_after_s`` after their loss)."""
        if self.restore_after_s is None or not job.lost_at:
            return []
        now = time.monotonic()
        return [slot for slot, at in job.lost_at.items() if now - at >= self.restore_after_s]

    def tick(self, job: ElasticJob) -> Optional[str]:
        """Move the job's world on: start a world that has formed, note the first training step after a change;
        the job's failure when a rank failed and no node was lost (after the grace)."""
        if job.forming is not None:
            self._maybe_run(job)
            return None
        joining = self._ready_spares(job)
        if joining and self._checkpointed_since(job, joining):
            self._form(job, lost=(), joining=joining)
            return None
        change = job.change
        if change is not None and change.training_at is None and change.formed_at is not None:
            heartbeat = job.attempt.heartbeat_file(0)
            if heartbeat.exists():
                job.change = replace(change, training_at=heartbeat.stat().st_mtime)
                record_change(job.attempt.job_dir, job.change)
        failed = [
            slot for slot in job.running.slots if ended_code(job.attempt, slot, job.running.generation) not in (None, 0)
        ]
        if not failed:
            job.failed_seen = None
            return None
        now = time.monotonic()
        if job.failed_seen is None:
            job.failed_seen = now
        if now - job.failed_seen < (LOSS_GRACE_S if self.loss_grace_s is None else self.loss_grace_s):
            return None
        return f"a rank failed on node {failed[0]} with no node lost"

    def _maybe_run(self, job: ElasticJob) -> None:
        """Once every agent of the forming world has stopped its ranks: plan the world, give each agent its ranks,
        and mark it running."""
        forming, attempt = job.forming, job.attempt
        assert forming is not None
        previous = job.running.generation
        if any(ended_code(attempt, slot, previous) is None for slot in forming.slots if slot in job.running.slots):
            return
        attempt.set_generation_aside(previous)
        plan = job.plan.at_world(len(forming.slots), forming.generation)
        if not self._start_world(job, plan, forming.slots):
            return
        job.plan, job.running, job.forming, job.failed_seen = plan, replace(forming, state=RUNNING), None, None
        joined = job.spares.intersection(forming.slots)
        job.spares -= joined
        job.alive |= joined
        job.running.write(attempt)
        if job.change is not None:
            job.change = replace(job.change, formed_at=time.time())
            record_change(attempt.job_dir, job.change)

    def _form(self, job: ElasticJob, lost: Tuple[int, ...], joining: Tuple[int, ...]) -> None:
        """Decide the next world: the nodes alive, and the spares ``joining``, in slot order; record the change."""
        generation = job.running.generation + 1
        earlier = job.change if job.forming is not None and job.change is not None else None  # changed while forming
        if earlier is not None:
            assert job.forming is not None
            joining = tuple(sorted({*joining, *(slot for slot in job.forming.slots if slot in job.spares)}))
        job.forming = World(generation, tuple(sorted(job.alive | set(joining))), FORMING)
        job.forming.write(job.attempt)
        after = job.plan.at_world(len(job.forming.slots), generation)
        job.change = WorldChange(
            generation=generation,
            at=earlier.at if earlier is not None else time.time(),
            lost=(*(earlier.lost if earlier is not None else ()), *lost),
            joined=joining,
            nodes_before=job.plan.num_nodes,
            nodes_after=after.num_nodes,
            world_before=job.plan.world_size,
            world_after=after.world_size,
            batch_before=job.plan.batch.describe() if job.plan.batch else None,
            batch_after=after.batch.describe() if after.batch else None,
            restart=job.restart,
        )
        record_change(job.attempt.job_dir, job.change)

    def _ready_spares(self, job: ElasticJob) -> Tuple[int, ...]:
        """The nodes back whose agents are ready to join, at most as many as the range's MAX leaves room for."""
        elastic = job.plan.elastic
        assert elastic is not None
        ready = sorted(slot for slot in job.spares if ready_at(job.attempt, slot) is not None)
        return tuple(ready[: max(0, elastic.max_nodes - len(job.alive))])

    def _checkpointed_since(self, job: ElasticJob, joining: Tuple[int, ...]) -> bool:
        """Has the running world written a checkpoint since the spares were ready (and since it started)? Then they
        join now: the new world resumes from that checkpoint, so the change costs no training."""
        try:
            marked = job.attempt.checkpoint_mark.stat().st_mtime
        except FileNotFoundError:
            return False
        since = [ready_at(job.attempt, slot) or marked for slot in joining]
        if job.change is not None and job.change.formed_at is not None:
            since.append(job.change.formed_at)
        return marked > max(since)
