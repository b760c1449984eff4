"""The job payload: written once by the launcher into the job's attempt dir, read by every process of the job.

``job.json`` (plain JSON, read before any unpickling: the launcher's ``sys.path``) and ``job.pkl`` (a cloudpickle of
:class:`JobPayload`: the plan, Hydra's job callbacks, the task function, the composed job config, Hydra's
singletons).
Both are the owner's only, and a payload is only unpickled from a dir that this user owns and nobody else can
write to: a pickle is code. That dir is the private one that holds it (``.mmt/attempts/<id>``, a sweep's ``.mmt``,
0700 whatever the umask); the dirs above it are the user's own (``hydra.sweep.dir``, made under their umask:
group-writable under 002) and are not what keeps a pickle safe: the private dir is opened once, without following a
symlink, checked by its descriptor, and the pickle opened relative to it, so a dir swapped in after the check is
never read.
"""

import errno
import json
import os
import pickle
import stat
import sys
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, BinaryIO, Dict, List, Optional, TypeVar

import cloudpickle

from mmt.core.jobdir import Attempt, write_atomic
from mmt.core.snapshot import CodeSnapshot, activate, moved_function, remapped_path
from mmt.planning.plan import JobPlan

T = TypeVar("T")


@dataclass
class JobPayload:
    plan: JobPlan
    # Hydra's job callbacks (the primary process fires them)
    callbacks: Any
    task_function: Any
    config: Any
    singleton_state: Any


class UnsafePayloadError(RuntimeError):
    """A payload dir that another user owns or can write to: its pickle is not loaded."""


def write_payload(attempt: Attempt, payload: JobPayload) -> None:
    attempt.create()
    write_atomic(attempt.plan, pickle.dumps(payload.plan), private=True)
    snapshot = payload.plan.snapshot
    meta: Dict[str, Any] = {
        # the project's entries as they read in the launch's snapshot: the job imports the code it was launched with
        "sys_path": remapped_path(snapshot, sys.path) if snapshot is not None else list(sys.path),
        "prefixes": sorted({sys.prefix, sys.base_prefix, sys.exec_prefix}),
        "snapshot": asdict(snapshot) if snapshot is not None else None,
    }
    write_atomic(attempt.payload_meta, json.dumps(meta).encode(), private=True)
    write_atomic(attempt.payload, cloudpickle.dumps(payload), private=True)


def read_plan(attempt: Attempt) -> JobPlan:
    """The plan alone (no Hydra, no app code): what a job's conclusion needs."""
    with open_private(attempt.plan) as handle:
        plan = pickle.load(handle)
    assert isinstance(plan, JobPlan), type(plan)
    return plan


def _refuse_unsafe(info: os.stat_result, path: Path) -> None:
    if info.st_uid != os.geteuid():
        raise UnsafePayloadError(f"{path} belongs to uid {info.st_uid}, not to this user: not loading its pickles")
    if info.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        raise UnsafePayloadError(
            f"{path} is writable by others (mode {stat.filemode(info.st_mode)}): not loading its pickles"
        )


