"""The driver of an mmt Ray job: ``python -u -m mmt.backends.ray.driver <attempt dir>/task.pkl``, the Ray job's
entrypoint, on the head. What the batch script, its restart loop and its last step are on SLURM, in one process:

1. place the run: one placement group of ``num_nodes`` bundles, STRICT_SPREAD (each mmt node a Ray node of its own),
   checked first against what the alive nodes have in all, so that a run that can never be placed fails at once,
   saying what it asks and what the cluster has, instead of pending for ever (one that waits for busy nodes says
   so in ``scheduler.json``);
2. one actor per bundle (``mmt.backends.ray.actor``): each says where it landed and holds the job's ports there;
   MASTER_ADDR is node 0's Ray address, MMT_NODE_ADDRS every node's, in node order; then each runs its node's agent,
   which forks the node's ranks;
3. watch: the first node whose agent fails, or whose Ray node is lost, stops the others; so do the job's time limit
   and a stop (``ray job stop``, which ``mmt stop`` and the launcher's Ctrl-C use: SIGTERM here);
4. conclude the run (``conclusion``); a failed one starts again (``max_restarts``), whole, on a new placement
   group: on the nodes that are left when they fit, MMT_RESTART_COUNT one higher;
5. write the job's ``result.json`` (unless its launcher concluded it first): a detached job, or one whose launcher
   was killed, still says how it ended.
"""

import json
import logging
import signal
import sys
import time
from dataclasses import dataclass, field, replace
from functools import partial
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple

from mmt.backends.ray import placement
from mmt.backends.ray.actor import NodeActor, NodeFacts
from mmt.backends.ray.api import ClusterNode
from mmt.backends.ray.conclusion import LostNode, RunEnd, conclude
from mmt.backends.ray.elastic import ElasticRun
from mmt.backends.ray.task import RayTask, read_task_file, write_placement
from mmt.core import timeline
from mmt.core.jobdir import JobDir, write_atomic
from mmt.core.states import JobState
from mmt.planning.environment import Rendezvous, RoleSite, roles_document
from mmt.records import restarts
from mmt.records.outcome import (
    JobOutcome,
    error_for,
    read_primary_return,
    result_record,
    return_value_of,
    write_result,
)
from mmt.records.ownership import read_owner
from mmt.records.payload import discard_payload
from mmt.records.scheduler import SchedulerRecord, read_scheduler, write_scheduler
from mmt.records.schema import EarlierRun

_TICK_S = 0.2
# how often a run waiting for its placement group checks that it can still be placed (nodes may be lost meanwhile)
CHECK_EVERY_S = 1.0
# how long a stopped node may take beyond its kill grace to answer
STOP_MARGIN_S = 5.0
# how long the driver waits for Ray to tell a lost node from a slow one (its health checks: seconds on the test
# cluster, up to half a minute with Ray's defaults)
NODE_DEATH_WAIT_S = 60.0
# why a stop that mmt did not ask for came (nothing in scheduler.json)
STOPPED_OUTSIDE = "the Ray job was stopped (ray job stop)"
# how long a run that did not complete waits to tell its head going (its supervisor gone) from its own end
HEAD_EXIT_WAIT_S = 1.5
# Ray's words for an actor whose owner, this driver, it holds dead: the driver lost its head (raylet, GCS)
OWNER_DIED = "because its owner has died"


class ClusterGone(Exception):
    """The head went under the driver (Ray holds the driver dead, or its GCS does not answer): what the driver saw
    of its nodes is the cluster's end, not theirs, so it concludes nothing; the launcher's grace does
    (``hydra.launcher.cluster_grace_s``), as for a head lost with its driver."""


class StopSignal:
    """SIGTERM or SIGINT (``ray job stop`` sends SIGTERM, and SIGKILL 3 s later): a flag the loops check."""

    def __init__(self) -> None:
        self.at: Optional[float] = None
        self.install()

    def install(self) -> None:
        """(Again, after ``ray.init``, which may install handlers of its own: these win.)"""
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, self._received)

    def _received(self, signum: int, _frame: object) -> None:
        if self.at is None:
            self.at = time.time()


