"""What runs in every task of an mmt SLURM job: ``python -u -m mmt.backends.slurm.task <attempt dir>/task.pkl``.

The launcher writes the job's :class:`SlurmTask` into its attempt dir (private: it holds the secrets the job copies)
and submits through submitit, whose sbatch script's srun line runs this module, not submitit's own runner: a task
then imports mmt, Hydra and the job's preload, never submitit (a tenth of a second of CPU on every node before its
ranks can start). The callable submitit keeps (:func:`run_task_file`) runs the same file, should anything call it.

It maps SLURM's task variables onto the rank contract (one small table, as submitit's JobEnvironment does), and
then, by default (``tasks=per_node``), runs the node agent, which forks this node's ranks from one interpreter
(``mmt.agent.node``): Lightning sees the contract (LightningEnvironment), never SLURM's per-task variables. With
``tasks=per_rank`` the task is one rank itself and keeps SLURM's variables, so Lightning uses SLURMEnvironment.
Either way every rank takes the requeue signal through ``mmt.core.preemption``.
"""

import contextlib
import json
import os
import re
import shlex
import signal
import socket
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, Iterator, List, Mapping, Optional, Sequence, Tuple

from mmt.agent.node import NodeRun, RoleWatch, role_watch
from mmt.agent.node import run as run_node
from mmt.agent.processes import ProcessSpec
from mmt.backends.elastic import elastic_rank
from mmt.backends.slurm import oci
from mmt.backends.slurm.nodes import node_hosts, requeue_why
from mmt.backends.slurm.sbatch import STARTED_VAR, own_job_id
from mmt.core import preemption, timeline
from mmt.core.jobdir import Attempt, JobDir, open_for_append, write_atomic
from mmt.core.ports import PortInUseError, hold_port
from mmt.core.rank_env import MMT_CONTAINER_EXEC, MMT_RESTART_COUNT
from mmt.monitor import hangs
from mmt.planning.environment import (
    PythonEnvironment,
    Rendezvous,
    RoleSite,
    process_env,
    role_process_env,
    roles_document,
)
from mmt.planning.plan import JobPlan
from mmt.records.payload import read_task, write_task
from mmt.records.restarts import record_requeue
from mmt.records.schema import ErrorRecord

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
# The framework's ports (one per TensorFlow worker, JAX's coordinator): from the rest of the range below the
# ephemeral one, 30000-32767, in a window of FRAMEWORK_PORT_WINDOW ports per job id: process i of job j takes
# 30000 + (j % 346) * 8 + i % 8. Neighbouring job ids get disjoint windows (ids 346 apart share one); within a job,
# the processes of one host (at most 8 per host: a TensorFlow job with more devices per node is refused) get
# distinct ports, and so does every process of a job of up to 8, which is what hosts that share one network
# stack (the test cluster's nodes) need. Every node derives the same ports alone: no talk between nodes.
FRAMEWORK_PORT_BASE, FRAMEWORK_PORT_WINDOW = 30000, 8
FRAMEWORK_PORT_SLOTS = (32768 - FRAMEWORK_PORT_BASE) // FRAMEWORK_PORT_WINDOW


def _job_number(job_id: str) -> int:
    return int(re.sub(r"\D", "", job_id) or 0)


# A job with roles: each role's MASTER_PORT and its own port (MMT_ROLE_<NAME>_PORT), two per role, from a window of
# ROLE_PORT_WINDOW per job id in MASTER_PORT's range (its roles' windows are disjoint for up to 4 roles)
ROLE_PORT_WINDOW = 8


def role_ports(job_id: str, role: int) -> Tuple[int, int]:
    """Role ``role``'s (its index, the primary 0) MASTER_PORT and own port, which every task derives alike."""
    first = PORT_BASE + (_job_number(job_id) * ROLE_PORT_WINDOW + 2 * role) % (PORT_SPAN - 1)
    return first, first + 1


def master_port(job_id: str, generation: int = 0) -> int:
    """A port every task of the job derives alike; different for concurrent jobs (ids differ). An elastic job's
    later worlds (``generation``) each take another: far from the next job ids' (a prime step)."""
    return PORT_BASE + (_job_number(job_id) + ELASTIC_PORT_STEP * generation) % PORT_SPAN


ELASTIC_PORT_STEP = 1009


