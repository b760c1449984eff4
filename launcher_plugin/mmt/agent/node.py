"""The node agent of a cluster job (SLURM: the one task of each node): runs that node's processes of one job.

It follows the same rules as the local host agent (``mmt.agent.jobs``): it imports the recipe's ``preload`` once
and forks the node's ranks, each with the rank contract; the first rank that fails stops its siblings and the
agent exits non-zero, which ``srun --kill-on-bad-exit`` turns into the end of the other nodes. SIGTERM (scancel,
the time limit) stops the ranks within the grace; the requeue signal is forwarded to every rank that has not taken
it by itself within ``FORWARD_AFTER_S`` (SLURM signals every process of the step where its process tracking sees
them: forwarding at once would deliver it twice), whose ``mmt.core.preemption`` handler takes it.
"""

import os
import signal
import socket
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Dict, List, Mapping, Optional, Tuple

from mmt.agent.jobs import JobProcesses
from mmt.agent.metrics import JobMetrics
from mmt.agent.processes import ProcessSpec, Spawner
from mmt.core import preemption, proctree, timeline
from mmt.core.jobdir import Attempt, JobDir
from mmt.core.snapshot import CodeSnapshot
from mmt.monitor import hangs
from mmt.planning.environment import PythonEnvironment, Rendezvous, RoleSite, process_env, role_process_env
from mmt.planning.plan import JobPlan
from mmt.records.schema import ErrorRecord, ExitRecord

_TICK_S = 0.05
# how long a rank has to acknowledge SLURM's own requeue signal before its agent forwards it
FORWARD_AFTER_S = 0.5


@dataclass(frozen=True)
class NodeRun:
    job_id: str
    node_rank: int
    job_dir: str
    attempt_dir: str
    kill_grace_s: float
    preload: Tuple[str, ...]
    method: str
    processes: Tuple[ProcessSpec, ...]
    metrics_interval_s: float = 0.0
    # the job's plan, where it watches for hangs (plan.hang_timeout_s): every node agent watches the whole job
    hang_plan: Optional[JobPlan] = None
    # a node of a non-primary role: when its role ends (the primary's end), and what an earlier end of its own means
    role_watch: Optional["RoleWatch"] = None
    # the launch's copy of the project: the agent imports the preload from it, and its ranks the job's code
    snapshot: Optional[CodeSnapshot] = None


@dataclass(frozen=True)
class RoleWatch:
    """What the agent of a node of a non-primary role watches: the primary role's processes. Once they have all
    exited 0, the job is done, and the agent stops its own ranks and exits 0 (a stop, not a failure). Its own ranks
    all ending cleanly before that fails the job when the role says ``early_exit=fail``."""

    role: str
    primary: str
    primary_indices: Tuple[int, ...]
    early_exit: str

    def primary_done(self, attempt: Attempt) -> bool:
        records = [ExitRecord.read(attempt.exit_file(index)) for index in self.primary_indices]
        return all(record is not None and record.code == 0 for record in records)

    def ended_early(self, attempt: Attempt, index: int) -> None:
        """Record the role's clean early end as process ``index``'s failure (the job's conclusion names it)."""
        ErrorRecord(
            exception=f"EndedEarly: role {self.role} ended before the primary role {self.primary} "
            "(the role's early_exit=fail)",
            traceback="",
        ).write(attempt.error_file(index))


