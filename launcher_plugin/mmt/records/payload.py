"""The job payload: written once by the launcher into the job's attempt dir, read by every process of the job.

``job.json`` (plain JSON, read before any unpickling: the launcher's ``sys.path``) and ``job.pkl`` (a cloudpickle of
:class:`JobPayload`: the plan, Hydra's job callbacks, the task function, the composed job config, Hydra's
singletons).
Both are the owner's only, and a payload is only unpickled from a dir that this user owns and nobody else can
write to: a pickle is code.
"""

import json
import os
import pickle
import stat
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import cloudpickle

from mmt.core.jobdir import Attempt, write_atomic
from mmt.planning.plan import JobPlan


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
    write_atomic(attempt.payload_meta, json.dumps({"sys_path": list(sys.path)}).encode(), private=True)
    write_atomic(attempt.payload, cloudpickle.dumps(payload), private=True)


def read_plan(attempt: Attempt) -> JobPlan:
    """The plan alone (no Hydra, no app code): what a job's conclusion needs."""
    check_private(attempt.dir)
    with open(attempt.plan, "rb") as handle:
        plan = pickle.load(handle)
    assert isinstance(plan, JobPlan), type(plan)
    return plan


def check_private(path: Path) -> None:
    """Refuse a dir (and the one above it) that is not this user's or that others can write to."""
    for directory in (path, path.parent):
        info = os.stat(directory)
        if info.st_uid != os.geteuid():
            raise UnsafePayloadError(f"{directory} belongs to uid {info.st_uid}, not to this user: not loading "
                                     "its pickles")
        if info.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
            raise UnsafePayloadError(f"{directory} is writable by others (mode {stat.filemode(info.st_mode)}): "
                                     "not loading its pickles")


def read_payload(attempt: Attempt) -> JobPayload:
    check_private(attempt.dir)
    meta = json.loads(attempt.payload_meta.read_text())
    # the task function and config may reference modules next to the app (recipes/): import them the same way
    sys.path[:] = list(meta["sys_path"])
    with open(attempt.payload, "rb") as handle:
        return cloudpickle.load(handle)


def discard_payload(attempt: Attempt) -> None:
    """The pickled code and config (and secrets) of a concluded attempt: only clutter, and private."""
    for path in (attempt.payload, attempt.payload_meta):
        path.unlink(missing_ok=True)
