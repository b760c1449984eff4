"""An elastic Ray job (``num_nodes=MIN:MAX``, docs/elastic.md), as its driver runs it: every node's actor runs an
elastic node agent (``mmt.agent.elastic``), and the driver coordinates the world (``mmt.backends.elastic``).

* A node whose actor gives no answer (its Ray node lost, its worker killed) or whose agent ends non-zero is a lost
  node: the world forms again without it. The nodes' actors write their own ranks of each new world (their
  environment is the actor's, as for the first), and the new world's node 0 holds its MASTER_PORT.
* A lost node's bundle is asked for again at once: a new actor in it waits until Ray places the bundle on a node
  (the lost one back, or another that fits), then runs a spare agent that joins at the next re-formation (right
  after the next checkpoint). Never more than the job's MAX nodes: the placement group has MAX bundles.
* Ray tells a lost node from a slow one only after its health checks fail (seconds), so a rank failure with no node
  lost waits ``LOSS_GRACE_S`` here before it is the job's failure.
"""

import sys
import time
from typing import Any, Callable, Dict, List, Optional, Set, Tuple

from mmt.backends.elastic import ElasticJob, WorldCoordinator, first_world
from mmt.backends.ray.actor import NodeFacts
from mmt.core.jobdir import Attempt
from mmt.planning.environment import Rendezvous
from mmt.planning.plan import JobPlan

# a rank failure with no node lost is the job's failure once this long has passed without one: Ray holds a lost node
# dead after its health checks fail (3 s on the test cluster, up to 30 s with Ray's defaults)
LOSS_GRACE_S = 15.0
# how long the nodes of a new world may take to answer (hold its port, write their ranks)
ANSWER_S = 30.0

# (the node's slot, a name that is new in the cluster) -> a new actor in that node's bundle
NewActor = Callable[[int, str], Any]


class RayWorlds(WorldCoordinator):
    """The coordinator of an elastic Ray job's run: the worlds of its node actors."""

    loss_grace_s = LOSS_GRACE_S

    def __init__(self, actors: List[Any], facts: List[NodeFacts], restart: int) -> None:
        super().__init__(restore_after_s=None)  # a node comes back when Ray places its bundle again
        self.actors, self.facts, self.restart = actors, facts, restart

    def _start_world(self, job: ElasticJob, plan: JobPlan, slots: Tuple[int, ...]) -> bool:
        import ray
        from ray.exceptions import GetTimeoutError, RayActorError

        try:
            port = ray.get(self.actors[slots[0]].hold_world_port.remote(), timeout=ANSWER_S)
            meet = Rendezvous(self.facts[slots[0]].ip, port, node_addrs=tuple(self.facts[s].ip for s in slots))
            refs = [
                self.actors[slot].prepare_world.remote(plan, rank, meet, self.restart)
                for rank, slot in enumerate(slots)
            ]
            ray.get(refs, timeout=ANSWER_S)
        except (RayActorError, GetTimeoutError):
            return False  # a node of the world went meanwhile: its loss forms the world again
        job.port = port
        return True


class ElasticRun:
    """One run of an elastic Ray job, as its driver watches it: each node's end, the world's changes, the nodes
    that come back. ``failure``: why the run must stop now; ``too_few``: that failure, when too few nodes are left
    (the run's conclusion says it)."""

    def __init__(
        self,
        plan: JobPlan,
        attempt: Attempt,
        actors: List[Any],
        facts: List[NodeFacts],
        master_port: int,
        restart: int,
        new_actor: NewActor,
    ) -> None:
        self.worlds = RayWorlds(actors, facts, restart)
        self.job = first_world(plan, attempt, master_port, cwd="", restart=restart)
        self.actors, self.new_actor, self.restart = actors, new_actor, restart
        self.retired: List[Any] = []  # the actors of lost nodes (released with the run)
        self.placing: Dict[Any, Tuple[int, Any]] = {}  # a lost node's new actor, until Ray places it: prepare()
        self.failure: Optional[str] = None
        self.too_few: Optional[str] = None
        self._asked = 0
        self._said: Set[Tuple[int, bool]] = set()  # (generation, training seen) of the changes said

    @property
    def plan(self) -> JobPlan:
        """The plan of the world that ran last."""
        return self.job.plan

    def ended(self, slot: int, code: Optional[int]) -> None:
        """Node ``slot``'s actor answered: its agent's exit code, or None (it died, with its Ray node or not)."""
        if code == 0:
            self.worlds.node_done(self.job, slot)
            return
        if slot in self.job.spares:  # a node back that went before it joined: given up, as on every backend
            self.worlds.node_lost(self.job, slot)
            self.retired.append(self.actors[slot])
            return
        if slot not in self.job.alive:
            return
        failed = self.worlds.node_lost(self.job, slot)
        if failed is not None:
            self.failure = self.too_few = failed
            return
        self._say_change()
        self.retired.append(self.actors[slot])
        self._ask_again(slot)

    def tick(self) -> Dict[Any, int]:
        """Move the world on; the runs of nodes that came back, to watch (ref -> slot)."""
        import ray

        failed = self.worlds.tick(self.job)
        if failed is not None and self.failure is None:
            self.failure = failed
        self._say_change()
        started: Dict[Any, int] = {}
        if not self.placing:
            return started
        ready, _ = ray.wait(list(self.placing), num_returns=len(self.placing), timeout=0)
        for ref in ready:
            slot, actor = self.placing.pop(ref)
            try:
                facts: NodeFacts = ray.get(ref)
            except Exception:  # noqa: BLE001 - its new node went too: asked again
                self.retired.append(actor)
                self._ask_again(slot)
                continue
            if not self.job.alive or self.failure is not None:
                self.retired.append(actor)
                continue
            self.actors[slot], self.worlds.facts[slot] = actor, facts
            self.worlds.node_back(self.job, slot)
            self._say(f"node {slot} back on {facts.ip}: it joins the world after the next checkpoint")
            started[actor.run_spare.remote()] = slot
        return started

    def release(self) -> List[Any]:
        """Every actor the run made besides the ones that run now: to kill with the run."""
        return self.retired + [actor for _, actor in self.placing.values()]

    def _ask_again(self, slot: int) -> None:
        """A new actor in the lost node's bundle: Ray places it once the bundle has a node again."""
        self._asked += 1
        actor = self.new_actor(slot, f"node{slot}.back{self._asked}")
        self.placing[actor.prepare.remote()] = (slot, actor)

    def _say_change(self) -> None:
        """The last change, once when it is decided and once when its world trains (as the launcher says it)."""
        change = self.job.change
        if change is None or (change.generation, change.training_at is not None) in self._said:
            return
        self._said.add((change.generation, change.training_at is not None))
        self._say(change.describe())

    def _say(self, what: str) -> None:
        stamp = time.strftime("%H:%M:%S")
        print(f"mmt: {stamp} {self.job.plan.name}: {what}", file=sys.stderr, flush=True)
