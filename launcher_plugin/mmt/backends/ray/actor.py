"""The Ray actor of one mmt node: it holds its placement-group bundle (the node's CPUs, GPUs, custom resources) and
runs that node's agent.

The job's driver creates one per node, each in its bundle of the job's placement group, and asks it in two steps:

1. :meth:`NodeActor.prepare`: where it landed (its Ray node's address and id) and the ports it holds for the job:
   MASTER_PORT on node 0, and the framework's (each TensorFlow worker's, JAX's coordinator) of this node's
   processes; free ports, held (``mmt.core.ports``) from now until the agent ends, so that nothing takes them while
   the ranks start. The driver makes the rendezvous from every node's answer: MASTER_ADDR is node 0's Ray address.
2. :meth:`NodeActor.run`: the rank contract of each of the node's processes (``process_env``, as on SLURM), and
   mmt's node agent in a process of its own (``python -m mmt.backends.ray.node``, the NodeRun on its stdin), which
   forks the node's ranks exactly as a SLURM node agent does. Its exit code is the answer.

An elastic job's actor (``num_nodes=MIN:MAX``, ``mmt.backends.ray.elastic``) runs the elastic agent, which forks
its ranks world after world; for each new world it writes its own ranks of it (:meth:`NodeActor.prepare_world`),
and the world's node 0 holds its MASTER_PORT (:meth:`NodeActor.hold_world_port`). A lost node's bundle placed again
gets a new actor, whose agent waits as a spare (:meth:`NodeActor.run_spare`).

The agent is a child of the actor's worker process, not the worker itself: a Ray worker runs gRPC threads, which a
fork of the ranks must not inherit, and its main thread belongs to Ray. The agent dies with the worker (its
parent-death signal), and the ranks with the agent. :meth:`NodeActor.stop` (the actor is threaded: it answers
while ``run`` waits) sends the agent SIGTERM: it stops its ranks within the kill grace, as on SCANCEL.
"""

import os
import pickle
import signal
import socket
import subprocess
import sys
import threading
from dataclasses import dataclass, field, replace
from typing import Dict, List, Mapping, Optional, Tuple

from mmt.agent.node import NodeRun, node_run
from mmt.backends.elastic import elastic_rank, spare_run
from mmt.backends.ray.task import RayTask
from mmt.core import timeline
from mmt.core.jobdir import write_atomic
from mmt.core.ports import hold_port
from mmt.core.rank_env import OMP_NUM_THREADS
from mmt.planning.environment import Rendezvous, RoleSite
from mmt.planning.plan import JobPlan

NODE_MODULE = "mmt.backends.ray.node"
# what Ray sets for its own workers only (which raylet, job and node a worker belongs to): a rank is no Ray worker,
# and a rank's own ray.init() must not take itself for one
RAY_WORKER_VARS = frozenset(
    {"RAY_RAYLET_PID", "RAY_JOB_ID", "RAY_NODE_ID", "RAY_CLIENT_MODE", "RAY_LD_PRELOAD_ON_WORKERS"}
)


@dataclass(frozen=True)
class NodeFacts:
    """Where a node's actor landed, and the ports it holds for the job."""

    node: int
    ip: str
    node_id: str
    actor_pid: int
    # the raylet of its Ray node (the actor's parent): what `ray_cluster.sh fail-node` kills
    raylet_pid: int
    master_port: Optional[int]
    # process index -> the framework port held for it here
    framework_ports: Dict[int, int] = field(default_factory=dict)
    # a job with roles, on a role's first node: the port held for the role to serve on (MMT_ROLE_<NAME>_PORT); its
    # MASTER_PORT is master_port
    role_port: Optional[int] = None


def node_cores(bundle: Mapping[str, float]) -> int:
    """The cores a node's ranks share (OMP_NUM_THREADS = this // ranks per node): its bundle's CPUs, never more than
    the host has (the test cluster's nodes declare more CPUs than this host has)."""
    host = os.cpu_count() or 1
    cpus = int(bundle.get("CPU", 0.0))
    return max(1, min(cpus, host)) if cpus else host


def inherited_env(environ: Mapping[str, str], own: Mapping[str, str]) -> Dict[str, str]:
    """What the ranks inherit from the actor: its environment, without Ray's own worker variables, nor the
    OMP_NUM_THREADS Ray sets for every worker (the whole bundle's CPUs, for each of the node's ranks), unless the
    job's runtime env set it itself."""
    return {
        k: v
        for k, v in environ.items()
        if (k != OMP_NUM_THREADS or k in own) and (k not in RAY_WORKER_VARS or k in own)
    }


