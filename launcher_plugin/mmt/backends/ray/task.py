"""What a Ray job of mmt runs: its :class:`RayTask`, written by the launcher into the attempt dir (private: it holds
the secrets the job copies) and read by the job's driver on the head (``mmt.backends.ray.driver``), which hands it on
to each node's actor. The job dir is on a filesystem every node shares (docs/ray.md), as on SLURM.

Also the job's other records in its attempt dir: ``ray.json`` (which cluster and Ray job it is, for ``mmt list``,
``mmt stop`` and ``mmt wait`` from any process) and ``placement.<run>.json`` (where each run's nodes were placed).
"""

import json
import shlex
import sys
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple

from mmt.backends.silence import DEFAULT_GRACE_S
from mmt.core.jobdir import Attempt, read_json, write_atomic
from mmt.core.version import VERSION
from mmt.planning.plan import JobPlan
from mmt.records.payload import read_task, write_task

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
    # a job with roles: each node's bundle, in node order (each role's machine); empty: ``bundle`` for every node
    node_bundles: Tuple[Dict[str, float], ...] = ()

    @property
    def attempt(self) -> Attempt:
        return Attempt(Path(self.attempt_dir))

    def bundle_of(self, node: int) -> Dict[str, float]:
        return self.node_bundles[node] if self.node_bundles else self.bundle

    @property
    def bundles(self) -> List[Dict[str, float]]:
        """The placement group's bundles, one per node, in node order."""
        return [self.bundle_of(node) for node in range(self.plan.num_nodes)]


def write_task_file(task: RayTask) -> Path:
    """The task's file in its attempt dir (0600), which the job's driver reads."""
    return write_task(task, task.attempt)


def read_task_file(path: str) -> RayTask:
    """The task a launcher wrote to ``path``."""
    return read_task(path, RayTask, "an mmt Ray task")


# What the entrypoint's ``python`` runs first: whether it can run mmt's driver at all (mmt importable, of the
# launcher's version, on the launcher's minor Python: the task travels pickled). When it cannot, one marked line
# names that interpreter, its host and what it lacks (``cannot_run``), and it exits DRIVER_CANNOT_RUN.
CANNOT_RUN_MARK = "mmt-driver-cannot-run"
DRIVER_CANNOT_RUN = 97
_BOOTSTRAP = f"""import sys, json, socket
def no(why):
    facts = dict(python=sys.executable, version="%d.%d.%d" % sys.version_info[:3], host=socket.gethostname(), why=why)
    print("{CANNOT_RUN_MARK} " + json.dumps(facts), flush=True)
    sys.exit({DRIVER_CANNOT_RUN})
own = "%d.%d" % sys.version_info[:2]
if own != sys.argv[3]:
    no("it is Python %s, the launcher's is %s" % (own, sys.argv[3]))
try:
    import mmt
except ImportError as exc:
    no("it has no mmt (%s)" % exc)
version = getattr(mmt, "__version__", "?")
if version != sys.argv[2]:
    no("its mmt is %s, the launcher's is %s" % (version, sys.argv[2]))
from {DRIVER_MODULE.rsplit(".", 1)[0]} import driver
sys.exit(driver.main(sys.argv[1:2]))"""


def entrypoint(task: RayTask, task_file: Path) -> str:
    """The Ray job's entrypoint: the cluster's ``python`` (the runtime env's, where it installs one) checks it can
    run the driver, then runs it on the task file, from the launcher's working dir unless the runtime env brings
    one."""
    python = "%d.%d" % sys.version_info[:2]
    command = f"exec python -u -c {shlex.quote(_BOOTSTRAP)} {shlex.quote(str(task_file))} {VERSION} {python}"
    return command if task.project_dir is None else f"cd {shlex.quote(task.project_dir)} && {command}"


def shown(command: str) -> str:
    """The entrypoint as the dry run shows it: the check in a few words instead of its code."""
    return command.replace(shlex.quote(_BOOTSTRAP), "<mmt's check, then the driver " + DRIVER_MODULE + ">")


@dataclass(frozen=True)
class CannotRun:
    """The entrypoint's python could not run mmt's driver: which one, where, and why."""

    python: str
    version: str
    host: str
    why: str

    def line(self, address: str) -> str:
        return (
            f"the Ray cluster at {address} cannot run mmt's driver: the job's entrypoint found `python` = "
            f"{self.python} (Python {self.version}) on {self.host}, and {self.why}. HINT: install mmt (and your app) "
            "in the environment the cluster runs (activate it before `ray start`, or put its bin dir first on the "
            "PATH), or have Ray install it: hydra.launcher.runtime_env.pip=[...], or start the cluster from an "
            "image that has it"
        )


def cannot_run(log: str) -> Optional[CannotRun]:
    """The bootstrap's marked line in the driver's log, if it wrote one."""
    for line in reversed(log.splitlines()):
        if line.startswith(CANNOT_RUN_MARK + " "):
            try:
                facts = json.loads(line[len(CANNOT_RUN_MARK) + 1 :])
                return CannotRun(str(facts["python"]), str(facts["version"]), str(facts["host"]), str(facts["why"]))
            except (ValueError, KeyError, TypeError):
                return None
    return None


# ------------------------------------------------------------------------------------------------ ray.json


@dataclass(frozen=True)
class JobRef:
    """Which Ray job runs an attempt, and on which cluster (``<attempt dir>/ray.json``); how long that cluster may
    not answer before the job is lost with it (whoever watches the job, from any process)."""

    address: str
    submission_id: str
    grace_s: float = DEFAULT_GRACE_S

    @classmethod
    def read(cls, attempt: Attempt) -> Optional["JobRef"]:
        data = read_json(ref_file(attempt))
        if not data or not isinstance(data.get("address"), str) or not isinstance(data.get("submission_id"), str):
            return None
        grace = data.get("grace_s")
        grace_s = float(grace) if isinstance(grace, (int, float)) and not isinstance(grace, bool) else DEFAULT_GRACE_S
        return cls(address=data["address"], submission_id=data["submission_id"], grace_s=grace_s)

    def write(self, attempt: Attempt) -> None:
        write_atomic(ref_file(attempt), json.dumps(asdict(self)).encode(), private=True)


def ref_file(attempt: Attempt) -> Path:
    return attempt.dir / "ray.json"


# ------------------------------------------------------------------------------------------------ placement.<run>.json


def driver_log(attempt: Attempt) -> Path:
    """Ray's log of a driver that could not run (kept: Ray's own message is truncated)."""
    return attempt.dir / "driver.log"


def placement_file(attempt: Attempt, run: int) -> Path:
    return attempt.dir / f"placement.{run}.json"


def write_placement(attempt: Attempt, run: int, nodes: List[Dict[str, Any]]) -> None:
    """Where run ``run``'s nodes were placed, in node order: each one's Ray node (address, id) and processes."""
    write_atomic(placement_file(attempt, run), json.dumps({"run": run, "nodes": nodes}).encode(), private=True)


def read_placement(attempt: Attempt, run: int) -> List[Dict[str, Any]]:
    data = read_json(placement_file(attempt, run)) or {}
    nodes = data.get("nodes")
    return [node for node in nodes if isinstance(node, dict)] if isinstance(nodes, list) else []
