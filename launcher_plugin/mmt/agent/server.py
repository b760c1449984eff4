"""The local host agent: one process per launcher that forks the ranks of every local job, for as long as the
launcher lives (every batch a sweeper hands it), so torch is imported once per launcher, not once per batch.

It is also the clean-up guarantee: it adopts orphaned descendants (a child subreaper), and when the launcher goes
away for any reason (normal exit, Ctrl-C, SIGKILL) it sees its socket close, or gets SIGTERM from the kernel
(parent-death signal), and kills every process of every job before it exits.

``python -m mmt.agent.server <socket fd> <launcher pid>``, started by :class:`mmt.agent.client.AgentClient`.
"""

import os
import selectors
import signal
import socket
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, List, NoReturn, Optional, Tuple

from mmt.agent import containers as node_containers
from mmt.agent import protocol
from mmt.agent.jobs import JobProcesses
from mmt.agent.metrics import JobMetrics
from mmt.agent.processes import ProcessSpec, Spawner
from mmt.core import proctree, timeline
from mmt.core.jobdir import Attempt
from mmt.core.snapshot import CodeSnapshot

_TICK_S = 0.05


@dataclass(frozen=True)
class StartJob:
    """Start these processes of one job (every node of a local job)."""

    job_id: str
    job_dir: str
    attempt_dir: str
    kill_grace_s: float
    preload: Tuple[str, ...]
    processes: Tuple[ProcessSpec, ...]
    metrics_interval_s: float = 0.0
    # the nodes' containers (a job with an image), started by the backend: removed when the job ends
    containers: Tuple[node_containers.NodeContainer, ...] = ()
    # its processes are node agents (one per container), which record their ranks and sample their metrics
    node_agents: bool = False
    # one failed process stops the others; not for an elastic job's node agents (the backend decides)
    fail_fast: bool = True
    # the launch's copy of the project, which the preload and the ranks import from
    snapshot: Optional[CodeSnapshot] = None