def framework_port(job_id: str, index: int) -> int:
    """The port of process ``index``'s framework server (TF_CONFIG), or JAX's coordinator (index 0)."""
    slot = _job_number(job_id) % FRAMEWORK_PORT_SLOTS
    return FRAMEWORK_PORT_BASE + slot * FRAMEWORK_PORT_WINDOW + index % FRAMEWORK_PORT_WINDOW


def framework_ports(plan: JobPlan, job_id: str) -> Tuple[int, ...]:
    return tuple(framework_port(job_id, index) for index in range(plan.framework_port_count))


def hold_or_report(port: int, name: str, attempt: Attempt, index: int, stack: contextlib.ExitStack) -> bool:
    """Hold ``port`` until ``stack`` closes; a port another process holds already fails the job now, naming it
    (an error record of process ``index``), instead of a rendezvous that waits for the time limit."""
    try:
        stack.enter_context(hold_port("", port))
        return True
    except PortInUseError as exc:
        ErrorRecord(
            exception=f"PortInUseError: {name} {port} on {socket.gethostname()} is in use by another "
            "process (it derives from the SLURM job id). HINT: submit again: another job id gives "
            "another port",
            traceback=str(exc),
        ).write(attempt.error_file(index))
        return False


@contextlib.contextmanager
def master_port_held(rendezvous: Rendezvous, attempt: Attempt, index: int, here: bool) -> Iterator[bool]:
    """Where ``here`` (node 0, or rank 0's own task), for as long as the block runs: hold the job's port, so that
    nothing on the node takes it while the ranks import and start (``mmt.core.ports``). A port another process holds
    already fails the job now, naming it (an error record of process ``index``; the block gets False), instead of
    rank 0 failing to bind it later or its peers waiting for a store that never comes."""
    with contextlib.ExitStack() as stack:
        yield not here or hold_or_report(int(str(rendezvous.master_port)), "MASTER_PORT", attempt, index, stack)


@contextlib.contextmanager
def framework_ports_held(
    plan: JobPlan, rendezvous: Rendezvous, attempt: Attempt, indices: Sequence[int]
) -> Iterator[bool]:
    """For as long as the block runs, hold the framework ports of processes ``indices`` (those of this node, or
    this rank's own task), as :func:`master_port_held` holds MASTER_PORT: TensorFlow's and JAX's servers bind them
    while held (they set SO_REUSEADDR, as TCPStore does). The block gets False when one is in use already."""

    def name(index: int) -> str:
        return f"worker {index}'s TF_CONFIG port" if plan.framework == "tensorflow" else "JAX's coordinator port"

    with contextlib.ExitStack() as stack:
        yield all(hold_or_report(int(str(rendezvous.framework_ports[i])), name(i), attempt, i, stack) for i in indices)


def node_cores(cpus_on_node: Optional[str]) -> int:
    """The cores the node's ranks share (OMP_NUM_THREADS = this // ranks per node): SLURM's CPUs on the node, but
    never more than the host has. A node can declare more CPUs than it has (virtual or oversubscribed nodes,
    like the test cluster's); OpenMP threads past the real cores spin against each other (a 2 x 2 LM job took
    147 s instead of 22 s on the test cluster)."""
    host = os.cpu_count() or 1
    return min(int(cpus_on_node), host) if cpus_on_node else host


