"""The coordinator of an elastic local job (``num_nodes=MIN:MAX``): every simulated node is a node agent of its own
(``python -m mmt.agent.elastic``, started by the host agent, which does not stop the others when one dies), and this
coordinator decides the job's world (``mmt.records.world``).

* A node agent that dies (killed, crashed) is a lost node. With at least MIN nodes left, the world forms again: the
  coordinator writes the new world as ``forming``; every surviving agent stops its ranks and says so; then the
  coordinator sets the old world's records aside, plans the new world (the same global batch, split for it; a new
  ``MASTER_PORT``; ``MMT_WORLD_GENERATION`` one higher), writes each agent's ranks and marks the world ``running``,
  and the agents fork them from their warm interpreters. Fewer than MIN: the job fails, naming the lost nodes.
* A rank that fails while no node is lost (it raised) fails the job, as in any job: the agents wait for the
  coordinator's word, which, after ``LOSS_GRACE_S`` without a lost node, is to stop.
* A lost node comes back when ``hydra.launcher.restore_lost_nodes_after_s`` says so (this host is still there: the
  simulated machine restored): its agent starts again as a spare, imports the preload, says it is ready, and joins
  at the next re-formation: the next loss, or right after the running world's next checkpoint (its ranks touch
  ``MMT_CHECKPOINT_MARK``), so at most once per checkpoint interval and without losing the training since. A spare
  that dies before it joins is not restored again.
* Each change is a line of ``world.jsonl`` (:class:`mmt.records.world.WorldChange`), with the time from the loss to
  the new world's first training step (its rank 0's first heartbeat).
"""

import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Callable, Dict, List, Optional, Sequence, Set, Tuple

from mmt.agent.processes import ProcessSpec
from mmt.backends.local import agents
from mmt.core.jobdir import Attempt
from mmt.core.rank_env import MMT_CHECKPOINT_MARK
from mmt.core.stacks import HEARTBEAT_VAR
from mmt.planning.environment import Rendezvous
from mmt.planning.plan import JobPlan
from mmt.records.world import DONE, FORMING, RUNNING, World, WorldChange, ended_code, ready_at, record_change

# a rank failure with no lost node is the job's failure once this long has passed without one: a lost node's peers
# may fail in their collective a moment before the host agent reports the lost node's agent gone
LOSS_GRACE_S = 1.0

# the rank specs of a world: (its plan, where its ranks meet) -> every process, its node_rank the world's
RankSpecs = Callable[[JobPlan, Rendezvous], List[ProcessSpec]]


@dataclass
class ElasticJob:
    """One elastic job's world, as its coordinator keeps it."""

    plan: JobPlan  # the plan of the world that runs (or ran last, while the next forms)
    attempt: Attempt
    running: World  # the world that runs (or ran last)
    alive: Set[int]  # the node slots of the world whose agents are alive
    port: int
    cwd: str
    restart: int = 0  # the job's run (MMT_RESTART_COUNT)
    forming: Optional[World] = None
    change: Optional[WorldChange] = None  # the last change, until its first training step is seen
    failed_seen: Optional[float] = None
    lost: List[int] = field(default_factory=list)
    lost_at: Dict[int, float] = field(default_factory=dict)  # lost slots to restore: when they were lost (monotonic)
    spares: Set[int] = field(default_factory=set)  # restored slots whose agents run, in no world yet
    given_up: Set[int] = field(default_factory=set)  # restored slots whose agents died before they joined

    @property
    def world(self) -> World:
        return self.forming or self.running