class HostAgent:
    def __init__(self, sock: socket.socket, method: str) -> None:
        self.sock = sock
        self.spawner = Spawner(method)
        self.jobs: Dict[str, JobProcesses] = {}
        self.metrics: Dict[str, JobMetrics] = {}
        self.pid_to_job: Dict[int, str] = {}
        self.containers: Dict[str, Tuple[node_containers.NodeContainer, ...]] = {}
        self.jobs_started = 0

    def serve(self) -> None:
        wake_r, wake_w = os.pipe()
        os.set_blocking(wake_w, False)
        signal.set_wakeup_fd(wake_w)
        signal.signal(signal.SIGCHLD, lambda *_: None)
        signal.signal(signal.SIGTERM, lambda *_: self.shutdown())
        selector = selectors.DefaultSelector()
        selector.register(self.sock, selectors.EVENT_READ)
        selector.register(wake_r, selectors.EVENT_READ)
        while True:
            busy = any(not job.ended for job in self.jobs.values())
            for key, _ in selector.select(timeout=self._timeout() if busy else 1.0):
                if key.fileobj is self.sock:
                    message = protocol.recv(self.sock)
                    if message is None:
                        self.shutdown()
                    self.handle(message)
                else:
                    os.read(wake_r, 4096)
            self.reap()
            for job in list(self.jobs.values()):
                self.metrics[job.job_id].sample(job)
                self.supervise(job)

    def _timeout(self) -> float:
        dues = [m.next_due() for m in self.metrics.values()]
        soonest = min((d for d in dues if d is not None), default=None)
        return _TICK_S if soonest is None else max(0.0, min(_TICK_S, soonest - time.monotonic()))

    def handle(self, message: dict) -> None:
        if message["op"] == "start":
            self.start(message["job"])
        elif message["op"] == "add" and message["job_id"] in self.jobs:
            self.add(self.jobs[message["job_id"]], message["process"])
        elif message["op"] == "stop" and message["job_id"] in self.jobs:
            self.jobs[message["job_id"]].stop()
        elif message["op"] == "kill" and message["job_id"] in self.jobs:
            self.jobs[message["job_id"]].kill_now()

    def start(self, request: StartJob) -> None:
        job = JobProcesses(
            request.job_id,
            Attempt(Path(request.attempt_dir)),
            request.kill_grace_s,
            rank_records=not request.node_agents,
            fail_fast=request.fail_fast,
        )
        self.jobs[request.job_id] = job
        if request.containers:
            self.containers[request.job_id] = request.containers
        interval = 0.0 if request.node_agents else request.metrics_interval_s
        self.metrics[request.job_id] = JobMetrics(request.job_dir, request.processes, interval)
        path = job.attempt.timeline
        if not self.jobs_started:  # the agent's own start, once: it was warmed up before the first job
            timeline.mark_at(path, timeline.TASK_START, timeline.process_start_time(), node="host")
        self.jobs_started += 1
        timeline.mark_at(path, timeline.AGENT_START, node="host")
        self.spawner.preload(request.preload, snapshot=request.snapshot)
        timeline.mark_at(path, timeline.AGENT_READY, node="host")
        for spec in request.processes:
            self.add(job, spec)

    def add(self, job: JobProcesses, spec: ProcessSpec) -> None:
        pid = self.spawner.start(spec)
        self.pid_to_job[pid] = job.job_id
        job.started(spec.index, pid)  # (one added to a job that is stopping is stopped at once)
        self.send({"op": "started", "job_id": job.job_id, "index": spec.index, "pid": pid})

    def reap(self, report: bool = True) -> None:
        for pid, code in proctree.reaped():
            job_id = self.pid_to_job.pop(pid, None)
            if job_id is None:
                continue  # an adopted orphan: reaped so it does not linger as a zombie
            process = self.jobs[job_id].exited(pid, code)
            assert process is not None
            if report:
                self.send(
                    {
                        "op": "exited",
                        "job_id": job_id,
                        "index": process.index,
                        "code": process.code,
                        "stopped": process.stopped,
                    }
                )

    def supervise(self, job: JobProcesses) -> None:
        job.tick()
        if job.ended:
            del self.jobs[job.job_id]
            del self.metrics[job.job_id]
            held = self.containers.pop(job.job_id, ())
            self.send({"op": "ended", "job_id": job.job_id})
            # every process is gone: the containers go while the launcher concludes (a launcher that closes the
            # agent waits for it to exit, so none outlives the launch)
            node_containers.remove(held)

    def send(self, message: dict) -> None:
        try:
            protocol.send(self.sock, message)
        except OSError:  # the launcher is gone
            self.shutdown()

    def shutdown(self) -> NoReturn:
        """Kill every process of every job (SIGTERM, then SIGKILL) and exit."""
        for job in self.jobs.values():
            job.stop()
        deadline = time.monotonic() + max([j.kill_grace_s for j in self.jobs.values()] + [0.0]) + 1.0
        while any(job.running for job in self.jobs.values()) and time.monotonic() < deadline:
            self.reap(report=False)  # the launcher is gone: nobody to tell
            time.sleep(0.02)
        for job in self.jobs.values():
            job.kill_now()
        self.reap(report=False)
        held = [c for job in self.containers.values() for c in job]
        node_containers.remove(held)
        # a container still being created when its runtime's client was killed can outlive that rm: once more by
        # its job's label (the launcher is gone: nothing waits for this)
        for job_id, job_containers in self.containers.items():
            if job_containers:
                first = job_containers[0]
                node_containers.remove_labelled(first.runtime, job_id, first.remove_flags)
        os._exit(0)


def main(argv: Optional[List[str]] = None) -> None:
    fd, parent, method, *preload = argv or sys.argv[1:]
    # Ctrl-C goes to the launcher, which stops the jobs; SIGTERM when the launcher dies means "clean up"
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
    proctree.set_parent_death_signal(signal.SIGTERM)
    if os.getppid() != int(parent):  # the launcher died before the death signal was armed
        return
    proctree.become_subreaper()
    agent = HostAgent(socket.socket(fileno=int(fd)), method)
    # what every worker imports, and what the launch expects its jobs to preload, before the first job arrives
    agent.spawner.preload(preload)
    agent.serve()


if __name__ == "__main__":
    main()