@dataclass
class NodeEnd:
    """How one node's actor answered: its agent's exit code, or why it gave none."""

    # the agent's exit code (run), or where the node landed (prepare: NodeFacts)
    value: Any = None
    error: Optional[str] = None
    # Ray's error was "unavailable" (maybe its node dies, maybe not yet known)
    unavailable: bool = False


@dataclass
class Placed:
    """A run's placement group and its node actors, with where each landed."""

    group: Any
    actors: List[Any]
    node_ids: List[str] = field(default_factory=list)
    facts: List[NodeFacts] = field(default_factory=list)
    # an elastic run (num_nodes=MIN:MAX): its worlds, and the actors it made besides ``actors``
    elastic: Optional[ElasticRun] = None


def cluster_nodes() -> List[ClusterNode]:
    """Every node the cluster knows (GCS), in the launcher's terms (``api.ClusterNode``); ``ClusterGone`` when the
    GCS does not answer (the head is going)."""
    import ray

    try:
        nodes = ray.nodes()
    except Exception as exc:  # noqa: BLE001 - any failure to reach the GCS
        raise ClusterGone(f"its GCS does not answer: {_said(exc)}") from exc
    return [
        ClusterNode(
            ip=str(node.get("NodeManagerAddress") or ""),
            node_id=str(node.get("NodeID") or ""),
            alive=bool(node.get("Alive")),
            head="node:__internal_head__" in (node.get("Resources") or {}),
            resources={str(k): float(v) for k, v in (node.get("Resources") or {}).items()},
        )
        for node in nodes
    ]