class ElasticCoordinator:
    """Starts an elastic job's node agents and forms its world again as nodes are lost."""

    def __init__(
        self,
        *,
        master_addr: str,
        kill_grace_s: float,
        start_method: str,
        rank_specs: RankSpecs,
        reserve_port: Callable[[], int],
        release_port: Callable[[int], None],
        restore_after_s: Optional[float] = None,
    ) -> None:
        self.master_addr, self.kill_grace_s, self.start_method = master_addr, kill_grace_s, start_method
        self.rank_specs, self.reserve_port, self.release_port = rank_specs, reserve_port, release_port
        self.restore_after_s = restore_after_s  # a lost node comes back this long after (None: it stays lost)

    def start(
        self, plan: JobPlan, attempt: Attempt, port: int, cwd: str, restart: int = 0
    ) -> Tuple[ElasticJob, List[ProcessSpec]]:
        """The first world, every node of the plan; the host agent's processes: one node agent per node. A restart
        (``restart``: its count) starts from world 0 again, every node back: the run before's worlds are gone."""
        stale = ("world.ended.*", "world.ready.*", "node.*.g*.pkl", attempt.checkpoint_mark.name)
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
        ranks = self._ranks(job, plan, port)
        job.running.write(attempt)
        processes = []
        for slot in slots:
            path = attempt.node_run(slot)
            self._write_node_run(path, plan, attempt, slot, [spec for spec in ranks if spec.node_rank == slot])
            processes.append(agents.agent_process(plan, attempt, slot, agents.here("mmt.agent.elastic", path), cwd))
        return job, processes

    def node_lost(self, job: ElasticJob, slot: int) -> Optional[str]:
        """Node ``slot``'s agent died: form the world again without it (with the spares ready to join); the job's
        failure when too few are left. A spare that dies is not restored again."""
        if slot in job.spares:
            job.spares.discard(slot)
            job.given_up.add(slot)
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

    def restore_due(self, job: ElasticJob) -> List[ProcessSpec]:
        """The agents of lost nodes whose time to come back has come, as spares: the host agent's processes to add."""
        if self.restore_after_s is None or not job.lost_at:
            return []
        now = time.monotonic()
        due = [slot for slot, at in job.lost_at.items() if now - at >= self.restore_after_s]
        processes = []
        for slot in due:
            del job.lost_at[slot]
            job.attempt.world_ready(slot).unlink(missing_ok=True)
            path = job.attempt.node_run(slot)
            self._write_node_run(path, job.plan, job.attempt, slot, ())
            argv = (*agents.here("mmt.agent.elastic", path), "--spare")
            processes.append(agents.agent_process(job.plan, job.attempt, slot, argv, job.cwd))
            job.spares.add(slot)
        return processes

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
        if now - job.failed_seen < LOSS_GRACE_S:
            return None
        return f"a rank failed on node {failed[0]} with no node lost"

    def release(self, job: ElasticJob) -> None:
        self.release_port(job.port)

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
        self.release_port(job.port)
        job.port = self.reserve_port()
        ranks = self._ranks(job, plan, job.port)
        for rank, slot in enumerate(forming.slots):
            mine = [spec for spec in ranks if spec.node_rank == rank]
            self._write_node_run(attempt.elastic_node_run(slot, forming.generation), plan, attempt, rank, mine)
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
        """The restored nodes whose agents are ready to join, at most as many as the range's MAX leaves room for."""
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

    def _ranks(self, job: ElasticJob, plan: JobPlan, port: int) -> List[ProcessSpec]:
        """The world's rank specs, each told where to mark its checkpoints and, where hangs are not watched, where
        to beat: rank 0's first beat in a new world is its first training step (the change's ``to_training_s``)."""
        mark = {MMT_CHECKPOINT_MARK: str(job.attempt.checkpoint_mark)}
        return [
            replace(spec, env={HEARTBEAT_VAR: str(job.attempt.heartbeat_file(spec.index)), **spec.env, **mark})
            for spec in self.rank_specs(plan, self._rendezvous(plan, port))
        ]

    def _rendezvous(self, plan: JobPlan, port: int) -> Rendezvous:
        # every simulated node is this host: one address for all
        return Rendezvous(self.master_addr, port, node_addrs=(self.master_addr,) * plan.num_nodes)

    def _write_node_run(
        self, path: Path, plan: JobPlan, attempt: Attempt, node_rank: int, processes: Sequence[ProcessSpec]
    ) -> None:
        agents.write_node_run(
            path,
            plan,
            attempt,
            node_rank,
            processes,
            kill_grace_s=self.kill_grace_s,
            method=self.start_method,
            preload=plan.preload,
        )
