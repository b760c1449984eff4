"""An elastic local job (``num_nodes=MIN:MAX``): every simulated node is a node agent of its own (``python -m
mmt.agent.elastic``, started by the host agent, which does not stop the others when one dies); how its world
changes is ``mmt.backends.elastic``. Here: the agents' processes, each world's ranks built on this host (one address,
a port the launcher holds), and a lost node brought back when ``hydra.launcher.restore_lost_nodes_after_s`` says so
(this host is still there: the simulated machine restored), its agent started again as a spare.
"""

from pathlib import Path
from typing import Callable, List, Optional, Sequence, Tuple

from mmt.agent.processes import ProcessSpec
from mmt.backends.elastic import ElasticJob, WorldCoordinator, elastic_rank, first_world
from mmt.backends.local import agents
from mmt.core.jobdir import Attempt
from mmt.planning.environment import Rendezvous
from mmt.planning.plan import JobPlan

# the rank specs of a world: (its plan, where its ranks meet) -> every process, its node_rank the world's
RankSpecs = Callable[[JobPlan, Rendezvous], List[ProcessSpec]]


class ElasticCoordinator(WorldCoordinator):
    """Starts an elastic local job's node agents and forms its world again as nodes are lost and restored."""

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
        super().__init__(restore_after_s)
        self.master_addr, self.kill_grace_s, self.start_method = master_addr, kill_grace_s, start_method
        self.rank_specs, self.reserve_port, self.release_port = rank_specs, reserve_port, release_port

    def start(
        self, plan: JobPlan, attempt: Attempt, port: int, cwd: str, restart: int = 0
    ) -> Tuple[ElasticJob, List[ProcessSpec]]:
        """The first world, every node of the plan; the host agent's processes: one node agent per node."""
        job = first_world(plan, attempt, port, cwd, restart)
        ranks = self._ranks(job, plan, port)
        processes = []
        for slot in job.running.slots:
            path = attempt.node_run(slot)
            self._write_node_run(path, plan, attempt, slot, [spec for spec in ranks if spec.node_rank == slot])
            processes.append(agents.agent_process(plan, attempt, slot, agents.here("mmt.agent.elastic", path), cwd))
        return job, processes

    def restore_due(self, job: ElasticJob) -> List[ProcessSpec]:
        """The agents of lost nodes whose time to come back has come, as spares: the host agent's processes to add."""
        processes = []
        for slot in self.due_back(job):
            self.node_back(job, slot)
            path = job.attempt.node_run(slot)
            self._write_node_run(path, job.plan, job.attempt, slot, ())
            argv = (*agents.here("mmt.agent.elastic", path), "--spare")
            processes.append(agents.agent_process(job.plan, job.attempt, slot, argv, job.cwd))
        return processes

    def release(self, job: ElasticJob) -> None:
        self.release_port(job.port)

    def _start_world(self, job: ElasticJob, plan: JobPlan, slots: Tuple[int, ...]) -> bool:
        self.release_port(job.port)
        job.port = self.reserve_port()
        ranks = self._ranks(job, plan, job.port)
        for rank, slot in enumerate(slots):
            mine = [spec for spec in ranks if spec.node_rank == rank]
            self._write_node_run(job.attempt.elastic_node_run(slot, plan.generation), plan, job.attempt, rank, mine)
        return True

    def _ranks(self, job: ElasticJob, plan: JobPlan, port: int) -> List[ProcessSpec]:
        # every simulated node is this host: one address for all
        meet = Rendezvous(self.master_addr, port, node_addrs=(self.master_addr,) * plan.num_nodes)
        return [elastic_rank(job.attempt, spec) for spec in self.rank_specs(plan, meet)]

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