def open_private(path: Path) -> BinaryIO:
    """``path`` opened for reading when its dir, and the file itself, are this user's and nobody else can write them
    (UnsafePayloadError otherwise; FileNotFoundError when either is missing). Neither is followed through a
    symlink; the dir is checked by the descriptor the file is then opened relative to."""
    try:
        dir_fd = os.open(path.parent, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
    except OSError as exc:
        if exc.errno in (errno.ELOOP, errno.ENOTDIR) and path.parent.is_symlink():
            raise UnsafePayloadError(f"{path.parent} is a symlink: not loading its pickles") from None
        raise
    try:
        _refuse_unsafe(os.fstat(dir_fd), path.parent)
        try:
            fd = os.open(path.name, os.O_RDONLY | os.O_NOFOLLOW, dir_fd=dir_fd)
        except OSError as exc:
            if exc.errno == errno.ELOOP:
                raise UnsafePayloadError(f"{path} is a symlink: not loading it") from None
            raise
    finally:
        os.close(dir_fd)
    try:
        _refuse_unsafe(os.fstat(fd), path)
    except BaseException:
        os.close(fd)
        raise
    return os.fdopen(fd, "rb")


def write_task(task: Any, attempt: Attempt) -> Path:
    """A scheduler's task of the job (what its side of the job runs: SLURM's tasks, Ray's driver) in its attempt dir
    (0600: it holds the secrets the job copies)."""
    path = attempt.cluster_task
    write_atomic(path, pickle.dumps(task), private=True)
    return path


def read_task(path: str, kind: "type[T]", what: str) -> T:
    """The task a launcher wrote to ``path`` (only this user's, private file: ``open_private``); ``what`` names the
    kind in the error when the file holds something else."""
    with open_private(Path(path)) as handle:
        task = pickle.load(handle)
    if not isinstance(task, kind):
        raise TypeError(f"{path} holds a {type(task).__name__}, not {what}")
    return task


def import_path(launcher_path: List[str], launcher_prefixes: List[str]) -> List[str]:
    """The launcher's ``sys.path``; in another Python (a container's), that Python's own path first, and none of the
    launcher's interpreter or venv dirs (the mounted project may hold the host's venv: its torch is not this one)."""
    own = sorted({sys.prefix, sys.base_prefix, sys.exec_prefix})
    if not launcher_prefixes or own == sorted(set(launcher_prefixes)):
        return list(launcher_path)
    theirs = [p.rstrip("/") + "/" for p in launcher_prefixes]
    extra = [
        p
        for p in launcher_path
        if p not in sys.path and os.path.isdir(p) and not any((p.rstrip("/") + "/").startswith(t) for t in theirs)
    ]
    return [*sys.path, *extra]


class _AbsentPluginClass:
    """Stands for a class of a Hydra plugin not installed here: takes whatever its pickle gives it (an enum's value,
    a dataclass's state) and is never used."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self.args = args

    def __setstate__(self, state: Any) -> None:
        self.state = state


class _PayloadUnpickler(pickle.Unpickler):
    """cloudpickle's payload, read by the standard unpickler (cloudpickle writes plain pickles), where a Hydra plugin
    installed beside the launcher but not where the rank runs (an image) does not fail the rank: Hydra's config
    store holds every plugin's config classes, and the rank composes nothing from them."""

    def find_class(self, module: str, name: str) -> Any:
        try:
            return super().find_class(module, name)
        except ModuleNotFoundError:
            if not module.startswith("hydra_plugins."):
                raise
            return type(name, (_AbsentPluginClass,), {"__module__": module})


def read_payload(attempt: Attempt) -> JobPayload:
    with open_private(attempt.payload_meta) as handle:
        meta = json.loads(handle.read())
    # the task function and config may reference modules next to the app (recipes/): import them the same way,
    # from the launch's snapshot of the project when it has one
    sys.path[:] = import_path(meta["sys_path"], meta.get("prefixes", []))
    snapshot = snapshot_of(meta.get("snapshot"))
    activate(snapshot)
    with open_private(attempt.payload) as handle:
        payload = _PayloadUnpickler(handle).load()
    moved_function(payload.task_function, snapshot)
    return payload


def snapshot_of(data: Any) -> Optional[CodeSnapshot]:
    """The snapshot a payload's ``job.json`` names (None: the job runs the live tree)."""
    if not isinstance(data, dict):
        return None
    return CodeSnapshot(**{**data, "keep": tuple(data.get("keep") or ())})


def discard_payload(attempt: Attempt) -> None:
    """The pickled code and config (and secrets) of a concluded attempt: only clutter, and private."""
    for path in (attempt.payload, attempt.payload_meta, attempt.cluster_task):
        path.unlink(missing_ok=True)