def requeue_env(facts: Mapping[str, str], attempt: Attempt, max_requeues: int, index: int = 0) -> Dict[str, str]:
    """What process ``index`` needs to take the requeue signal (``mmt.core.preemption``)."""
    restarts = int(facts.get("restarts") or 0)
    return {
        preemption.PREEMPTIBLE_VAR: "1",
        preemption.MAX_REQUEUES_VAR: str(max_requeues),
        preemption.REQUEUE_COMMAND_VAR: shlex.join(["scontrol", "requeue", facts["job_id"]]),
        preemption.RESTARTS_VAR: str(restarts),
        preemption.MARKER_VAR: str(attempt.requeued_file(restarts)),
        preemption.ACK_VAR: str(attempt.dir / f"requeue-signal.{restarts}.{index}"),
    }


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
    # a command job in SLURM's OCI containers: the attempt's bundle, where each rank's command runs (mmt...oci)
    oci_bundle: Optional[str] = None

    def _rendezvous(self, facts: Mapping[str, str]) -> Rendezvous:
        """Node 0's address and MASTER_PORT, every node's address (the allocation's hosts, in node order) and the
        framework's ports: the same in every task, derived from SLURM's facts alone."""
        hosts = node_hosts(facts["nodelist"])
        return Rendezvous(
            hosts[0],
            master_port(facts["job_id"]),
            node_addrs=tuple(hosts[: self.plan.num_nodes]),
            framework_ports=framework_ports(self.plan, facts["job_id"]),
        )

    def _role_sites(self, facts: Mapping[str, str]) -> Dict[str, RoleSite]:
        """A job with roles: where each role is, from its heterogeneous component's hosts (component i: role i, the
        primary first) and the ports its job id gives it; the same in every task."""
        sites = {}
        for index, role in enumerate(self.plan.roles):
            nodelist = os.environ.get(f"SLURM_JOB_NODELIST_HET_GROUP_{index}") or facts["nodelist"]
            hosts = node_hosts(nodelist)
            meet, serve = role_ports(facts["job_id"], index)
            sites[role.name] = RoleSite(Rendezvous(hosts[0], meet, node_addrs=tuple(hosts[: role.num_nodes])), serve)
        return sites

    def _env(
        self,
        facts: Dict[str, str],
        index: int,
        keep: Mapping[str, str],
        rendezvous: Optional[Rendezvous] = None,
        sites: Optional[Mapping[str, RoleSite]] = None,
        plan: Optional[JobPlan] = None,
    ) -> Dict[str, str]:
        plan = plan or self.plan  # an elastic job's world's plan
        common: Dict[str, Any] = dict(
            inherited=os.environ,
            copied=self.copied_env,
            cores_per_node=node_cores(facts.get("cpus_on_node")),
            # in an image (the job's, or with roles its role's): the image's own Python, not this one
            python=PythonEnvironment.current() if (self.plan.role_at(index) or self.plan).image is None else None,
            keep=keep,
            # the batch script's restart loop counts the runs inside the allocation (sbatch.with_restart_loop)
            restart=int(os.environ.get(MMT_RESTART_COUNT) or 0),
        )
        if sites is not None:
            roles_file = str(JobDir(Path(self.plan.job_dir)).roles_file)
            env = role_process_env(self.plan, index, sites=sites, roles_file=roles_file, **common)
        else:
            env = process_env(plan, plan.place(index), rendezvous=rendezvous or self._rendezvous(facts), **common)
        env.update(requeue_env(facts, self.attempt, self.max_requeues, index))
        env.update(hangs.hang_env(plan, self.attempt, index))
        return env

    @property
    def attempt(self) -> Attempt:
        return Attempt(Path(self.attempt_dir))

    def __call__(self) -> int:
        facts = {key: os.environ.get(name, "") for key, name in SLURM_ENV.items()}
        if self.plan.roles:  # one step over every component: the task id is the job's node (one task per node)
            facts["node"] = facts["global_rank"]
        if not facts["node"]:  # inside SLURM 22.05's container: no per-task variables, one task per node
            found = oci.node_in_container(node_hosts(facts["nodelist"]))
            if found is None:
                raise RuntimeError(f"cannot tell which node of {facts['nodelist']} this container runs on")
            facts["node"] = str(found)
        node = int(facts["node"])
        signal.signal(signal.SIGTERM, signal.SIG_DFL)  # submitit ignores SIGTERM; stop when SLURM says so
        self._mark_start(node)
        if node == 0:
            self._note_requeues(facts)
        code = self._run_node(facts, node) if self.per_node_tasks else self._run_rank(facts)
        if code != 0:
            raise RuntimeError(
                f"node {node} of job {self.plan.label} failed (exit code {code}); see "
                f"{JobDir(Path(self.plan.job_dir)).logs}"
            )
        return code

    def _mark_start(self, node: int) -> None:
        """The timeline's view of this task: when its process started and when it took the job (node 0 also says
        when the batch script started, which cannot write to the timeline itself at no cost)."""
        path = self.attempt.timeline
        if node == 0 and os.environ.get(STARTED_VAR):
            timeline.mark_at(path, timeline.BATCH_START, float(os.environ[STARTED_VAR]))
        timeline.mark_at(path, timeline.TASK_START, timeline.process_start_time(), node=node)
        timeline.mark_at(path, timeline.AGENT_START, node=node)

    def _note_requeues(self, facts: Mapping[str, str]) -> None:
        """A requeued run records why the runs before it were requeued where they could not: a node failure ends
        the batch script at once (SIGKILL), before its last step can say which node was lost."""
        for run in range(int(facts.get("restarts") or 0)):
            if not self.attempt.requeued_file(run).exists():
                record_requeue(self.attempt, run, requeue_why(self.plan, self.attempt, own_job_id(), run))

    def _run_node(self, facts: Dict[str, str], node: int) -> int:
        job_dir = JobDir(Path(self.plan.job_dir))
        job_dir.logs.mkdir(parents=True, exist_ok=True)
        if self.plan.roles:
            return self._run_role_node(facts, node, job_dir)
        rendezvous = self._rendezvous(facts)  # once per node
        with (
            master_port_held(rendezvous, self.attempt, self.plan.node_indices(node)[0], here=node == 0) as held,
            framework_ports_held(
                self.plan, rendezvous, self.attempt, self.plan.framework_port_indices(node) if held else []
            ) as also,
        ):
            return self._run_agent(facts, node, rendezvous, job_dir) if held and also else 1

    def _run_role_node(self, facts: Dict[str, str], node: int, job_dir: JobDir) -> int:
        """A node of a job with roles: its role's node 0 holds the role's two ports; every node writes the roles
        file (the same content, atomically) before its ranks start, so that none starts before it is there."""
        role = next(role for role in self.plan.roles if node in role.nodes)
        sites = self._role_sites(facts)
        document = json.dumps(roles_document(self.plan, sites), indent=2) + "\n"
        write_atomic(job_dir.roles_file, document.encode())
        site, first = sites[role.name], self.plan.node_indices(node)[0]
        with contextlib.ExitStack() as stack:
            if node == role.first_node:
                ports = ((site.rendezvous.master_port, "MASTER_PORT"), (site.port, "port"))
                if not all(
                    hold_or_report(int(str(port)), f"role {role.name}'s {what}", self.attempt, first, stack)
                    for port, what in ports
                ):
                    return 1
            watch = role_watch(self.plan, node)
            return self._run_agent(facts, node, site.rendezvous, job_dir, sites=sites, watch=watch)

    def _run_agent(
        self,
        facts: Dict[str, str],
        node: int,
        rendezvous: Rendezvous,
        job_dir: JobDir,
        sites: Optional[Mapping[str, RoleSite]] = None,
        watch: Optional[RoleWatch] = None,
    ) -> int:
        return run_node(self.node_run(facts, node, rendezvous, sites=sites, watch=watch))

    def node_run(
        self,
        facts: Dict[str, str],
        node: int,
        rendezvous: Rendezvous,
        sites: Optional[Mapping[str, RoleSite]] = None,
        watch: Optional[RoleWatch] = None,
        plan: Optional[JobPlan] = None,
    ) -> NodeRun:
        """Node ``node``'s ranks (of ``plan``'s world: an elastic job's; default the job's), for its node agent."""
        plan = plan or self.plan
        specs = []
        for index in plan.node_indices(node):
            self.attempt.clear_process(index)  # a requeued job runs again in place
            env = self._env(facts, index, {}, rendezvous, sites, plan)
            if self.oci_bundle is not None:
                host = os.environ.get("SLURMD_NODENAME") or rendezvous.node_addrs[node]
                argv = oci.rank_exec(Path(self.oci_bundle), host, facts["job_id"], os.environ.get("SLURM_CONF"))
                env[MMT_CONTAINER_EXEC] = json.dumps(argv)
            spec = ProcessSpec(
                job_id=plan.job_id,
                index=index,
                node_rank=node,
                attempt_dir=self.attempt_dir,
                env=env,
                cwd=os.getcwd(),
                log=str(plan.log_path(index)),
            )
            specs.append(spec if plan.elastic is None else elastic_rank(self.attempt, spec))
            Path(spec.log).parent.mkdir(parents=True, exist_ok=True)
        return NodeRun(
            job_id=plan.job_id,
            node_rank=node,
            job_dir=plan.job_dir,
            attempt_dir=self.attempt_dir,
            kill_grace_s=self.kill_grace_s,
            preload=plan.preload,
            method=self.start_method,
            processes=tuple(specs),
            metrics_interval_s=plan.metrics_interval_s,
            hang_plan=plan if plan.hang_timeout_s is not None else None,
            role_watch=watch,
            snapshot=plan.snapshot,
        )

    def _run_rank(self, facts: Dict[str, str]) -> int:
        index = int(facts["node"]) if self.plan.per_node else int(facts["global_rank"])
        place = self.plan.place(index)
        assert self.plan.per_node or place.rank == int(facts["global_rank"]), "SLURM's layout must match the plan's"
        # per-rank tasks keep SLURM's variables: Lightning then uses SLURMEnvironment and checks devices/num_nodes
        # against them (a per-node command starts its own ranks: Lightning would refuse --ntasks-per-node=1)
        keep = (
            {} if self.plan.per_node else {k: v for k, v in os.environ.items() if k.startswith(("SLURM_", "SLURMD_"))}
        )
        rendezvous = self._rendezvous(facts)
        env = self._env(facts, index, keep, rendezvous)
        os.environ.clear()
        os.environ.update(env)
        log = JobDir(Path(self.plan.job_dir)).log(place.node_rank, place.rank, self.plan.per_node)
        _redirect_output(log)
        from mmt.worker import main as worker

        self.attempt.clear_process(index)
        own = [i for i in self.plan.framework_port_indices(place.node_rank) if i == index]
        with (
            master_port_held(rendezvous, self.attempt, index, here=index == 0) as held,
            framework_ports_held(self.plan, rendezvous, self.attempt, own if held else []) as also,
        ):
            return worker.run(self.attempt, index) if held and also else 1


