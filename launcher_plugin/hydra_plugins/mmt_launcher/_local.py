"""The local backend: every job runs as N simulated nodes x M processes on this host.

Each simulated node is a set of processes with its own NODE_RANK (and its own slice of GPUs when the host has
them); all nodes share the host's loopback, MASTER_ADDR is 127.0.0.1 and every job gets its own free port. Jobs
of a sweep run side by side under ``max_parallel_ranks``. The first process that fails stops its job: SIGTERM to
every other process group, SIGKILL after ``kill_grace_s``. A job past its time limit is stopped the same way.
"""

import os
import selectors
import signal
import sys
import time
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, List, Optional, Sequence, TextIO, Tuple

from mmt.rank_env import node_env, rank_env

from . import _validate as check
from ._agent import AgentClient
from ._console import LogFollower, tail
from ._host import PortAllocator, cpu_cores, visible_gpus
from ._outcome import COMPLETED, FAILED, INTERRUPTED, TIMEOUT, JobOutcome, read_failure
from ._plan import JobPlan
from ._signals import SignalTrap
from .errors import ConfigError

_POLL_S = 0.05


@dataclass(frozen=True)
class LocalSettings:
    """The launcher-wide settings of the local backend (``hydra.launcher.*``), validated."""

    max_parallel_ranks: int
    master_addr: str
    start_method: str
    kill_grace_s: float
    console: str

    @classmethod
    def from_config(cls, cfg) -> "LocalSettings":
        limit = cfg.max_parallel_ranks
        return cls(
            max_parallel_ranks=max(4, cpu_cores()) if limit is None else check.whole_number(
                "hydra.launcher.max_parallel_ranks", limit, 1, "e.g. hydra.launcher.max_parallel_ranks=8"),
            master_addr=str(cfg.master_addr),
            start_method=check.choice("hydra.launcher.start_method", cfg.start_method, ("fork", "spawn")),
            kill_grace_s=check.positive_number("hydra.launcher.kill_grace_s", cfg.kill_grace_s,
                                               "seconds between SIGTERM and SIGKILL, e.g. 1"),
            console=check.choice("hydra.launcher.console", cfg.console, ("rank0", "all", "none")),
        )


@dataclass
class _Process:
    index: int  # position in plan.places(): the global rank, or the node in per-node command mode
    rank: int
    node_rank: int
    label: str
    log: Path
    pid: Optional[int] = None
    code: Optional[int] = None  # exit code once it exited; negative: killed by that signal
    done: bool = False
    exited_at: Optional[float] = None


@dataclass
class _Job:
    plan: JobPlan
    processes: List[_Process]
    started: float
    gpus: List[str]
    deadline: float
    followers: List[LogFollower] = field(default_factory=list)
    ended: Optional[float] = None
    stop_status: Optional[str] = None  # why we are stopping it: FAILED, TIMEOUT or INTERRUPTED
    stop_detail: str = ""
    stop_sent: Optional[float] = None
    killed: bool = False
    first_failure: Optional[_Process] = None

    @property
    def finished(self) -> bool:
        return all(p.done for p in self.processes)


