"""The local backend: every job runs as N simulated nodes x M processes on this host.

Each simulated node is a set of processes with its own NODE_RANK (and its own slice of GPUs when the host has
them); all nodes share the host's loopback, MASTER_ADDR is 127.0.0.1 and every job gets its own reserved port.
Jobs run side by side under ``max_parallel_ranks``. One host agent (``mmt.agent.server``), started with the first
job and kept for as long as the backend lives, forks every process; it stops a job's processes when one fails.
This module keeps the queue, the time limits and the GPUs, and turns what the agent reports into job states.
"""

import json
import os
import select
import time
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Deque, Dict, List, Mapping, Optional, Sequence, Set, Tuple

from omegaconf import DictConfig, OmegaConf

from mmt.agent import containers
from mmt.agent.client import AgentClient, AgentGone
from mmt.agent.node import role_watch
from mmt.agent.processes import ProcessSpec
from mmt.agent.server import StartJob
from mmt.backends import registry
from mmt.backends.base import Backend, JobHandle, JobSnapshot, Submission
from mmt.backends.dependencies import dependency_state, why_cancelled
from mmt.backends.elastic import ElasticJob
from mmt.backends.local import agents, images, records
from mmt.backends.local.elastic import ElasticCoordinator
from mmt.backends.local.host import PortReservations, cpu_cores, visible_gpus
from mmt.backends.local.watch import LocalWatcher
from mmt.core import proctree
from mmt.core.errors import ConfigError, RankFailure
from mmt.core.jobdir import JobDir, write_atomic
from mmt.core.rank_env import MMT_CONTAINER_EXEC, MMT_JOB_ID, RankPlace
from mmt.core.snapshot import CodeSnapshot
from mmt.core.states import JobState, StartMethod, values
from mmt.monitor import hangs
from mmt.planning import validate as check
from mmt.planning.environment import (
    PythonEnvironment,
    Rendezvous,
    RoleSite,
    process_env,
    role_process_env,
    roles_document,
)
from mmt.planning.plan import JobPlan, Limits
from mmt.planning.roles import RolePlan
from mmt.records.outcome import JobOutcome, first_failure, running_detail
from mmt.records.reconcile import request_stop
from mmt.records.registry import JobRecord, Registry

# one host runs every process of a local job; beyond this a sweep of "nodes" is a fork bomb, not a simulation
MAX_LOCAL_PROCESSES = 1024


@dataclass(frozen=True)
class LocalSettings:
    """The launcher-wide settings of the local backend (``hydra.launcher.*``), validated."""

    max_parallel_ranks: int
    master_addr: str
    start_method: str
    kill_grace_s: float
    # most jobs running at once (hydra.launcher.max_parallel_jobs); None: no limit
    max_parallel_jobs: Optional[int] = None
    # how a job with an image runs its nodes (hydra.launcher.container_runtime, container_mounts)
    containers: images.ContainerSettings = images.ContainerSettings()
    # an elastic job's lost node comes back this long after (hydra.launcher.restore_lost_nodes_after_s); None: never
    restore_lost_nodes_after_s: Optional[float] = None

    @classmethod
    def from_config(cls, cfg: Any) -> "LocalSettings":
        limit = cfg.max_parallel_ranks
        return cls(
            max_parallel_ranks=max(4, cpu_cores())
            if limit is None
            else check.whole_number(
                "hydra.launcher.max_parallel_ranks", limit, 1, "e.g. hydra.launcher.max_parallel_ranks=8"
            ),
            master_addr=check.host_address("hydra.launcher.master_addr", cfg.master_addr),
            start_method=check.choice("hydra.launcher.start_method", cfg.start_method, values(StartMethod)),
            kill_grace_s=check.positive_number(
                "hydra.launcher.kill_grace_s",
                cfg.kill_grace_s,
                "seconds between SIGTERM and SIGKILL, e.g. 1",
                maximum=3600,
            ),
            max_parallel_jobs=max_parallel_jobs(cfg),
            containers=images.ContainerSettings.from_config(cfg),
            restore_lost_nodes_after_s=restore_lost_nodes_after_s(cfg),
        )


def restore_lost_nodes_after_s(cfg: Any) -> Optional[float]:
    after = OmegaConf.select(cfg, "restore_lost_nodes_after_s", default=None)
    if after is None:
        return None
    return check.positive_number(
        "hydra.launcher.restore_lost_nodes_after_s",
        after,
        "seconds before an elastic job's lost node comes back, e.g. 5 (null: it stays lost)",
        maximum=86400,
    )