def _redirect_output(log: Path) -> None:
    log.parent.mkdir(parents=True, exist_ok=True)
    sys.stdout.flush()
    sys.stderr.flush()
    fd = open_for_append(log)  # never through a symlink planted at the log's name
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.close(fd)
    sys.stdout = open(1, "w", buffering=1, closefd=False)
    sys.stderr = open(2, "w", buffering=1, closefd=False)


@dataclass(frozen=True)
class TaskDeath:
    """One line of srun's report of a task that died."""

    host: str
    task: int
    exit_code: Optional[int]
    how: str  # "Exited with exit code N", "Killed", "Terminated" ...


def failed_tasks(stderr_text: str) -> List[TaskDeath]:
    """srun's own report of tasks that died, in order: ``srun: error: node1: task 3: Exited with exit code 137``."""
    found = []
    for match in re.finditer(
        r"srun: error: (\S+): tasks? ([\d,\-]+): (Exited with exit code (\d+)|Killed|"
        r"Terminated|[^\n]+)",
        stderr_text,
    ):
        first = int(re.split(r"[,\-]", match.group(2))[0])
        code = int(match.group(4)) if match.group(4) else None
        found.append(TaskDeath(host=match.group(1), task=first, exit_code=code, how=match.group(3)))
    return found


def write_task_file(task: SlurmTask) -> Path:
    """The task's file in its attempt dir (0600), which every task of the allocation runs."""
    return write_task(task, task.attempt)


def run_task_file(path: str) -> int:
    """Run the task a launcher wrote to ``path``."""
    return read_task(path, SlurmTask, "an mmt SLURM task")()


def array_task_file(manifest: str) -> Path:
    """In a job array: the task file of this task's own job, from the array's manifest (one attempt dir per line,
    picked by ``SLURM_ARRAY_TASK_ID``)."""
    index = int(os.environ["SLURM_ARRAY_TASK_ID"])
    attempt = Path(manifest).read_text().splitlines()[index]
    return Attempt(Path(attempt)).cluster_task


def run_array_task_file(manifest: str) -> int:
    """What submitit keeps for a job array: the same runner, for the task's own job."""
    return run_task_file(str(array_task_file(manifest)))


def main(argv: List[str]) -> int:
    """``<task file>``, or ``--array <manifest>``."""
    if argv[:1] == ["--array"]:
        return run_array_task_file(argv[1])
    return run_task_file(argv[0])


if __name__ == "__main__":
    # run as the module itself, not as __main__: the pickled task's class is mmt.backends.slurm.task.SlurmTask
    from mmt.backends.slurm import task as _module

    sys.exit(_module.main(sys.argv[1:]))
