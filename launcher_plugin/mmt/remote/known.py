"""Which jobs live on a cluster reached over SSH: one record per job in ``$MMT_HOME/remote/<name>.json`` (the
target, where its dir is there and its mirror here), written when the job is submitted, so that ``mmt list/logs/
inspect/wait/stop/delete`` run on the launcher's machine find it (mmt.remote.forward)."""

import json
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Dict, List

from mmt.core.jobdir import write_atomic
from mmt.records.registry import home
from mmt.remote.settings import SshTarget


@dataclass(frozen=True)
class RemoteJob:
    name: str
    target: Dict[str, Any]
    # the remote root, absolute (as the cluster's side expanded it)
    root: str
    remote_job_dir: str
    local_job_dir: str
    remote_sweep_dir: str
    local_sweep_dir: str
    # the snapshot it runs there (<root>/code/<id>), or "" (no snapshot)
    code: str = ""

    @property
    def ssh(self) -> SshTarget:
        return SshTarget.of_dict(self.target)


def _folder() -> Path:
    return home() / "remote"


def remember(jobs: List[RemoteJob]) -> None:
    folder = _folder()
    folder.mkdir(parents=True, exist_ok=True, mode=0o700)
    for job in jobs:
        write_atomic(folder / f"{job.name}.json", json.dumps(asdict(job)).encode(), private=True)


def forget(name: str) -> None:
    (_folder() / f"{name}.json").unlink(missing_ok=True)


def all_jobs() -> List[RemoteJob]:
    folder = _folder()
    found = []
    for path in sorted(folder.glob("*.json")) if folder.is_dir() else []:
        try:
            found.append(RemoteJob(**json.loads(path.read_text())))
        except (OSError, ValueError, TypeError):
            continue  # half a record (a crash mid-write cannot make one: write_atomic); never a traceback
    return found


def named(name: str) -> List[RemoteJob]:
    """The job called ``name``, or every job of the launch called ``name`` (``<name>-<n>``)."""
    jobs = all_jobs()
    exact = [job for job in jobs if job.name == name]
    if exact:
        return exact
    return [job for job in jobs if job.name.startswith(name + "-") and job.name[len(name) + 1 :].isdigit()]