class Driver:
    """Runs the job's runs until one does not fail, or no restart is left; returns how the job ended."""

    def __init__(self, task: RayTask, stop: StopSignal) -> None:
        import ray

        self.task, self.stop = task, stop
        self.plan, self.attempt, self.sid = task.plan, task.attempt, task.submission_id
        self.remote = ray.remote(NodeActor)
        self.used_s = 0.0  # of the job's time limit, by its earlier runs

    # ------------------------------------------------------------------------------------------ the runs

    def run_all(self) -> JobOutcome:
        restart, failed = 0, None
        while True:
            end = self._run(restart)
            if end.refused is not None and failed is not None:
                # the nodes left cannot hold the job: the run that failed is its last, and says why it stays so
                restarts.unrecord_last_run(self.attempt)
                return _cannot_restart(self.plan, failed, end.refused)
            outcome = conclude(end.plan or self.plan, self.attempt, end, self.sid)
            if outcome.status != JobState.FAILED or restart >= self.plan.max_restarts or self._stopped() is not None:
                return outcome
            self._record_failure(restart, outcome, end)
            if not self._back_off():  # stopped while it waited: the failed run is the job's last
                restarts.unrecord_last_run(self.attempt)
                restarts.clear_pending_restart(self.attempt)
                return outcome
            restart, failed = restart + 1, outcome

    def _run(self, restart: int) -> RunEnd:
        started = time.time()
        placed, refused = self._place(restart)
        if placed is None:
            return RunEnd(started, time.time(), stopped_because=self._stopped(), refused=refused)
        try:
            return self._run_placed(placed, restart, time.time())
        finally:
            self._release(placed)

    def _run_placed(self, placed: Placed, restart: int, started: float) -> RunEnd:
        """Where each node landed (and the ports it holds), then every node's agent, to the end of the run."""
        deadline = time.monotonic() + max(0.0, self.plan.timeout_s - self.used_s)
        prepare = {actor.prepare.remote(): node for node, actor in enumerate(placed.actors)}
        ends, stopped_at, timed_out = self._watch(placed, prepare, deadline, starting=True)
        if len(ends) == self.plan.num_nodes and all(end.error is None for end in ends.values()):
            facts: List[NodeFacts] = [ends[node].value for node in range(self.plan.num_nodes)]
            placed.facts = facts
            rendezvous = Rendezvous(
                facts[0].ip,
                facts[0].master_port,
                node_addrs=tuple(f.ip for f in facts),
                # the framework's ports in process order: node by node, each node's processes in order
                framework_ports=tuple(port for f in facts for _, port in sorted(f.framework_ports.items())),
            )
            write_placement(self.attempt, restart, [_placement_row(f) for f in facts])
            sites = self._role_sites(facts)
            if self.plan.elastic is not None:  # the driver forms the world again as nodes go and come back
                new_actor = partial(self._new_actor, placed.group, restart)
                assert facts[0].master_port is not None
                placed.elastic = ElasticRun(
                    self.plan, self.attempt, placed.actors, facts, facts[0].master_port, restart, new_actor
                )
            run = {actor.run.remote(rendezvous, restart, sites): node for node, actor in enumerate(placed.actors)}
            ends, stopped_at, timed_out = self._watch(placed, run, deadline)
        elastic = placed.elastic
        # an elastic run's lost nodes were its worlds' changes, not its end (too few left: its failure says so)
        lost, died = self._lost_and_died(placed, ends) if elastic is None else ([], [])
        end = RunEnd(
            started_at=started,
            ended_at=time.time(),
            stopped_because=self._stopped(),
            stopped_at=stopped_at,
            timed_out=timed_out,
            lost=tuple(lost),
            died=tuple(died),
            too_few=elastic.too_few if elastic is not None else None,
            plan=elastic.plan if elastic is not None else None,
        )
        self.used_s += end.duration_s
        return end

    def _role_sites(self, facts: List[NodeFacts]) -> Optional[Dict[str, RoleSite]]:
        """A job with roles: where each role landed (its first node's address and ports), written to the roles file
        before any of its agents starts; None without roles."""
        if not self.plan.roles:
            return None
        sites = {}
        for role in self.plan.roles:
            first = facts[role.first_node]
            addrs = tuple(facts[node].ip for node in role.nodes)
            sites[role.name] = RoleSite(Rendezvous(first.ip, first.master_port, node_addrs=addrs), first.role_port)
        document = json.dumps(roles_document(self.plan, sites), indent=2) + "\n"
        write_atomic(JobDir(Path(self.plan.job_dir)).roles_file, document.encode())
        return sites

    # ------------------------------------------------------------------------------------------ placing

    def _place(self, restart: int) -> Tuple[Optional[Placed], Optional[str]]:
        """The run's placement group, ready, and its actors; or (None, why) when it can never be placed (None
        when stopped while waiting)."""
        import ray
        from ray.util.placement_group import placement_group, remove_placement_group

        refused = self._refusal()
        if refused is not None:
            return None, refused
        bundles = [dict(bundle) for bundle in self.task.bundles]
        group = placement_group(bundles, strategy=placement.STRATEGY, name=f"{self.sid}.{restart}")
        ready, next_check, waiting = group.ready(), time.monotonic() + CHECK_EVERY_S, False
        while not ray.wait([ready], timeout=_TICK_S)[0]:
            if self._stopped() is not None:
                remove_placement_group(group)
                return None, None
            if time.monotonic() >= next_check:
                next_check = time.monotonic() + CHECK_EVERY_S
                refused = self._refusal()
                if refused is not None:
                    remove_placement_group(group)
                    return None, refused
                if not waiting:
                    waiting = True
                    self._note("PENDING", "placement group", self._busy())
        self._note("RUNNING", None, None)
        timeline.mark_at(self.attempt.timeline, "ray_placed", run=restart)
        table = ray.util.placement_group_table(group)
        where = table.get("bundles_to_node_id") or {}
        actors = [self._new_actor(group, restart, node, f"node{node}") for node in range(self.plan.num_nodes)]
        return Placed(group, actors, node_ids=[str(where.get(n, "")) for n in range(self.plan.num_nodes)]), None

    def _new_actor(self, group: Any, restart: int, node: int, name: str) -> Any:
        """Node ``node``'s actor, in its bundle of the run's placement group (``name``: new in the cluster)."""
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        bundle = self.task.bundles[node]
        return self.remote.options(
            num_cpus=bundle.get("CPU", 0.0),
            num_gpus=bundle.get("GPU", 0.0),
            resources={k: v for k, v in bundle.items() if k not in ("CPU", "GPU")},
            scheduling_strategy=PlacementGroupSchedulingStrategy(group, placement_group_bundle_index=node),
            max_concurrency=4,  # threaded: stop() answers while run() waits for the agent
            max_restarts=0,
            name=f"{self.sid}.{restart}.{name}",
        ).remote(self.task, node)

    def _refusal(self) -> Optional[str]:
        if self.plan.roles:
            by_role = {role.name: self.task.bundle_of(role.first_node) for role in self.plan.roles}
            found = placement.roles_refusal(self.plan, by_role, cluster_nodes(), "the cluster")
        else:
            found = placement.refusal(self.plan, self.task.bundle, cluster_nodes(), "the cluster")
        return found.line if found is not None else None

    def _busy(self) -> str:
        return (
            f"waits for {self.plan.num_nodes} Ray nodes with {placement.describe(self.task.bundle)} free each: "
            "the nodes that can hold it run other work"
        )

    # ------------------------------------------------------------------------------------------ watching

    def _watch(
        self, placed: Placed, refs: Dict[Any, int], deadline: float, starting: bool = False
    ) -> Tuple[Dict[int, NodeEnd], Optional[float], bool]:
        """Every node's answer (``starting``: its facts), stopping every node at the first failure,
        the time limit or a stop; with when that stop began and whether the time limit was reached."""
        import ray
        from ray.exceptions import ActorUnavailableError, RayActorError

        elastic = None if starting else placed.elastic
        pending, ends = dict(refs), {}
        stopped_at: Optional[float] = None
        timed_out = False
        give_up_at = float("inf")
        while pending and time.monotonic() < give_up_at:
            ready, _ = ray.wait(list(pending), num_returns=len(pending), timeout=_TICK_S)
            for ref in ready:
                node = pending.pop(ref)
                try:
                    ends[node] = NodeEnd(value=ray.get(ref))
                except RayActorError as exc:
                    ends[node] = NodeEnd(error=_said(exc), unavailable=isinstance(exc, ActorUnavailableError))
                except Exception as exc:  # noqa: BLE001 - the actor's own error (a port it could not hold ...)
                    ends[node] = NodeEnd(error=_said(exc))
                if elastic is not None and stopped_at is None:
                    elastic.ended(node, ends[node].value if ends[node].error is None else None)
            if elastic is not None:  # a lost node is a change of its world; the run fails when the world cannot
                if stopped_at is None:
                    pending.update(elastic.tick())
                failed = elastic.failure is not None
            else:
                failed = any(e.error is not None or (not starting and e.value != 0) for e in ends.values())
            why = None
            if failed:
                why = "failure"
            elif self._stopped() is not None:
                why = "stop"
            elif time.monotonic() >= deadline:
                why, timed_out = "time", True
            if why is not None and stopped_at is None and pending:
                stopped_at = time.time()
                for node in pending.values():
                    placed.actors[node].stop.remote()
                # a stop must end within Ray's own grace (3 s); a failure may wait for Ray to tell a lost node
                wait_s = self.task.kill_grace_s + (1.5 if why == "stop" else STOP_MARGIN_S + NODE_DEATH_WAIT_S)
                give_up_at = time.monotonic() + wait_s
            elif why == "stop" and give_up_at - time.monotonic() > self.task.kill_grace_s + 1.5:
                give_up_at = time.monotonic() + self.task.kill_grace_s + 1.5  # a stop during a failure's wait
            if stopped_at is None and why is not None and not pending:
                stopped_at = time.time()
        for node in pending.values():
            ends[node] = NodeEnd(error="it did not answer in time", unavailable=True)
        return ends, stopped_at, timed_out

    def _lost_and_died(self, placed: Placed, ends: Dict[int, NodeEnd]) -> Tuple[List[LostNode], List[Tuple[int, str]]]:
        """Of the nodes whose actor gave no answer: those whose Ray node is dead (lost), and the others (died).
        Ray may take a few seconds more to hold a node dead than to find its actor unavailable: waited for."""
        troubled = sorted(node for node, end in ends.items() if end.error is not None)
        if not troubled:
            return [], []
        orphaned = next((ends[n].error for n in troubled if OWNER_DIED in str(ends[n].error)), None)
        if orphaned is not None:
            raise ClusterGone(f"Ray holds this driver dead: {orphaned}")
        wait_until = time.monotonic() + (
            NODE_DEATH_WAIT_S if any(ends[n].unavailable for n in troubled) and self._stopped() is None else 0.0
        )
        while True:
            dead = {node.node_id: node for node in cluster_nodes() if not node.alive}
            unknown = [n for n in troubled if placed.node_ids[n] not in dead and ends[n].unavailable]
            if not unknown or time.monotonic() >= wait_until:
                break
            time.sleep(0.5)
        lost, died = [], []
        for node in troubled:
            node_id = placed.node_ids[node]
            if node_id in dead:
                ip = placed.facts[node].ip if len(placed.facts) > node else dead[node_id].ip
                lost.append(LostNode(node=node, ip=ip, node_id=node_id))
            else:
                died.append((node, str(ends[node].error)))
        return lost, died

    def _release(self, placed: Placed) -> None:
        import ray
        from ray.util.placement_group import remove_placement_group

        for actor in placed.actors + (placed.elastic.release() if placed.elastic is not None else []):
            try:
                ray.kill(actor, no_restart=True)
            except Exception:  # noqa: BLE001 - an actor already gone
                pass
        try:
            remove_placement_group(placed.group)
        except Exception:  # noqa: BLE001 - a group already gone with its nodes
            pass

    # ------------------------------------------------------------------------------------------ restarts

    def _record_failure(self, restart: int, outcome: JobOutcome, end: RunEnd) -> None:
        error = next((line for line in str(error_for(self.plan, outcome)).splitlines() if line.strip()), "")
        failed = EarlierRun(
            restart=restart, error=error, started_at=end.started_at, ended_at=end.ended_at, duration_s=end.duration_s
        )
        restarts.record(self.attempt, failed)
        why = outcome.failure.brief() if outcome.failure is not None else outcome.detail or error
        restarts.record_pending_restart(
            self.attempt, failed, next_at=time.time() + self.plan.restart_backoff_s, why=why
        )
        self.attempt.set_run_aside(restart)
        print(
            f"mmt: Ray job {self.sid}: run {restart} failed: {error}\n"
            f"mmt: restart {restart + 1} of {self.plan.max_restarts}, every node, on the nodes that are left, "
            f"in {self.plan.restart_backoff_s:g} s",
            file=sys.stderr,
            flush=True,
        )

    def _back_off(self) -> bool:
        """Wait the restart's back-off; False when the job was stopped meanwhile."""
        until = time.monotonic() + self.plan.restart_backoff_s
        while time.monotonic() < until:
            if self._stopped() is not None:
                return False
            time.sleep(min(_TICK_S, max(0.0, until - time.monotonic())))
        restarts.clear_pending_restart(self.attempt)
        return self._stopped() is None

    # ------------------------------------------------------------------------------------------ records

    def _stopped(self) -> Optional[str]:
        """Why the job is being stopped (its launcher, `mmt stop`: scheduler.json says; else `ray job stop`)."""
        if self.stop.at is None:
            return None
        view = read_scheduler(self.attempt)
        return view.stopped_because if view is not None and view.stopped_because else STOPPED_OUTSIDE

    def _note(self, state: str, reason: Optional[str], explanation: Optional[str]) -> None:
        """scheduler.json: where the job is (waiting for its placement group, or running); read again first, so
        that what its launcher wrote there (why it stopped the job) stays."""
        view = read_scheduler(self.attempt)
        write_scheduler(
            self.attempt, (view or SchedulerRecord(scheduler_id=self.sid)).seen(state, reason, explanation), view
        )


