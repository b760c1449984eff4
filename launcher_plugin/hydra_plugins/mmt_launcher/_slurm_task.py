"""What runs in every task of an mmt SLURM job (pickled by submitit, called by ``submitit.core._submit``).

It maps SLURM's task variables onto the rank contract (one small table, as submitit's JobEnvironment does),
redirects the task's output into the job's ``logs/`` like the local backend, takes the requeue signal (see
``mmt.preemption``), and runs the same worker as every other backend.
"""

import os
import re
import signal
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, List, Optional

from mmt import preemption
from mmt.rank_env import RankPlace, node_env, rank_env

from ._plan import process_log_name

# SLURM variable -> the fact it gives
SLURM_ENV = {
    "job_id": "SLURM_JOB_ID",
    "global_rank": "SLURM_PROCID",
    "local_rank": "SLURM_LOCALID",
    "node": "SLURM_NODEID",
    "num_nodes": "SLURM_JOB_NUM_NODES",
    "nodelist": "SLURM_JOB_NODELIST",
    "cpus_on_node": "SLURM_CPUS_ON_NODE",
}


def master_port(job_id: str) -> int:
    """A port every task of the job derives alike; different for concurrent jobs (ids differ)."""
    return 20000 + int(re.sub(r"\D", "", job_id) or 0) % 20000


def first_host(nodelist: str) -> str:
    """node0 of the job: ``scontrol show hostnames`` expands SLURM's compressed lists (node[1-2,5])."""
    try:
        out = subprocess.run(["scontrol", "show", "hostnames", nodelist], capture_output=True, text=True,
                             timeout=30, check=True).stdout
        return out.split()[0]
    except (OSError, subprocess.SubprocessError, IndexError):
        return re.split(r"[\[,]", nodelist)[0]


@dataclass(frozen=True)
class SlurmTask:
    """The callable submitit runs in each task of one job."""

    payload_dir: str
    job_dir: str
    job_id: str
    num_nodes: int
    devices: int
    per_node: bool
    env: Dict[str, str]
    # launcher-owned variables on top of the contract (the batch plan ...): JobPlan.extra_env()
    extra: Dict[str, str]
    max_requeues: int

    def _environment(self, facts: Dict[str, str]) -> Dict[str, str]:
        common = dict(master_addr=first_host(facts["nodelist"]), master_port=master_port(facts["job_id"]),
                      job_dir=self.job_dir, job_id=self.job_id, job_env=self.env, extra=self.extra,
                      cores_per_node=node_cores(facts.get("cpus_on_node")))
        node = int(facts["node"])
        if self.per_node:
            # the command starts its own ranks: no SLURM variables, or Lightning would validate them against
            # --ntasks-per-node=1 and refuse; it gets NODE_RANK, MASTER_* and PL_TRAINER_*/LT_* instead
            return node_env(node, num_nodes=self.num_nodes, local_world_size=self.devices, base_env=os.environ,
                            **common)
        place = RankPlace(node_rank=node, local_rank=int(facts["local_rank"]), num_nodes=self.num_nodes,
                          local_world_size=self.devices)
        assert place.rank == int(facts["global_rank"]), "SLURM's task layout must match the plan's"
        env = rank_env(place, base_env=os.environ, **common)
        # SLURM's own variables stay visible: Lightning then uses SLURMEnvironment and checks devices/num_nodes
        # against them, and scripts can read SLURM_JOB_ID
        env.update({k: v for k, v in os.environ.items() if k.startswith(("SLURM_", "SLURMD_"))})
        return env

    def __call__(self) -> int:
        facts = {name: os.environ.get(var, "") for name, var in SLURM_ENV.items()}
        index = int(facts["node"]) if self.per_node else int(facts["global_rank"])
        env = self._environment(facts)
        env[preemption.MAX_REQUEUES_VAR] = str(self.max_requeues)
        os.environ.clear()
        os.environ.update(env)
        log = Path(self.job_dir) / "logs" / process_log_name(int(facts["node"]), int(facts["global_rank"]),
                                                             self.per_node)
        _redirect_output(log)
        preemption.install()  # replaces submitit's handler: mmt alone acts on the requeue signal
        # submitit ignores SIGTERM (so its checkpoint can finish); SLURM sends it when the job ends (a dead rank
        # with --kill-on-bad-exit, scancel, the time limit): stop now rather than after KillWait's SIGKILL
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        from . import _payload, _worker

        _payload.clear_outcome(Path(self.payload_dir), index)
        code = _worker.run(Path(self.payload_dir), index)
        if code != 0:
            raise RuntimeError(f"rank {index} failed (exit code {code}); see {log}")
        return code


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


def node_cores(cpus_on_node: Optional[str]) -> int:
    """The cores the node's ranks share (OMP_NUM_THREADS = this // ranks per node): SLURM's CPUs on the node, but
    never more than the host has. A node can declare more CPUs than it has (virtual or oversubscribed nodes,
    like the test cluster's); OpenMP threads past the real cores spin against each other (a 2 x 2 LM job took
    147 s instead of 22 s on the test cluster)."""
    host = os.cpu_count() or 1
    return min(int(cpus_on_node), host) if cpus_on_node else host
