"""The job payload (written once by the launcher, read by every rank) and the per-rank outcome files.

Layout inside a job's output dir, all under ``.mmt/`` (removed once the launcher has read the outcome)::

    job.json            sys.path of the launcher and the job's identity (plain JSON: read before any unpickling)
    job.pkl             cloudpickle of JobPayload: Hydra context, task function, composed job config, singletons
    proc<i>.error.json  written by a process whose task failed: exception type, message, traceback
    proc0.return.pkl    the primary process's JobReturn (rank 0 / node 0)
    proc<i>.done        written by every process as its last act: its exit code (the SLURM backend ends a job
                        as soon as every process has written 0, instead of waiting out SLURM's job epilog)

``<i>`` is the process index in the plan: the global rank, or the node index in per-node command mode.
"""

import json
import os
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

import cloudpickle

PAYLOAD_DIR = ".mmt"


@dataclass
class JobPayload:
    hydra_context: Any
    task_function: Any
    config: Any
    singleton_state: Any
    # a shell command replacing the task function (command mode), and how it runs
    command: Optional[str] = None
    command_mode: str = "per_node"


def write_atomic(path: Path, data: bytes) -> None:
    """Write a file so that readers see the old content or the complete new one, never a partial file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)  # mkstemp creates 0600; results are for everyone who may read the dir
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def payload_dir(job_dir: str) -> Path:
    return Path(job_dir) / PAYLOAD_DIR


def write_payload(job_dir: str, payload: JobPayload) -> Path:
    directory = payload_dir(job_dir)
    write_atomic(directory / "job.json", json.dumps({"sys_path": list(sys.path)}).encode())
    write_atomic(directory / "job.pkl", cloudpickle.dumps(payload))
    return directory


def read_payload(directory: Path) -> JobPayload:
    meta = json.loads((directory / "job.json").read_text())
    # the task function and config may reference modules next to the app (recipes/): import them the same way
    sys.path[:] = [p for p in meta["sys_path"]]
    with open(directory / "job.pkl", "rb") as handle:
        return cloudpickle.load(handle)


def error_path(directory: Path, index: int) -> Path:
    return directory / f"proc{index}.error.json"


def return_path(directory: Path) -> Path:
    return directory / "proc0.return.pkl"


def done_path(directory: Path, index: int) -> Path:
    return directory / f"proc{index}.done"


def clear_outcome(directory: Path, index: int) -> None:
    """Forget what an earlier run of process ``index`` reported (a requeued SLURM job runs again in place)."""
    for path in (error_path(directory, index), done_path(directory, index)) + ((return_path(directory),)
                                                                               if index == 0 else ()):
        path.unlink(missing_ok=True)
