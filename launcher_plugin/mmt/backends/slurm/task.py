"""What runs in every task of an mmt SLURM job (pickled by submitit, called by ``submitit.core._submit``).

It maps SLURM's task variables onto the rank contract (one small table, as submitit's JobEnvironment does), and
then, by default (``tasks=per_node``), runs the node agent, which forks this node's ranks from one interpreter
(``mmt.agent.node``): Lightning sees the contract (LightningEnvironment), never SLURM's per-task variables. With
``tasks=per_rank`` the task is one rank itself and keeps SLURM's variables, so Lightning uses SLURMEnvironment.
Either way every rank takes the requeue signal through ``mmt.core.preemption``.
"""

import contextlib
import os
import re
import signal
import socket
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, Iterator, List, Mapping, Optional

from mmt.core import preemption
from mmt.agent.node import NodeRun
from mmt.agent.node import run as run_node
from mmt.agent.processes import ProcessSpec
from mmt.core.jobdir import Attempt, JobDir
from mmt.planning.environment import PythonEnvironment, Rendezvous, process_env
from mmt.planning.plan import JobPlan
from mmt.core.ports import PortInUseError, hold_port
from mmt.core.rank_env import MASTER_ADDR, MASTER_PORT

# SLURM variable -> the fact it gives
SLURM_ENV = {
    "job_id": "SLURM_JOB_ID",
    "global_rank": "SLURM_PROCID",
    "local_rank": "SLURM_LOCALID",
    "node": "SLURM_NODEID",
    "num_nodes": "SLURM_JOB_NUM_NODES",
    "nodelist": "SLURM_JOB_NODELIST",
    "cpus_on_node": "SLURM_CPUS_ON_NODE",
    "restarts": "SLURM_RESTART_COUNT",
}


# MASTER_PORT = PORT_BASE + job id % PORT_SPAN: below Linux's ephemeral range (32768-60999), whose ports any
# outgoing connection on the node may take
PORT_BASE, PORT_SPAN = 10000, 20000


def master_port(job_id: str) -> int:
    """A port every task of the job derives alike; different for concurrent jobs (ids differ)."""
    return PORT_BASE + int(re.sub(r"\D", "", job_id) or 0) % PORT_SPAN


@contextlib.contextmanager
def master_port_held(rendezvous: Rendezvous, attempt: Attempt, index: int, here: bool) -> Iterator[bool]:
    """Where ``here`` (node 0, or rank 0's own task), for as long as the block runs: hold the job's port, so that
    nothing on the node takes it while the ranks import and start (``mmt.core.ports``). A port another process holds
    already fails the job now, naming it (an error record of process ``index``; the block gets False), instead of
    rank 0 failing to bind it later or its peers waiting for a store that never comes."""
    if not here:
        yield True
        return
    try:
        held = hold_port("", int(str(rendezvous.master_port)))
    except PortInUseError as exc:
        attempt.write_error(index, {
            "exception": f"PortInUseError: MASTER_PORT {rendezvous.master_port} on {socket.gethostname()} is in use "
                         "by another process (it derives from the SLURM job id). HINT: submit again: another job "
                         "id gives another port",
            "traceback": str(exc)})
        yield False
        return
    with held:
        yield True


def first_host(nodelist: str) -> str:
    """node0 of the job: ``scontrol show hostnames`` expands SLURM's compressed lists (node[1-2,5])."""
    try:
        out = subprocess.run(["scontrol", "show", "hostnames", nodelist], capture_output=True, text=True,
                             timeout=30, check=True).stdout
        return out.split()[0]
    except (OSError, subprocess.SubprocessError, IndexError):
        return re.split(r"[\[,]", nodelist)[0]


def node_cores(cpus_on_node: Optional[str]) -> int:
    """The cores the node's ranks share (OMP_NUM_THREADS = this // ranks per node): SLURM's CPUs on the node, but
    never more than the host has. A node can declare more CPUs than it has (virtual or oversubscribed nodes,
    like the test cluster's); OpenMP threads past the real cores spin against each other (a 2 x 2 LM job took
    147 s instead of 22 s on the test cluster)."""
    host = os.cpu_count() or 1
    return min(int(cpus_on_node), host) if cpus_on_node else host


def requeue_env(facts: Mapping[str, str], attempt: Attempt, max_requeues: int) -> Dict[str, str]:
    """What every rank needs to take the requeue signal (``mmt.core.preemption``)."""
    restarts = int(facts.get("restarts") or 0)
    return {preemption.PREEMPTIBLE_VAR: "1", preemption.MAX_REQUEUES_VAR: str(max_requeues),
            preemption.JOB_ID_VAR: facts["job_id"], preemption.RESTARTS_VAR: str(restarts),
            preemption.MARKER_VAR: str(attempt.requeued_file(restarts))}