def max_parallel_jobs(cfg: Any) -> Optional[int]:
    limit = OmegaConf.select(cfg, "max_parallel_jobs", default=None)
    if limit is None:
        return None
    return check.whole_number(
        "hydra.launcher.max_parallel_jobs", limit, 1, "jobs at once, e.g. hydra.launcher.max_parallel_jobs=4"
    )


@dataclass
class LocalJob(JobHandle):
    submission: Submission
    state: JobState = JobState.PENDING
    started: Optional[float] = None
    deadline: float = 0.0
    port: Optional[int] = None
    framework_ports: List[int] = field(default_factory=list)  # held for TF_CONFIG's workers or JAX's coordinator
    role_ports: List[int] = field(default_factory=list)  # a job with roles: each role's MASTER_PORT and own port
    gpus: List[str] = field(default_factory=list)
    pids: Dict[int, int] = field(default_factory=dict)  # process index -> pid
    running: set = field(default_factory=set)  # process indices not exited yet
    last_exit: Optional[float] = None
    failed_first: bool = False  # a process failed by itself before mmt stopped anything
    stop_status: Optional[JobState] = None  # why mmt is stopping it: TIMEOUT or INTERRUPTED
    stop_detail: str = ""
    stop_sent: Optional[float] = None
    outcome: Optional[JobOutcome] = None
    # hang detection (plan.hang_timeout_s)
    hang: Optional[hangs.HangWatch] = None
    # its processes are node agents in containers (indices: nodes), which record their ranks themselves
    node_agents: bool = False
    # an elastic job (num_nodes=MIN:MAX): its world, and who forms it again when a node is lost (indices: slots)
    elastic: Optional[ElasticJob] = None
    coordinator: Optional[ElasticCoordinator] = None
    # a job with roles: how its processes exited so far (index -> code), and the failure of a role that ended before
    # the primary role though it may not (early_exit=fail)
    exit_codes: Dict[int, int] = field(default_factory=dict)
    ended_early: Optional[RankFailure] = None
    # the jobs it runs after (submission.after) that have completed, and when to look at the others again
    satisfied: Set[str] = field(default_factory=set)
    next_dependency_check: float = 0.0


