"""What a Ray job of mmt runs: its :class:`RayTask`, written by the launcher into the attempt dir (private: it holds
the secrets the job copies) and read by the job's driver on the head (``mmt.backends.ray.driver``), which hands it on
to each node's actor. The job dir is on a filesystem every node shares (docs/ray.md), as on SLURM.

Also the job's other records in its attempt dir: ``ray.json`` (which cluster and Ray job it is, for ``mmt list``,
``mmt stop`` and ``mmt wait`` from any process) and ``placement.<run>.json`` (where each run's nodes were placed).
"""

import json
import pickle
import shlex
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple

from mmt.core.jobdir import Attempt, read_json, write_atomic
from mmt.planning.plan import JobPlan
from mmt.records.payload import open_private

DRIVER_MODULE = "mmt.backends.ray.driver"


@dataclass(frozen=True)
class RayTask:
    """Everything the job's driver and node actors need, decided by the launcher."""

    plan: JobPlan
    attempt_dir: str
    # the Ray job's submission id (mmt's scheduler id for the job)
    submission_id: str
    # what each mmt node asks of its Ray node (one placement-group bundle)
    bundle: Dict[str, float]
    # the ranks' working dir: the launcher's (a shared filesystem); None: the runtime env's working_dir, which Ray
    # unpacks on every node and makes the actors' own working dir
    project_dir: Optional[str]
    kill_grace_s: float
    start_method: str
    # the names the runtime env's env_vars set: kept over what Ray sets for its workers (OMP_NUM_THREADS)
    own_env: Tuple[str, ...] = ()
    # the values of plan.env_from (the task file is the owner's only)
    copied_env: Dict[str, str] = field(repr=False, default_factory=dict)

    @property
    def attempt(self) -> Attempt:
        return Attempt(Path(self.attempt_dir))


def write_task_file(task: RayTask) -> Path:
    """The task's file in its attempt dir (0600), which the job's driver reads."""
    path = task.attempt.cluster_task
    write_atomic(path, pickle.dumps(task), private=True)
    return path


def read_task_file(path: str) -> RayTask:
    """The task a launcher wrote to ``path`` (only this user's, private file: ``open_private``)."""
    with open_private(Path(path)) as handle:
        task = pickle.load(handle)
    if not isinstance(task, RayTask):
        raise TypeError(f"{path} holds a {type(task).__name__}, not an mmt Ray task")
    return task


def entrypoint(task: RayTask, task_file: Path) -> str:
    """The Ray job's entrypoint: the cluster's ``python`` (the runtime env's, where it installs one) runs the driver
    on the task file, from the launcher's working dir unless the runtime env brings one."""
    command = f"exec python -u -m {DRIVER_MODULE} {shlex.quote(str(task_file))}"
    return command if task.project_dir is None else f"cd {shlex.quote(task.project_dir)} && {command}"


# ------------------------------------------------------------------------------------------------ ray.json


@dataclass(frozen=True)
class JobRef:
    """Which Ray job runs an attempt, and on which cluster (``<attempt dir>/ray.json``)."""

    address: str
    submission_id: str

    @classmethod
    def read(cls, attempt: Attempt) -> Optional["JobRef"]:
        data = read_json(ref_file(attempt))
        if not data or not isinstance(data.get("address"), str) or not isinstance(data.get("submission_id"), str):
            return None
        return cls(address=data["address"], submission_id=data["submission_id"])

    def write(self, attempt: Attempt) -> None:
        write_atomic(ref_file(attempt), json.dumps(asdict(self)).encode(), private=True)


def ref_file(attempt: Attempt) -> Path:
    return attempt.dir / "ray.json"


# ------------------------------------------------------------------------------------------------ placement.<run>.json


def placement_file(attempt: Attempt, run: int) -> Path:
    return attempt.dir / f"placement.{run}.json"


def write_placement(attempt: Attempt, run: int, nodes: List[Dict[str, Any]]) -> None:
    """Where run ``run``'s nodes were placed, in node order: each one's Ray node (address, id) and processes."""
    write_atomic(placement_file(attempt, run), json.dumps({"run": run, "nodes": nodes}).encode(), private=True)


def read_placement(attempt: Attempt, run: int) -> List[Dict[str, Any]]:
    data = read_json(placement_file(attempt, run)) or {}
    nodes = data.get("nodes")
    return [node for node in nodes if isinstance(node, dict)] if isinstance(nodes, list) else []