def node_run(
    plan: JobPlan,
    attempt: Attempt,
    node: int,
    *,
    rendezvous: Rendezvous,
    inherited: Mapping[str, str],
    copied: Mapping[str, str],
    cores: int,
    kill_grace_s: float,
    start_method: str,
    cwd: str,
    restart: int = 0,
    sites: Optional[Mapping[str, RoleSite]] = None,
) -> NodeRun:
    """What node ``node`` of a job runs, for a backend that starts its node agents itself (Ray's actors, a third
    party's scheduler): each of its processes with the rank contract (this interpreter first on PATH), its log in
    the job dir, hang detection's variables; records of an earlier run of those processes cleared. A job with
    roles: ``sites``, where every role is; each process gets its role's contract and the roles' variables."""
    job_dir = JobDir(Path(plan.job_dir))
    job_dir.logs.mkdir(parents=True, exist_ok=True)
    specs = []
    common: Dict[str, Any] = dict(
        inherited=inherited, copied=copied, cores_per_node=cores, python=PythonEnvironment.current(), restart=restart
    )
    for index in plan.node_indices(node):
        attempt.clear_process(index)
        if sites is not None:
            env = role_process_env(plan, index, sites=sites, roles_file=str(job_dir.roles_file), **common)
        else:
            env = process_env(plan, plan.place(index), rendezvous=rendezvous, **common)
        env.update(hangs.hang_env(plan, attempt, index))
        log = plan.log_path(index)
        log.parent.mkdir(parents=True, exist_ok=True)
        specs.append(ProcessSpec(plan.job_id, index, node, str(attempt.dir), env, cwd, str(log)))
    return NodeRun(
        job_id=plan.job_id,
        node_rank=node,
        job_dir=plan.job_dir,
        attempt_dir=str(attempt.dir),
        kill_grace_s=kill_grace_s,
        preload=plan.preload,
        method=start_method,
        processes=tuple(specs),
        metrics_interval_s=plan.metrics_interval_s,
        hang_plan=plan if plan.hang_timeout_s is not None else None,
        role_watch=role_watch(plan, node),
        snapshot=plan.snapshot,
    )


def role_watch(plan: JobPlan, node: int) -> Optional[RoleWatch]:
    """What the agent of node ``node`` watches: the primary role, on a node of another role; else nothing."""
    role = next((role for role in plan.roles if node in role.nodes), None)
    if role is None or role.primary:
        return None
    primary = plan.roles[0]
    return RoleWatch(role.name, primary.name, tuple(primary.indices), role.early_exit)


def run(node: NodeRun) -> int:
    """Run the node's processes until every one (and whatever they left) is gone; 0 when all succeeded."""
    agent = NodeAgent(node)
    code = agent.run(node)
    agent.finish(code)
    return code


class NodeAgent:
    """One node's agent: its signal handlers and its warm interpreter (the job's preload, imported once), which runs
    the node's processes once (:meth:`run`), or, for an elastic job, once per world (``mmt.agent.elastic``)."""

    def __init__(self, node: NodeRun, slot: Optional[int] = None) -> None:
        self.attempt = Attempt(Path(node.attempt_dir))
        # its agent record's key: the node's rank, or an elastic job's node slot (its rank changes with the world)
        self.key = node.node_rank if slot is None else slot
        self.spawner = Spawner(node.method)
        self.terminated: Dict[str, Any] = {}
        self.job: Optional[JobProcesses] = None
        self.requeue_signal: Dict[str, float] = {}
        proctree.become_subreaper()
        self.record = {"host": socket.gethostname(), "pid": os.getpid(), "started": time.time()}
        self.attempt.write_agent(self.key, self.record)
        signal.signal(signal.SIGTERM, self._on_terminate)
        signal.signal(signal.SIGINT, self._on_terminate)
        signal.signal(preemption.REQUEUE_SIGNAL, self._on_requeue)
        # Hydra's plugin registry once here only for two ranks or more: a node of one (a sweep's 1 x 1 job) pays
        # less for the few plugin modules its rank's payload names
        self.spawner.preload(node.preload, hydra_plugins=len(node.processes) > 1, snapshot=node.snapshot)
        timeline.mark_at(self.attempt.timeline, timeline.AGENT_READY, node=node.node_rank)

    def _on_terminate(self, signum: int, _frame: object) -> None:
        if not self.terminated:
            self.terminated.update(terminated_by=signal.Signals(signum).name, terminated_at=time.time())
            self.attempt.write_agent(self.key, {**self.record, **self.terminated})
        if self.job is not None:
            self.job.stop()

    def _on_requeue(self, signum: int, _frame: object) -> None:
        self.requeue_signal.setdefault("at", time.monotonic())  # forwarded from the loop: nothing done here

    def run(self, node: NodeRun, stop_when: Optional[Callable[[], bool]] = None) -> int:
        """Start the node's processes and supervise them until every one (and whatever they left) is gone; 0 when
        all succeeded. ``stop_when``: asked at every tick; True stops them (an elastic job's next world)."""
        attempt = self.attempt
        job = self.job = JobProcesses(node.job_id, attempt, node.kill_grace_s, node_rank=node.node_rank)
        acks = {spec.index: spec.env.get(preemption.ACK_VAR) for spec in node.processes}

        def forward_requeue() -> None:
            if not self.requeue_signal or time.monotonic() - self.requeue_signal["at"] < FORWARD_AFTER_S:
                return
            self.requeue_signal.clear()
            for process in job.running:
                ack = acks.get(process.index)
                if not (ack and os.path.exists(ack)):
                    proctree.signal_all([process.pid], preemption.REQUEUE_SIGNAL)

        for spec in node.processes:
            if self.terminated:  # stopped before its ranks started: start none
                break
            job.started(spec.index, self.spawner.start(spec))
        if self.terminated:
            job.stop()
        metrics = JobMetrics(node.job_dir, node.processes, node.metrics_interval_s)
        # every node agent watches the whole job (its files are on the shared filesystem) and asks its own ranks for
        # their stacks; the first to see them all writes the job's hang record, then each stops its ranks
        hang = hangs.HangWatch(node.hang_plan, attempt) if node.hang_plan and node.hang_plan.hang_timeout_s else None
        roles = _RoleEnd(node.role_watch, attempt)
        while not job.ended:
            _reap(job)
            metrics.sample(job)
            forward_requeue()
            roles.check(job)
            if stop_when is not None and job.stopping_since is None and stop_when():
                job.stop()
            if hang is not None and not self.terminated:
                running = [i for i in range(hang.plan.process_count) if attempt.done(i) is None]
                detail = hang.check(time.monotonic(), {p.index: p.pid for p in job.running}, running)
                if detail is not None:
                    hangs.write_hang(attempt, detail)
                    hang = None
                    job.stop()
            job.tick()
            if not job.ended:
                time.sleep(_TICK_S)
        return roles.code(job, node.processes[0].index if node.processes else 0)

    def finish(self, code: int) -> None:
        self.attempt.write_agent(self.key, {**self.record, **self.terminated, "ended": time.time(), "code": code})
        timeline.mark_at(self.attempt.timeline, timeline.AGENT_END, node=self.key)


