"""Node agents as the local host agent's processes: for a node whose ranks run in an image, and for every node of an
elastic job, the host agent runs that node's agent (``python -m mmt.agent.node`` or ``mmt.agent.elastic``, or the
node's container), which imports the job's preload once and forks the node's ranks, as on a cluster. What each agent
runs travels in a private file of the attempt dir (the ranks' environments hold the job's secrets)."""

import pickle
import sys
from pathlib import Path
from typing import Optional, Sequence, Tuple

from mmt.agent.node import NodeRun, RoleWatch
from mmt.agent.processes import ProcessSpec
from mmt.core.jobdir import Attempt, write_atomic
from mmt.planning.plan import JobPlan


def write_node_run(
    path: Path,
    plan: JobPlan,
    attempt: Attempt,
    node_rank: int,
    processes: Sequence[ProcessSpec],
    *,
    kill_grace_s: float,
    method: str,
    preload: Tuple[str, ...],
    role_watch: Optional[RoleWatch] = None,
) -> None:
    """What node ``node_rank``'s agent runs (its ranks, their env), written privately to ``path``."""
    run = NodeRun(
        job_id=plan.job_id,
        node_rank=node_rank,
        job_dir=plan.job_dir,
        attempt_dir=str(attempt.dir),
        kill_grace_s=kill_grace_s,
        preload=preload,
        method=method,
        processes=tuple(processes),
        metrics_interval_s=plan.metrics_interval_s,
        hang_plan=plan if plan.hang_timeout_s is not None else None,
        role_watch=role_watch,
        snapshot=plan.snapshot,
    )
    write_atomic(path, pickle.dumps(run), private=True)


def here(module: str, path: Path) -> Tuple[str, ...]:
    """The argv of a node agent in this interpreter: ``module`` (``mmt.agent.node``, ``mmt.agent.elastic``)."""
    return (sys.executable, "-u", "-m", module, str(path))


def agent_process(plan: JobPlan, attempt: Attempt, node: int, argv: Tuple[str, ...], cwd: str) -> ProcessSpec:
    """The host agent's process for node ``node``'s agent (its index is the node's), logging to the attempt dir."""
    return ProcessSpec(
        job_id=plan.job_id,
        index=node,
        node_rank=node,
        attempt_dir=str(attempt.dir),
        env={},
        cwd=cwd,
        log=str(attempt.agent_log(node)),
        argv=argv,
    )