class LocalBackend:
    name = "local"

    def __init__(self, settings: LocalSettings, out: TextIO = sys.stdout) -> None:
        self.settings = settings
        self.out = out
        self.ports = PortAllocator(settings.master_addr)
        self.host_gpus = visible_gpus()
        self.free_gpus = list(self.host_gpus)
        self.interrupted_by: Optional[int] = None

    # ------------------------------------------------------------------------------------------ planning

    def problems(self, plan: JobPlan) -> List[ConfigError]:
        """Why this host cannot run ``plan`` (empty when it can)."""
        found = []
        if plan.image is not None:
            found.append(ConfigError(
                "image", plan.image, "cluster=local runs every node in this host's Python environment and uses "
                "no container runtime", "drop image=... to run here, or submit with cluster=slurm, which runs "
                "images through pyxis or apptainer"))
        needed = plan.world_size if plan.machine.gpus else 0
        if needed > len(self.host_gpus):
            found.append(ConfigError(
                "machine", plan.machine.name, f"{plan.num_nodes} nodes x {plan.devices} GPUs need {needed} GPUs "
                f"on this host (cluster=local) but it has {len(self.host_gpus)}",
                "simulate on CPU with machine=cpu, use fewer nodes/devices, or cluster=slurm"))
        return found

    def describe(self, plan: JobPlan) -> List[str]:
        lines = [f"  backend    local: {plan.num_nodes} simulated nodes on this host, MASTER_ADDR="
                 f"{self.settings.master_addr}, start_method={self.settings.start_method}"]
        lines += [f"  WARNING    {problem}" for problem in self.problems(plan)]
        return lines

    def preflight(self, plans: Sequence[JobPlan]) -> None:
        for plan in plans:
            problems = self.problems(plan)
            if problems:
                raise problems[0]

    # ------------------------------------------------------------------------------------------ running

    def run(self, plans: Sequence[JobPlan]) -> List[JobOutcome]:
        outcomes: Dict[int, JobOutcome] = {}
        pending = deque(plans)
        running: List[_Job] = []
        self.agent = AgentClient()
        self.by_pid: Dict[int, Tuple[_Job, _Process]] = {}
        self.by_token: Dict[str, Tuple[_Job, _Process]] = {}
        selector = selectors.DefaultSelector()
        selector.register(self.agent.fileno(), selectors.EVENT_READ)
        try:
            with SignalTrap() as trap:
                while pending or running:
                    if trap.received is not None and self.interrupted_by is None:
                        self.interrupted_by = trap.received
                        reason = f"stopped: the launcher received {signal.Signals(trap.received).name}"
                        for job in running:
                            self._stop(job, INTERRUPTED, reason)
                        while pending:
                            outcomes[pending.popleft().num] = JobOutcome(INTERRUPTED, None, detail="not started: "
                                                                         + reason.split(": ", 1)[1])
                    while pending and self.interrupted_by is None and self._fits(pending[0], running):
                        running.append(self._start(pending.popleft()))
                    if selector.select(timeout=_POLL_S):
                        self._receive()
                    for job in list(running):
                        self._supervise(job)
                        for follower in job.followers:
                            follower.poll()
                        if job.finished:
                            running.remove(job)
                            outcomes[job.plan.num] = self._finish(job)
        finally:
            selector.close()
            self.agent.close()  # the agent kills anything still alive (only after an exception here)
        return [outcomes[plan.num] for plan in plans]

    def _fits(self, plan: JobPlan, running: List[_Job]) -> bool:
        if plan.machine.gpus and len(self.free_gpus) < plan.world_size:
            return False
        busy = sum(job.plan.world_size for job in running)
        return not running or busy + plan.world_size <= self.settings.max_parallel_ranks

    def _start(self, plan: JobPlan) -> _Job:
        gpus = [self.free_gpus.pop(0) for _ in range(plan.world_size)] if plan.machine.gpus else []
        port = self.ports.allocate()
        logs = Path(plan.job_dir) / "logs"
        logs.mkdir(parents=True, exist_ok=True)
        per_node = plan.per_node
        cores_per_node = max(1, cpu_cores() // plan.num_nodes)  # simulated nodes share this host's cores
        started = time.monotonic()
        job = _Job(plan=plan, processes=[], started=started, gpus=gpus, deadline=started + plan.timeout_s)
        common = dict(master_addr=self.settings.master_addr, master_port=port, job_dir=plan.job_dir,
                      job_id=plan.job_id, base_env=os.environ, job_env=plan.env, cores_per_node=cores_per_node,
                      extra=plan.extra_env())
        for index, place in enumerate(plan.places()):
            log = logs / plan.log_name(place)
            if per_node:
                env = node_env(place.node_rank, num_nodes=plan.num_nodes, local_world_size=plan.devices, **common)
                label = f"n{place.node_rank}"
            else:
                env = rank_env(place, **common)
                label = f"n{place.node_rank} r{place.rank}"
            if gpus:  # node n sees its own devices; LOCAL_RANK indexes into them
                env["CUDA_VISIBLE_DEVICES"] = ",".join(gpus[place.node_rank * plan.devices:][:plan.devices])
            elif self.host_gpus:
                env["CUDA_VISIBLE_DEVICES"] = ""  # a CPU job on a GPU host keeps its hands off the GPUs
            process = _Process(index=index, rank=place.rank, node_rank=place.node_rank, label=label, log=log)
            token = self.agent.spawn(payload_dir=str(Path(plan.job_dir) / ".mmt"), index=index, env=env,
                                     cwd=os.getcwd(), log=str(log), preload=plan.preload,
                                     method=self.settings.start_method)
            self.by_token[token] = (job, process)
            job.processes.append(process)
            if self.settings.console == "all" or (self.settings.console == "rank0" and index == 0):
                job.followers.append(LogFollower(log, f"[#{plan.num} {label}] ", self.out))
        return job

    def _receive(self) -> None:
        message = self.agent.receive()
        if message["op"] == "started":
            job, process = self.by_token.pop(message["token"])
            process.pid = message["pid"]
            self.by_pid[process.pid] = (job, process)
            if job.stop_sent is not None:  # stopped before it even started
                self.agent.signal(process.pid, signal.SIGKILL if job.killed else signal.SIGTERM)
        elif message["op"] == "exited":
            job, process = self.by_pid.pop(message["pid"])
            process.code, process.done, process.exited_at = message["code"], True, time.monotonic()
            if process.code != 0 and job.stop_status is None:
                job.first_failure = process
                self._stop(job, FAILED, "")

    def _stop(self, job: _Job, status: str, detail: str) -> None:
        job.stop_status, job.stop_detail, job.stop_sent = status, detail, time.monotonic()
        for process in job.processes:
            if process.pid is not None and not process.done:
                self.agent.signal(process.pid, signal.SIGTERM)

    def _supervise(self, job: _Job) -> None:
        now = time.monotonic()
        if job.stop_status is None and now >= job.deadline:
            still = [p for p in job.processes if not p.done]
            self._stop(job, TIMEOUT, ", ".join(f"rank {p.rank} (node {p.node_rank})" for p in still))
        if job.stop_sent is not None and not job.killed and now - job.stop_sent >= self.settings.kill_grace_s:
            job.killed = True
            for process in job.processes:
                if process.pid is not None and not process.done:
                    self.agent.signal(process.pid, signal.SIGKILL)

    def _finish(self, job: _Job) -> JobOutcome:
        job.ended = time.monotonic()
        self.free_gpus.extend(job.gpus)
        for follower in job.followers:
            follower.finish()
        status = job.stop_status or COMPLETED
        outcome = JobOutcome(status=status, duration_s=job.ended - job.started, detail=job.stop_detail)
        if job.stop_sent is not None:  # how long the other ranks took to go once we started stopping them
            outcome.stop_latency_s = max(p.exited_at or job.ended for p in job.processes) - job.stop_sent
        failed = job.first_failure
        if status == FAILED and failed is not None:
            code = failed.code
            outcome.failure = read_failure(
                Path(job.plan.job_dir) / ".mmt", failed.index, failed.node_rank, failed.rank,
                code if code is not None and code >= 0 else None,
                signal.Signals(-code).name if code is not None and code < 0 else None, str(failed.log),
                whole_node=job.plan.per_node)
            if failed.index != 0 or self.settings.console == "none":
                self._show_tail(job.plan, failed)
        return outcome

    def _show_tail(self, plan: JobPlan, process: _Process) -> None:
        lines = tail(process.log)
        if lines:
            self.out.write(f"[#{plan.num} {process.label}] --- last lines of {process.log} ---\n")
            self.out.write("".join(f"[#{plan.num} {process.label}] {line}\n" for line in lines))
            self.out.flush()