class Supervisor:
    """Ray's job supervisor on the head, the driver's parent (or its shell's): it goes when the head goes (``ray
    stop``, the head's host shut down), and then the ranks' SIGTERM, the agents' ends and the driver's own stop are
    the cluster's end, not the job's."""

    def __init__(self) -> None:
        import psutil  # a dependency of Ray's own job supervisor

        self.process = next(
            (p for p in psutil.Process().parents()[:3] if "JobSupervisor" in " ".join(_cmdline(p))), None
        )

    def went(self, wait_s: float) -> bool:
        """Whether it is gone, or goes within ``wait_s`` (the head's services take a moment to exit)."""
        if self.process is None:
            return False
        deadline = time.monotonic() + wait_s
        while self.process.is_running() and self.process.status() != "zombie":
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.1)
        return True


def _ended_from_outside(outcome: JobOutcome) -> bool:
    """A failure that the head going may have caused (a signal, a node or actor lost): worth a moment's wait to
    tell. A rank's own error is not; nor is a stop, which must end within Ray's grace (3 s): a supervisor gone with
    the head is gone by then."""
    if outcome.status != JobState.FAILED:
        return False
    failure = outcome.failure
    return failure is None or failure.signal is not None or (failure.exit_code or 0) > 128


def _cmdline(process: Any) -> List[str]:
    try:
        return list(process.cmdline())
    except Exception:  # noqa: BLE001 - gone, or not ours to read
        return []


