"""Which jobs run from a snapshot: a job's marks in the store and in its own dir, made when it opens and taken back
when it is given up or forgotten (``mmt delete``), so a snapshot goes with the last job that uses it, never before."""

import json
import os
import shutil
from pathlib import Path
from typing import Any, Dict, Optional

from mmt.core.jobdir import JobDir, read_json, write_atomic
from mmt.core.snapshot import CodeSnapshot
from mmt.planning.plan import JobPlan
from mmt.records.snapshot_store import SnapshotStore


def store_of(snapshot: CodeSnapshot) -> SnapshotStore:
    """The store that holds ``snapshot`` (``<store>/trees/<id>``)."""
    return SnapshotStore(Path(snapshot.root).parent.parent)


def add_job(plan: JobPlan) -> None:
    """``plan``'s job runs from its launch's snapshot: marked in the store, and its dir says which code it runs (with
    the launch's uncommitted diff, owner-only, as the payload is)."""
    snapshot = plan.snapshot
    if snapshot is None:
        return
    store = store_of(snapshot)
    store.add_user(snapshot.id, plan.job_id)  # first: an earlier job of the same snapshot must not take it along
    job_dir = JobDir(Path(plan.job_dir))
    forget(plan.job_dir)  # an earlier launch's job in this dir, ended (the dir's claim says so): its code goes
    record = {
        **snapshot.provenance(),
        "job_id": plan.job_id,
        "files": snapshot.files,
        "size_bytes": snapshot.size_bytes,
    }
    write_atomic(job_dir.snapshot, json.dumps(record, indent=1).encode())
    diff = store.diff(snapshot)
    if snapshot.dirty and diff.exists():
        job_dir.snapshot_diff.unlink(missing_ok=True)
        try:
            os.link(diff, job_dir.snapshot_diff)  # the store's copy is private already: one inode, 0600
        except OSError:
            shutil.copyfile(diff, job_dir.snapshot_diff)
            os.chmod(job_dir.snapshot_diff, 0o600)
    else:
        job_dir.snapshot_diff.unlink(missing_ok=True)  # an earlier launch's into the same dir


def release_job(plan: JobPlan) -> None:
    """A job given up before it was submitted: its mark goes, and its snapshot if nothing else runs from it."""
    if plan.snapshot is not None:
        store_of(plan.snapshot).release(plan.snapshot.id, plan.job_id)


def provenance(job_dir: str, job_id: str) -> Optional[Dict[str, Any]]:
    """The code job ``job_id`` runs, as its dir records it (None: the live tree, or the dir is another launch's)."""
    data = read_json(JobDir(Path(job_dir)).snapshot)
    if not isinstance(data, dict) or data.get("job_id") != job_id:
        return None
    return {key: data.get(key) for key in ("id", "commit", "dirty", "source", "dir")}


def forget(job_dir: str, job_id: Optional[str] = None) -> Optional[str]:
    """The job in ``job_dir`` (only when it is ``job_id``'s, if given) no longer needs its snapshot: a forgotten job
    (``mmt delete``), or one a later launch into the same dir replaces. The snapshot's id when it went with it."""
    data = read_json(JobDir(Path(job_dir)).snapshot)
    if not isinstance(data, dict) or not isinstance(data.get("dir"), str) or not isinstance(data.get("id"), str):
        return None
    owner = data.get("job_id")
    if not isinstance(owner, str) or not owner or (job_id is not None and owner != job_id):
        return None
    store = SnapshotStore(Path(data["dir"]).parent.parent)
    removed = store.release(data["id"], owner) if store.root.is_dir() else False
    return data["id"] if removed else None