def main(argv: Optional[List[str]] = None) -> None:
    """``python -m mmt.agent.node <node run file>``: a node agent whose node is a container (a local job with an
    image): it runs there in the image's Python, with mmt mounted, and forks the node's ranks from one interpreter
    that has imported the job's preload, as on SLURM."""
    import pickle
    import sys

    from mmt.records.payload import open_private

    (path,) = argv if argv is not None else sys.argv[1:]
    with open_private(Path(path)) as handle:  # written by this user's launcher, never by anyone else
        node: NodeRun = pickle.load(handle)
    code = run(node)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)  # no interpreter teardown (torch's is tenths of a second): the node's exit ends the job sooner


class _RoleEnd:
    """A non-primary role's node: stop its ranks once the primary role has ended (looked at twice a second)."""

    def __init__(self, watch: Optional[RoleWatch], attempt: Attempt) -> None:
        self.watch, self.attempt = watch, attempt
        self.primary_done = False
        self._next = 0.0

    def check(self, job: JobProcesses) -> None:
        if self.watch is None or self.primary_done or job.stopping_since is not None:
            return
        now = time.monotonic()
        if now >= self._next:
            self._next = now + 0.5
            if self.watch.primary_done(self.attempt):
                self.primary_done = True
                job.stop()

    def code(self, job: JobProcesses, first_index: int) -> int:
        """The agent's exit code: 0 when its ranks succeeded, or were stopped because the primary role ended."""
        if self.watch is None:
            return 0 if job.succeeded else 1
        if self.primary_done and job.first_failure is None:
            return 0
        if job.succeeded and self.watch.early_exit == "fail" and not self.watch.primary_done(self.attempt):
            self.watch.ended_early(self.attempt, first_index)
            return 1
        return 0 if job.succeeded else 1


def _reap(job: JobProcesses) -> None:
    for pid, code in proctree.reaped():
        job.exited(pid, code)  # None for an adopted orphan: just reaped


if __name__ == "__main__":
    main()