@dataclass(frozen=True)
class SlurmTask:
    """The callable submitit runs in each task of one job."""

    plan: JobPlan
    attempt_dir: str
    per_node_tasks: bool
    kill_grace_s: float
    start_method: str
    max_requeues: int
    # the values of plan.env_from (the pickle submitit keeps is the owner's only)
    copied_env: Dict[str, str] = field(repr=False, default_factory=dict)

    def _env(self, facts: Dict[str, str], index: int, keep: Mapping[str, str],
             rendezvous: Optional[Rendezvous] = None) -> Dict[str, str]:
        rendezvous = rendezvous or Rendezvous(first_host(facts["nodelist"]), master_port(facts["job_id"]))
        env = process_env(self.plan, self.plan.place(index), rendezvous=rendezvous, inherited=os.environ,
                          copied=self.copied_env, cores_per_node=node_cores(facts.get("cpus_on_node")),
                          python=PythonEnvironment.current() if self.plan.image is None else None, keep=keep)
        env.update(requeue_env(facts, self.attempt, self.max_requeues))
        return env

    @property
    def attempt(self) -> Attempt:
        return Attempt(Path(self.attempt_dir))

    def __call__(self) -> int:
        facts = {key: os.environ.get(name, "") for key, name in SLURM_ENV.items()}
        node = int(facts["node"])
        signal.signal(signal.SIGTERM, signal.SIG_DFL)  # submitit ignores SIGTERM; stop when SLURM says so
        code = self._run_node(facts, node) if self.per_node_tasks else self._run_rank(facts)
        if code != 0:
            raise RuntimeError(f"node {node} of job {self.plan.label} failed (exit code {code}); see "
                               f"{JobDir(Path(self.plan.job_dir)).logs}")
        return code

    def _run_node(self, facts: Dict[str, str], node: int) -> int:
        job_dir = JobDir(Path(self.plan.job_dir))
        job_dir.logs.mkdir(parents=True, exist_ok=True)
        rendezvous = Rendezvous(first_host(facts["nodelist"]), master_port(facts["job_id"]))  # once per node
        with master_port_held(rendezvous, self.attempt, self.plan.node_indices(node)[0], here=node == 0) as held:
            return self._run_agent(facts, node, rendezvous, job_dir) if held else 1

    def _run_agent(self, facts: Dict[str, str], node: int, rendezvous: Rendezvous, job_dir: JobDir) -> int:
        specs = []
        for index in self.plan.node_indices(node):
            self.attempt.clear_process(index)  # a requeued job runs again in place
            place = self.plan.place(index)
            specs.append(ProcessSpec(job_id=self.plan.job_id, index=index, node_rank=node, attempt_dir=self.attempt_dir,
                                     env=self._env(facts, index, {}, rendezvous), cwd=os.getcwd(),
                                     log=str(job_dir.log(place.node_rank, place.rank, self.plan.per_node))))
        return run_node(NodeRun(job_id=self.plan.job_id, node_rank=node, job_dir=self.plan.job_dir,
                                attempt_dir=self.attempt_dir, kill_grace_s=self.kill_grace_s,
                                preload=self.plan.preload, method=self.start_method, processes=tuple(specs),
                                metrics_interval_s=self.plan.metrics_interval_s))

    def _run_rank(self, facts: Dict[str, str]) -> int:
        index = int(facts["node"]) if self.plan.per_node else int(facts["global_rank"])
        place = self.plan.place(index)
        assert self.plan.per_node or place.rank == int(facts["global_rank"]), "SLURM's layout must match the plan's"
        # per-rank tasks keep SLURM's variables: Lightning then uses SLURMEnvironment and checks devices/num_nodes
        # against them (a per-node command starts its own ranks: Lightning would refuse --ntasks-per-node=1)
        keep = {} if self.plan.per_node else {k: v for k, v in os.environ.items()
                                              if k.startswith(("SLURM_", "SLURMD_"))}
        env = self._env(facts, index, keep)
        os.environ.clear()
        os.environ.update(env)
        log = JobDir(Path(self.plan.job_dir)).log(place.node_rank, place.rank, self.plan.per_node)
        _redirect_output(log)
        from mmt.worker import main as worker

        self.attempt.clear_process(index)
        rendezvous = Rendezvous(env[MASTER_ADDR], int(env[MASTER_PORT]))
        with master_port_held(rendezvous, self.attempt, index, here=index == 0) as held:
            return worker.run(self.attempt, index) if held else 1


def _redirect_output(log: Path) -> None:
    log.parent.mkdir(parents=True, exist_ok=True)
    sys.stdout.flush()
    sys.stderr.flush()
    fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.close(fd)
    sys.stdout = open(1, "w", buffering=1, closefd=False)
    sys.stderr = open(2, "w", buffering=1, closefd=False)


def failed_tasks(stderr_text: str) -> List[Dict[str, object]]:
    """srun's own report of tasks that died, in order: ``srun: error: node1: task 3: Exited with exit code 137``."""
    found = []
    for match in re.finditer(r"srun: error: (\S+): tasks? ([\d,\-]+): (Exited with exit code (\d+)|Killed|"
                             r"Terminated|[^\n]+)", stderr_text):
        first = int(re.split(r"[,\-]", match.group(2))[0])
        code = int(match.group(4)) if match.group(4) else None
        found.append({"host": match.group(1), "task": first, "exit_code": code, "how": match.group(3)})
    return found