def _said(exc: BaseException) -> str:
    """Ray's error in one line (its messages run over several)."""
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    return " ".join(lines)[:400] or type(exc).__name__


def _placement_row(facts: NodeFacts) -> Dict[str, Any]:
    return {
        "node": facts.node,
        "ip": facts.ip,
        "node_id": facts.node_id,
        "actor_pid": facts.actor_pid,
        "raylet_pid": facts.raylet_pid,
    }


def _cannot_restart(plan: Any, failed: JobOutcome, refused: str) -> JobOutcome:
    """The failed run's outcome, saying too why it could not start again."""
    said = failed.failure.describe() if failed.failure is not None else failed.detail
    return replace(failed, failure=None, detail=f"{said}; it cannot restart: {refused}")


def record_result(task: RayTask, outcome: JobOutcome, started_at: float) -> bool:
    """The job's result.json, as its launcher would write it; not when the launcher concluded it already, nor when
    a newer launch owns the job dir. Whether it was written."""
    attempt, plan = task.attempt, task.plan
    owner = read_owner(attempt.job_dir.root)
    if attempt.concluded.exists() or owner is None or owner.attempt != attempt.id:
        return False
    value = return_value_of(read_primary_return(attempt))
    result = result_record(plan, outcome, value, attempt.id, started_at=started_at, ended_at=time.time())
    write_result(plan, restarts.with_requeues(restarts.with_earlier_runs(result, restarts.recorded(attempt)), attempt))
    discard_payload(attempt)
    attempt.finalized.touch()
    timeline.mark_at(attempt.timeline, timeline.CONCLUDED, by="ray driver")
    return True