class NodeActor:
    """One mmt node of one run of a job (the driver wraps it with ``ray.remote``)."""

    def __init__(self, task: RayTask, node: int) -> None:
        self.task, self.node = task, node
        self._held: List[socket.socket] = []
        self._agent: Optional["subprocess.Popen[bytes]"] = None
        self._stopped = False
        self._lock = threading.Lock()

    def prepare(self) -> NodeFacts:
        import ray  # on a Ray worker: ray is there

        plan = self.task.plan
        timeline.mark_at(self.task.attempt.timeline, "ray_actor", node=self.node)
        # node 0 holds MASTER_PORT; with roles, each role's first node holds its role's, and the role's own port
        first = any(self.node == role.first_node for role in plan.roles) if plan.roles else self.node == 0
        master = self._hold() if first else None
        role_port = self._hold() if first and plan.roles else None
        ports = {index: self._hold() for index in plan.framework_port_indices(self.node)}
        return NodeFacts(
            node=self.node,
            ip=ray.util.get_node_ip_address(),
            node_id=ray.get_runtime_context().get_node_id(),
            actor_pid=os.getpid(),
            raylet_pid=os.getppid(),
            master_port=master,
            framework_ports=ports,
            role_port=role_port,
        )

    def _hold(self) -> int:
        sock = hold_port("")
        self._held.append(sock)
        return int(sock.getsockname()[1])

    def run(self, rendezvous: Rendezvous, restart: int, sites: Optional[Mapping[str, RoleSite]] = None) -> int:
        """Run the node's agent until it ends; its exit code (0: every rank of the node succeeded). ``sites``: a job
        with roles, where every role is. An elastic job's agent runs the node's ranks world after world."""
        prepared = self._node_run(self.task.plan, self.node, rendezvous, restart, sites)
        return self._run_agent(prepared, ("--elastic",) if self.task.plan.elastic is not None else ())

    def run_spare(self) -> int:
        """An elastic job's node back after it was lost (its bundle placed again): its agent imports the preload,
        says it is ready and waits to join the next world; its exit code, as :meth:`run`'s."""
        task = self.task
        spare = spare_run(task.plan, str(task.attempt.dir), self.node, task.kill_grace_s, task.start_method)
        return self._run_agent(spare, ("--elastic", "--spare"))

    def hold_world_port(self) -> int:
        """A new world of an elastic job has this node as its node 0: a port for its MASTER_PORT, held until the
        agent ends (the world's rank 0 listens on it)."""
        with self._lock:
            return self._hold()

    def prepare_world(self, plan: JobPlan, node_rank: int, rendezvous: Rendezvous, restart: int) -> None:
        """An elastic job's next world: this node's ranks of it (node ``node_rank`` of ``plan``'s world), built with
        this actor's environment, written privately where the node's agent reads them."""
        prepared = self._node_run(plan, node_rank, rendezvous, restart, None)
        write_atomic(
            self.task.attempt.elastic_node_run(self.node, plan.generation), pickle.dumps(prepared), private=True
        )

    def _run_agent(self, prepared: NodeRun, args: Tuple[str, ...]) -> int:
        try:
            with self._lock:
                if self._stopped:  # stopped before its agent started: start none
                    return 1
                self._agent = subprocess.Popen(
                    [sys.executable, "-u", "-m", NODE_MODULE, *args],
                    stdin=subprocess.PIPE,
                    cwd=self._cwd(),
                    env=os.environ.copy(),
                )
            assert self._agent.stdin is not None
            with self._agent.stdin:  # the NodeRun holds the job's copied secrets: a pipe, never a file
                self._agent.stdin.write(pickle.dumps(prepared))
            return self._agent.wait()
        finally:
            for sock in self._held:
                sock.close()
            self._held = []

    def stop(self) -> None:
        """Stop the node's ranks (SIGTERM to the agent, which stops them within the kill grace)."""
        with self._lock:
            self._stopped = True
            if self._agent is not None and self._agent.poll() is None:
                self._agent.send_signal(signal.SIGTERM)

    def _cwd(self) -> str:
        return self.task.project_dir or os.getcwd()  # the runtime env's working_dir: Ray's copy, the actor's own

    def _node_run(
        self,
        plan: JobPlan,
        node_rank: int,
        rendezvous: Rendezvous,
        restart: int,
        sites: Optional[Mapping[str, RoleSite]],
    ) -> NodeRun:
        """Node ``node_rank`` of ``plan``'s world (this node: an elastic job's later worlds rank it anew)."""
        task = self.task
        own = {name: os.environ.get(name, "") for name in task.own_env}
        run = node_run(
            plan,
            task.attempt,
            node_rank,
            rendezvous=rendezvous,
            inherited=inherited_env(os.environ, own),
            copied=task.copied_env,
            cores=node_cores(task.bundle_of(self.node)),
            kill_grace_s=task.kill_grace_s,
            start_method=task.start_method,
            cwd=self._cwd(),
            restart=restart,
            sites=sites,
        )
        if plan.elastic is None:
            return run
        return replace(run, processes=tuple(elastic_rank(task.attempt, spec) for spec in run.processes))