class LocalBackend(Backend[LocalJob]):
    name = "local"
    warms_up = True
    runs_roles = True
    # num_nodes=MIN:MAX: every node a node agent here, the world formed again when one is lost (docs/elastic.md)
    runs_elastic = True

    def __init__(self, settings: LocalSettings) -> None:
        self.settings = settings
        self.ports = PortReservations(settings.master_addr)
        self.host_gpus = visible_gpus()
        self.free_gpus = list(self.host_gpus)
        self.python = PythonEnvironment.current()
        self.agent: Optional[AgentClient] = None
        self.queue: Deque[LocalJob] = deque()
        self.jobs: Dict[str, LocalJob] = {}  # running, by job id
        self.notices: List[str] = []  # for the console: an elastic job's world changes

    @classmethod
    def from_config(cls, launcher_cfg: DictConfig) -> "LocalBackend":
        return cls(LocalSettings.from_config(launcher_cfg))

    @classmethod
    def watcher(cls, poll_interval_s: float = 1.0) -> LocalWatcher:
        return LocalWatcher()

    @classmethod
    def refresh(cls, record: JobRecord, registry: Registry) -> JobRecord:
        return records.refresh(record, registry)

    @classmethod
    def stop(cls, record: JobRecord) -> str:
        return request_stop(record)

    # ------------------------------------------------------------------------------------------ planning

    @property
    def limits(self) -> Limits:
        return Limits(
            max_nodes=MAX_LOCAL_PROCESSES,
            max_devices=MAX_LOCAL_PROCESSES,
            max_world=MAX_LOCAL_PROCESSES,
            why="cluster=local runs every process of a job on this host",
            hint="use fewer nodes or devices, or a cluster: "
            + " or ".join(f"cluster={name}" for name in registry.names() if name != self.name),
        )

    def problems(self, plan: JobPlan) -> List[ConfigError]:
        found = self._image_problems(plan)
        if plan.elastic is not None and plan.image is not None:
            found.append(
                ConfigError(
                    "image",
                    plan.image,
                    f"cluster=local runs an elastic job (num_nodes={plan.elastic.label}) in this environment only",
                    "drop image=..., or give num_nodes a count",
                )
            )
        needed = plan.world_size if plan.machine.gpus else 0
        if needed > len(self.host_gpus):
            found.append(
                ConfigError(
                    "machine",
                    plan.machine.name,
                    f"{plan.num_nodes} nodes x {plan.devices} GPUs need {needed} GPUs "
                    f"on this host (cluster=local) but it has {len(self.host_gpus)}",
                    "simulate on CPU with machine=cpu, use fewer nodes/devices, or cluster=slurm",
                )
            )
        return found

    def _image_problems(self, plan: JobPlan) -> List[ConfigError]:
        """Why the job's images cannot run here; with roles, each role's image for what that role runs in it."""
        if not plan.roles:
            return images.problems(plan, self.settings.containers)
        found: Dict[str, ConfigError] = {}
        for role in plan.roles:
            if role.image is not None:
                for problem in images.problems(plan.for_role(role), self.settings.containers):
                    key = f"roles.{role.name}.image" if problem.key == "image" else problem.key
                    error = ConfigError(key, problem.value, problem.expected, problem.hint)
                    found.setdefault(str(error), error)
        return list(found.values())

    def describe(self, plan: JobPlan) -> List[str]:
        lines = [
            f"  backend    local: {plan.num_nodes:,} simulated nodes on this host, MASTER_ADDR="
            f"{self.settings.master_addr}, start_method={self.settings.start_method}"
        ]
        if self.settings.max_parallel_jobs is not None:
            lines.append(
                f"  throttle   at most {self.settings.max_parallel_jobs} job(s) of the launch at once "
                f"(hydra.launcher.max_parallel_jobs), and at most {self.settings.max_parallel_ranks} ranks"
            )
        if plan.after:
            lines.append(
                f"  after      starts once every job of {', '.join(plan.after)} has completed; CANCELLED if one "
                "ends otherwise"
            )
        problems = self.problems(plan)
        if plan.image is not None and not plan.roles and not problems:
            env = self._process_env(plan, plan.places()[0], Rendezvous(self.settings.master_addr, None), {}, 0)
            lines += images.describe(plan, self.settings.containers, os.getcwd(), env)
        for role in plan.roles if not problems else ():
            if role.image is not None:  # what node 0 of the role runs: its container, the process exec'd into it
                own = plan.for_role(role)
                env = self._process_env(own, own.places()[0], Rendezvous(self.settings.master_addr, None), {}, 0)
                lines.append(f"  role {role.name} in its image (every node of it runs so):")
                lines += ["  " + line for line in images.describe(own, self.settings.containers, os.getcwd(), env)]
        return lines + [f"  WARNING    {problem}" for problem in problems]

    # ------------------------------------------------------------------------------------------ the interface

    def submit(self, submission: Submission) -> LocalJob:
        job = LocalJob(submission=submission)
        self.queue.append(job)
        self._schedule()
        return job

    def poll(self, handle: LocalJob) -> JobSnapshot:
        return JobSnapshot(state=handle.state, outcome=handle.outcome)

    def cancel(self, handle: LocalJob, reason: str) -> None:
        if handle.state == JobState.PENDING:
            self.queue.remove(handle)
            self._conclude(handle, JobOutcome(JobState.INTERRUPTED, None, detail=f"not started: {reason}"))
        elif not handle.state.final:
            self._stop(handle, JobState.INTERRUPTED, f"stopped: {reason}")

    def kill(self, handle: LocalJob) -> None:
        """SIGKILL the job's processes now (a second Ctrl-C)."""
        if self.agent is not None and handle.plan.job_id in self.jobs:
            self.agent.kill(handle.plan.job_id)

    def warm_up(self, preload: Sequence[str] = (), snapshot: Optional[CodeSnapshot] = None) -> None:
        if self.agent is None:  # its interpreter starts while the launcher composes the jobs (two cores, not one)
            self.agent = AgentClient(self.settings.start_method, preload, snapshot)

    def drain_notices(self) -> List[str]:
        notices, self.notices = self.notices, []
        return notices

    def wait(self, timeout_s: float) -> None:
        self._schedule()
        if self.agent is None:
            time.sleep(timeout_s)
        else:
            try:
                if select.select([self.agent.fileno()], [], [], timeout_s)[0]:
                    for message in self.agent.pending():
                        self._receive(message)
            except AgentGone as gone:
                self._agent_died(str(gone))
        now = time.monotonic()
        for job in list(self.jobs.values()):
            if job.elastic is not None and job.stop_sent is None:
                self._elastic_tick(job)
            if job.stop_status is None and now >= job.deadline:
                self._stop(job, JobState.TIMEOUT, running_detail(job.plan, self._running_processes(job)))
            elif job.hang is not None and job.stop_sent is None:
                self._watch_for_hang(job, now)
        self._schedule()

    @staticmethod
    def _running_processes(job: LocalJob) -> List[int]:
        if not job.node_agents:
            return sorted(job.running)
        done = job.attempt.done  # a node agent runs on while its ranks: which of them had not finished
        if job.elastic is not None:  # the world's ranks
            return [i for i in range(job.elastic.plan.process_count) if done(i) is None]
        return [i for node in sorted(job.running) for i in job.plan.node_indices(node) if done(i) is None]

    def _watch_for_hang(self, job: LocalJob, now: float) -> None:
        """A job without progress for its hang timeout: its ranks' stacks first, then it fails saying where each
        one waits (and so may restart)."""
        assert job.hang is not None
        running = sorted(job.running)
        detail = job.hang.check(now, {i: job.pids[i] for i in running if i in job.pids}, running)
        if detail is not None:
            self._stop(job, JobState.FAILED, detail)

    def close(self) -> None:
        if self.agent is not None:
            self.agent.close()  # the agent kills whatever is left
            self.agent = None
        self.ports.release_all()

    # ------------------------------------------------------------------------------------------ scheduling

    def _fits(self, plan: JobPlan) -> bool:
        if plan.machine.gpus and len(self.free_gpus) < plan.world_size:
            return False
        limit = self.settings.max_parallel_jobs
        if limit is not None and len(self.jobs) >= limit:
            return False
        busy = sum(job.plan.world_size for job in self.jobs.values())
        return not self.jobs or busy + plan.world_size <= self.settings.max_parallel_ranks

    def _schedule(self) -> None:
        """Start queued jobs, in order, while they fit; a job that waits for others (after=) lets the ones behind
        it go first, and is cancelled when one of them ends without completing."""
        for job in list(self.queue):
            if self._waits(job) or job.outcome is not None:  # waits, or was cancelled for what it waited for
                continue
            if not self._fits(job.plan):
                break
            self.queue.remove(job)
            self._start(job)

    def _waits(self, job: LocalJob) -> bool:
        """Whether ``job`` still waits for a job it runs after (asked at most every second); a dependency that
        ended otherwise ends it CANCELLED, saying which."""
        pending = [dep for dep in job.submission.after if dep.name not in job.satisfied]
        if not pending:
            return False
        now = time.monotonic()
        if now < job.next_dependency_check:
            return True
        job.next_dependency_check = now + 1.0
        for dep in pending:
            state = dependency_state(dep)
            if state == JobState.COMPLETED:
                job.satisfied.add(dep.name)
            elif state is not None:
                self.queue.remove(job)
                self._conclude(job, JobOutcome(JobState.CANCELLED, None, detail=why_cancelled(dep, state)))
                return True
        return len(job.satisfied) < len(job.submission.after)

    def _start(self, job: LocalJob) -> None:
        plan = job.plan
        if self.agent is None:
            self.agent = AgentClient(self.settings.start_method)
        agent = self.agent
        rendezvous = self._reserve(job)
        cwd = os.getcwd()
        waiting = self._command_containers(job, cwd)  # a command's nodes in an image: containers its execs enter
        if plan.elastic is not None:  # every node a node agent here, which forks its ranks world after world
            job.coordinator = ElasticCoordinator(
                master_addr=self.settings.master_addr,
                kill_grace_s=self.settings.kill_grace_s,
                start_method=self.settings.start_method,
                rank_specs=lambda world, meet: [
                    self._rank_spec(job, index, place, meet, [], cwd, plan=world)
                    for index, place in enumerate(world.places())
                ],
                reserve_port=self.ports.reserve,
                release_port=self.ports.release,
                restore_after_s=self.settings.restore_lost_nodes_after_s,
            )
            assert job.port is not None
            job.elastic, specs = job.coordinator.start(plan, job.attempt, job.port, cwd, job.submission.restart)
        elif plan.roles:
            specs = self._role_specs(job, cwd, {node.node_rank: node for node in waiting})
        else:
            specs = [
                self._rank_spec(job, index, place, rendezvous, waiting, cwd)
                for index, place in enumerate(plan.places())
            ]
        held = list(waiting)
        # the task function in an image: each node's container runs a node agent, which forks its ranks; with
        # roles, every node runs a node agent then (in its role's image, or here), as on a cluster
        node_agents = plan.elastic is not None or any(
            own.image is not None and own.command is None for own in self._node_plans(plan)
        )
        if node_agents and plan.elastic is None:
            specs, in_images = self._node_agents(job, specs, cwd)
            held += in_images
        elif plan.hang_timeout_s is not None and not node_agents:  # (node agents watch for hangs themselves)
            job.hang = hangs.HangWatch(plan, job.attempt)
        job.started = time.monotonic()
        job.deadline = job.started + max(0.0, plan.timeout_s - job.submission.time_used_s)
        if held:
            containers.record(job.attempt, held)
        if waiting:  # containers that wait for the command's execs: up before any starts
            failed = containers.start(waiting)
            if failed is not None:
                self._conclude(job, JobOutcome(JobState.FAILED, 0.0, detail=failed))
                return
        job.state = JobState.RUNNING
        job.running = set(range(len(specs)))
        job.node_agents = node_agents
        self.jobs[plan.job_id] = job
        agent.start(
            StartJob(
                job_id=plan.job_id,
                job_dir=plan.job_dir,
                attempt_dir=str(job.attempt.dir),
                kill_grace_s=self.settings.kill_grace_s,
                # the task function's ranks are forked in their containers, not from here
                preload=() if node_agents else plan.preload,
                processes=tuple(specs),
                metrics_interval_s=plan.metrics_interval_s,
                containers=tuple(held),
                node_agents=node_agents,
                # an elastic job's node agent that dies is a lost node, not the job's end: the coordinator decides
                fail_fast=plan.elastic is None,
                snapshot=plan.snapshot,
            )
        )

    def _reserve(self, job: LocalJob) -> Rendezvous:
        """The job's GPUs and ports, taken from the host's free ones; its logs dir; where its ranks meet."""
        plan = job.plan
        job.gpus = [self.free_gpus.pop(0) for _ in range(plan.world_size)] if plan.machine.gpus else []
        job.port = self.ports.reserve()
        job.framework_ports = [self.ports.reserve() for _ in range(plan.framework_port_count)]
        JobDir(Path(plan.job_dir)).logs.mkdir(parents=True, exist_ok=True)
        # every simulated node is this host: one address for all, a port of its own for every framework worker
        return Rendezvous(
            self.settings.master_addr,
            job.port,
            node_addrs=(self.settings.master_addr,) * plan.num_nodes,
            framework_ports=tuple(job.framework_ports),
        )

    def _rank_spec(
        self,
        job: LocalJob,
        index: int,
        place: RankPlace,
        rendezvous: Rendezvous,
        nodes: Sequence[containers.NodeContainer],
        cwd: str,
        plan: Optional[JobPlan] = None,
    ) -> ProcessSpec:
        """Process ``index`` of the job (a rank, or a node's command): its environment, GPUs and log. ``plan``: the
        world's, for an elastic job's later worlds."""
        plan = plan or job.plan
        env = self._process_env(plan, place, rendezvous, job.submission.copied_env, job.submission.restart)
        env.update(hangs.hang_env(plan, job.attempt, index))  # where progress shows, where a stack goes
        if job.gpus:  # node n sees its own devices; LOCAL_RANK indexes into them
            env["CUDA_VISIBLE_DEVICES"] = ",".join(job.gpus[place.node_rank * plan.devices :][: plan.devices])
        elif self.host_gpus:
            env["CUDA_VISIBLE_DEVICES"] = ""  # a CPU job on a GPU host keeps its hands off the GPUs
        if nodes and plan.command is not None:
            # mmt's process runs here, the command in the node's container, the contract passed in by name
            prefix = images.exec_prefix(self.settings.containers, nodes[place.node_rank].name, env, cwd)
            env = self._host_env(plan, place, rendezvous, job, env)
            env[MMT_CONTAINER_EXEC] = json.dumps(prefix)
        return ProcessSpec(
            job_id=plan.job_id,
            index=index,
            node_rank=place.node_rank,
            attempt_dir=str(job.attempt.dir),
            env=env,
            cwd=cwd,
            log=str(JobDir(Path(plan.job_dir)).log(place.node_rank, place.rank, plan.per_node)),
        )

    @staticmethod
    def _node_plans(plan: JobPlan) -> List[JobPlan]:
        """What each node runs: the job's plan; with roles, its role's (``JobPlan.for_role``)."""
        if not plan.roles:
            return [plan] * plan.num_nodes
        return [own for role in plan.roles for own in [plan.for_role(role)] * role.num_nodes]

    def _role_specs(
        self, job: LocalJob, cwd: str, waiting: Mapping[int, containers.NodeContainer]
    ) -> List[ProcessSpec]:
        """Every process of a job with roles: each role's own rendezvous (a port for its ranks to meet on, and one
        for it to serve on), its rank contract, and where every role is (also in the roles file, written first).
        ``waiting``: by node, the containers of a role whose command runs in its image."""
        plan, addr = job.plan, self.settings.master_addr
        sites = {}
        for role in plan.roles:
            meet, serve = self.ports.reserve(), self.ports.reserve()
            job.role_ports += [meet, serve]
            sites[role.name] = RoleSite(Rendezvous(addr, meet, node_addrs=(addr,) * role.num_nodes), serve)
        job_dir = JobDir(Path(plan.job_dir))
        write_atomic(job_dir.roles_file, (json.dumps(roles_document(plan, sites), indent=2) + "\n").encode())
        cores_per_node = max(1, cpu_cores() // plan.num_nodes)
        roles_file = str(job_dir.roles_file)
        return [
            self._role_spec(job, role, index, sites, roles_file, cores_per_node, cwd, waiting)
            for role in plan.roles
            for index in role.indices
        ]

    def _role_spec(
        self,
        job: LocalJob,
        role: RolePlan,
        index: int,
        sites: Mapping[str, RoleSite],
        roles_file: str,
        cores_per_node: int,
        cwd: str,
        waiting: Mapping[int, containers.NodeContainer],
    ) -> ProcessSpec:
        """Process ``index`` of a job with roles, of ``role``: its role's contract, GPUs and log. A role in an image:
        the environment in its container (the job's variables only); its command's process runs here, exec'ing the
        command into its node's container."""
        plan = job.plan

        def contract(here: bool) -> Dict[str, str]:
            return role_process_env(
                plan,
                index,
                sites=sites,
                roles_file=roles_file,
                inherited=os.environ if here else {},
                copied=job.submission.copied_env,
                cores_per_node=cores_per_node,
                python=self.python if here else None,
                restart=job.submission.restart,
            )

        place = plan.place(index)
        env = contract(here=role.image is None)
        if role.image is not None:
            env = images.container_env(env, plan.for_role(role), cwd)
        env.update(hangs.hang_env(plan, job.attempt, index))
        node = role.first_node + place.node_rank
        if node in waiting:  # mmt's process here, the command in the node's container, the contract passed by name
            prefix = images.exec_prefix(self.settings.containers, waiting[node].name, env, cwd)
            env = {**contract(here=True), **env, MMT_CONTAINER_EXEC: json.dumps(prefix)}
        if job.gpus:  # the role's GPUs follow the roles before it; node n of the role sees its own
            first = sum(r.world_size for r in plan.roles if r.first_index < role.first_index)
            first += place.node_rank * role.devices
            env["CUDA_VISIBLE_DEVICES"] = ",".join(job.gpus[first : first + role.devices])
        elif self.host_gpus:
            env["CUDA_VISIBLE_DEVICES"] = ""
        log = plan.log_path(index)
        log.parent.mkdir(parents=True, exist_ok=True)
        return ProcessSpec(
            job_id=plan.job_id,
            index=index,
            node_rank=node,
            attempt_dir=str(job.attempt.dir),
            env=env,
            cwd=cwd,
            log=str(log),
        )

    def _node_agents(
        self, job: LocalJob, ranks: List[ProcessSpec], cwd: str
    ) -> Tuple[List[ProcessSpec], List[containers.NodeContainer]]:
        """The processes the host agent runs when nodes run the task function in an image, and their containers: one
        node agent per node (``mmt.agent.node.main``), which imports the job's preload once and forks that node's
        ranks, as on SLURM, taking them from a private file in the attempt dir. A node whose role runs here (or whose
        command runs in its containers) has its agent here, in this interpreter; its role's watch (the primary's
        end, an early exit) is the agent's, as on a cluster."""
        plan, attempt = job.plan, job.attempt
        specs, in_images = [], []
        for node, own in enumerate(self._node_plans(plan)):
            path = attempt.node_run(node)
            agents.write_node_run(
                path,
                plan,
                attempt,
                node,
                [spec for spec in ranks if spec.node_rank == node],
                kill_grace_s=self.settings.kill_grace_s,
                method=self.settings.start_method,
                preload=own.preload,
                role_watch=role_watch(plan, node),
            )
            argv = agents.here("mmt.agent.node", path)
            if own.image is not None and own.command is None:
                name = images.container_name(plan.job_id, attempt.id, node, job.submission.restart)
                container = images.node_agent_container(own, self.settings.containers, name, node, cwd, str(path))
                in_images.append(container)
                argv = container.run_argv
            specs.append(agents.agent_process(plan, attempt, node, argv, cwd))
        return specs, in_images

    def _host_env(
        self, plan: JobPlan, place: RankPlace, rendezvous: Rendezvous, job: LocalJob, ours: Dict[str, str]
    ) -> Dict[str, str]:
        """A command's own process on this host: this host's environment, with what the container gets on top."""
        env = self._process_env(plan, place, rendezvous, job.submission.copied_env, job.submission.restart, here=True)
        env.update(ours)
        return env

    def _process_env(
        self,
        plan: JobPlan,
        place: RankPlace,
        rendezvous: Rendezvous,
        copied: Mapping[str, str],
        restart: int,
        here: bool = False,
    ) -> Dict[str, str]:
        """A process's environment; a job with an image: the one in the container (``here``: its process here)."""
        cores_per_node = max(1, cpu_cores() // plan.num_nodes)  # simulated nodes share this host's cores
        if plan.image is None or here:
            return process_env(
                plan,
                place,
                rendezvous=rendezvous,
                inherited=os.environ,
                copied=copied,
                cores_per_node=cores_per_node,
                python=self.python,
                restart=restart,
            )
        # in a container: the job's own variables, never this host's PATH, venv or libraries
        env = process_env(
            plan,
            place,
            rendezvous=rendezvous,
            inherited={},
            copied=copied,
            cores_per_node=cores_per_node,
            python=None,
            restart=restart,
        )
        return images.container_env(env, plan, os.getcwd())

    def _command_containers(self, job: LocalJob, cwd: str) -> List[containers.NodeContainer]:
        """The containers of a command's nodes in an image, one per simulated node (none otherwise); with roles,
        those of each role whose command runs in its image."""
        plan = job.plan
        return [
            images.node_container(
                own,
                self.settings.containers,
                images.container_name(plan.job_id, job.attempt.id, node, job.submission.restart),
                node,
                cwd,
            )
            for node, own in enumerate(self._node_plans(plan))
            if own.image is not None and own.command is not None
        ]

    def _stop(self, job: LocalJob, status: JobState, detail: str) -> None:
        if job.stop_sent is not None:
            return
        job.stop_status, job.stop_detail, job.stop_sent = status, detail, time.monotonic()
        job.state = JobState.STOPPING
        if self.agent is not None:
            self.agent.stop(job.plan.job_id)

    # ------------------------------------------------------------------------------------------ the agent's news

    def _receive(self, message: Dict[str, Any]) -> None:
        job = self.jobs.get(message["job_id"])
        if job is None:
            return
        if message["op"] == "started":
            job.pids[message["index"]] = message["pid"]
        elif message["op"] == "exited" and job.elastic is not None:
            self._elastic_node_exited(job, message["index"], message["code"])
        elif message["op"] == "exited":
            job.running.discard(message["index"])
            job.last_exit = time.monotonic()
            if message["code"] != 0 and not message["stopped"] and job.stop_sent is None:
                job.failed_first = True  # the agent stops the others itself
                job.stop_sent, job.state = job.last_exit, JobState.STOPPING
            elif job.plan.roles and not job.node_agents and job.stop_sent is None:
                # (node agents watch the primary role themselves: mmt.agent.node.RoleWatch)
                self._role_exited(job, message["index"], message["code"])
        elif message["op"] == "ended":
            self._finish(job)

    def _elastic_node_exited(self, job: LocalJob, slot: int, code: int) -> None:
        """An elastic job's node agent ended: its ranks finished (0), or the node is lost (the world forms again
        without it, or the job fails below its minimum)."""
        assert job.elastic is not None and job.coordinator is not None
        job.running.discard(slot)
        job.last_exit = time.monotonic()
        if job.stop_sent is not None:
            return
        if code == 0:
            job.coordinator.node_done(job.elastic, slot)
            return
        failed = job.coordinator.node_lost(job.elastic, slot)
        if failed is not None:
            self._stop(job, JobState.FAILED, failed)
        elif job.elastic.change is not None:
            self.notices.append(f"mmt: {job.plan.label} ({job.plan.name}): {job.elastic.change.describe()}")

    def _elastic_tick(self, job: LocalJob) -> None:
        assert job.elastic is not None and job.coordinator is not None
        for spare in job.coordinator.restore_due(job.elastic):  # a lost node back, as a spare until it joins
            if self.agent is not None:
                self.agent.add(job.plan.job_id, spare)
                job.running.add(spare.index)
                self.notices.append(
                    f"mmt: {job.plan.label} ({job.plan.name}): node {spare.index} restored: it joins the world "
                    "after the next checkpoint"
                )
        before = job.elastic.change
        failed = job.coordinator.tick(job.elastic)
        change = job.elastic.change
        new = change is not None and (
            before is None or (before.restart, before.generation) != (change.restart, change.generation)
        )
        if change is not None and (
            new or (change.training_at is not None and (before is None or before.training_at is None))
        ):
            self.notices.append(f"mmt: {job.plan.label} ({job.plan.name}): {change.describe()}")
        job.port = job.elastic.port  # a new world meets on a port of its own
        if failed is not None:
            job.failed_first = True  # the job's failure is its first failed rank's (first_failure)
            self._stop(job, JobState.FAILED, failed)

    def _role_exited(self, job: LocalJob, index: int, code: int) -> None:
        """A process of a job with roles exited cleanly: once the primary role's have all ended, the job ends and
        the other roles are stopped; a role that may not end first (early_exit=fail) ending first fails the job."""
        plan = job.plan
        job.exit_codes[index] = code
        primary = plan.roles[0]
        if all(i in job.exit_codes for i in primary.indices):
            if job.running:
                others = ", ".join(r.name for r in plan.roles[1:] if any(i in job.running for i in r.indices))
                self._stop(job, JobState.COMPLETED, f"the primary role {primary.name} ended; stopped {others}")
            return
        role = plan.role_at(index)
        if role is not None and not role.primary and role.early_exit == "fail":
            place = plan.place(index)
            job.ended_early = RankFailure(
                rank=place.rank,
                node_rank=place.node_rank,
                exit_code=code,
                signal=None,
                exception=None,
                traceback=None,
                log=str(plan.log_path(index)),
                whole_node=role.per_node,
                role=role.name,
                ended_early=True,
            )
            self._stop(job, JobState.FAILED, job.ended_early.describe())

    def _finish(self, job: LocalJob) -> None:
        del self.jobs[job.plan.job_id]
        plan = job.plan if job.elastic is None else job.elastic.plan  # an elastic job: its last world's
        ended = time.monotonic()
        outcome = JobOutcome(status=JobState.COMPLETED, duration_s=ended - (job.started or ended))
        if job.stop_sent is not None:  # how long the processes took to go once stopping began
            outcome.stop_latency_s = max(0.0, (job.last_exit or ended) - job.stop_sent)
        failure = first_failure(plan, job.attempt)
        if job.failed_first or (failure is not None and job.stop_status is None):
            outcome.status, outcome.failure = JobState.FAILED, failure
            if failure is None:
                outcome.detail = "a process failed but left no record"
        elif job.stop_status is not None:
            outcome.status, outcome.detail = job.stop_status, job.stop_detail
            outcome.failure = job.ended_early
        self._conclude(job, outcome)

    def _conclude(self, job: LocalJob, outcome: JobOutcome) -> None:
        if job.port is not None:
            self.ports.release(job.port)
        for port in job.framework_ports + job.role_ports:
            self.ports.release(port)
        job.framework_ports, job.role_ports = [], []
        self.free_gpus.extend(job.gpus)
        job.gpus = []
        job.state, job.outcome = outcome.status, outcome

    def _agent_died(self, why: str) -> None:
        """The agent was killed (the OOM killer, kill -9): its ranks died with it (parent-death signal); what they
        left is found by the job's tag. Every running job fails, saying so; queued jobs get a new agent."""
        agent, self.agent = self.agent, None
        if agent is not None:
            agent.close(timeout_s=1)
        for job in list(self.jobs.values()):
            proctree.stop_tagged({MMT_JOB_ID: job.plan.job_id}, self.settings.kill_grace_s)
            if job.plan.images:
                held = self.settings.containers  # the runtime the job's containers are in
                containers.remove_labelled(held.runtime, job.plan.job_id, held.remove_flags)
            del self.jobs[job.plan.job_id]
            ended = time.monotonic()
            status = job.stop_status if job.stop_status is not None else JobState.FAILED
            detail = job.stop_detail if job.stop_status is not None else f"{why}; its processes were stopped"
            self._conclude(
                job,
                JobOutcome(
                    status,
                    ended - (job.started or ended),
                    detail=detail,
                    failure=first_failure(job.plan, job.attempt) if status == JobState.FAILED else None,
                ),
            )