def main(argv: Optional[List[str]] = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    task = read_task_file(args[0])
    attempt = task.attempt
    if not attempt.plan.exists():
        return 0  # concluded and cleaned up already
    timeline.mark_at(attempt.timeline, "ray_driver", timeline.process_start_time())
    stop, supervisor = StopSignal(), Supervisor()
    started = time.time()
    import ray

    ray.init(logging_level=logging.WARNING)  # RAY_ADDRESS, set by Ray for its jobs: this cluster
    stop.install()
    try:
        outcome = Driver(task, stop).run_all()
        wait_s = HEAD_EXIT_WAIT_S if _ended_from_outside(outcome) else 0.0
        if outcome.status != JobState.COMPLETED and supervisor.went(wait_s):
            raise ClusterGone("Ray's job supervisor on the head is gone: the head is going")
    except ClusterGone as gone:
        print(f"mmt: job {task.plan.name} not concluded by its Ray driver: {gone}", file=sys.stderr, flush=True)
        return 1
    except Exception as exc:  # noqa: BLE001 - said in the result, then raised for Ray's job log
        record_result(
            task, JobOutcome(JobState.FAILED, time.time() - started, detail=f"its Ray driver failed: {exc}"), started
        )
        raise
    by = "its Ray driver" if record_result(task, outcome, started) else "its launcher"
    print(f"mmt: job {task.plan.name} {outcome.status}, concluded by {by}", file=sys.stderr)
    return 0 if outcome.status == JobState.COMPLETED else 1


if __name__ == "__main__":
    # run as the module itself, not as __main__: the pickled task's classes are mmt.backends.ray.*
    from mmt.backends.ray import driver as _module

    sys.exit(_module.main())
