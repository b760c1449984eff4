"""One launch owns a job dir at a time: a second launch into a dir that a live one owns is refused, before anything
starts, instead of the two deleting each other's payload and overwriting each other's results.

A launch holds an flock on ``.mmt/lock`` for as long as its process (or its detached supervisor) lives, and writes
``.mmt/owner.json`` (which attempt, which backend, which scheduler job). A dir whose lock is free may still belong to
a job that outlived its launcher (a SLURM job whose launcher was killed or detached): the backend says whether the
owner's scheduler job is still active.
"""

import fcntl
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Mapping, Optional, Union

from mmt.core.errors import UsageError
from mmt.core.jobdir import JobDir, SweepDir, make_private_dir
from mmt.records.schema import OwnerRecord, UnknownSchemaError


_IN_USE_HINT = "HINT: wait for it (mmt wait NAME), stop it (mmt stop NAME), or choose another hydra.sweep.dir"


# whether the launch an owner.json names still runs, its launcher gone (a backend's owner_active)
StillActive = Callable[[OwnerRecord], bool]


@dataclass
class Claim:
    job_dir: JobDir
    fd: int
    owner: OwnerRecord

    def update(self, **facts: Any) -> None:
        """owner.json with ``facts`` added (OwnerRecord's fields: the scheduler's id once submitted)."""
        self.owner = self.owner.with_facts(**facts)
        self.owner.write(self.job_dir.owner)

    def release(self, forget: bool = True) -> None:
        """Give the dir up; ``forget``: also remove owner.json and, when empty, the private dir."""
        if forget:
            self.job_dir.owner.unlink(missing_ok=True)
            self.job_dir.lock.unlink(missing_ok=True)
            for path in (self.job_dir.attempts, self.job_dir.private):
                try:
                    path.rmdir()
                except OSError:
                    pass
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1


def _described(owner: Optional[OwnerRecord]) -> str:
    if owner is None:
        return "another mmt launch"
    started = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(owner.started or 0))
    text = f"job {owner.name!r} (pid {owner.pid} on {owner.host}, started {started}"
    if owner.scheduler_id:
        text += f", SLURM job {owner.scheduler_id}"
    return text + ")"


def claim(job_dir: JobDir, owner: Union[OwnerRecord, Mapping[str, Any]], still_active: StillActive) -> Claim:
    """Own ``job_dir`` or raise UsageError naming who owns it. ``owner``: what owner.json records
    (OwnerRecord.of_this_process), or its facts (attempt, name, backend, job id) to make one of."""
    try:
        make_private_dir(job_dir.private)
        fd = os.open(job_dir.lock, os.O_RDWR | os.O_CREAT, 0o600)
    except OSError as exc:
        raise UsageError(f"cannot use job dir {job_dir.root}: {exc.strerror or exc}. HINT: choose a writable "
                         "hydra.sweep.dir") from None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        if not _still_named(fd, job_dir.lock):
            # its owner released the dir (and removed the lock file) between our open and our flock: the lock we
            # hold is on a file nobody else will open again; take the one the path names now
            os.close(fd)
            return claim(job_dir, owner, still_active)
    except BlockingIOError:
        os.close(fd)
        raise UsageError(f"job dir {job_dir.root} is in use by a live launch: "
                         f"{_described(_read_owner_safely(job_dir))}. {_IN_USE_HINT}") from None
    try:
        previous = OwnerRecord.read(job_dir.owner)
        if previous is not None and _may_run(job_dir, previous, still_active):
            raise UsageError(f"job dir {job_dir.root} is in use by {_described(previous)}, which outlived its "
                             f"launcher and is still running. {_IN_USE_HINT}")
        record = owner if isinstance(owner, OwnerRecord) else OwnerRecord.of_this_process(**owner)
        result = Claim(job_dir=job_dir, fd=fd, owner=record)
        result.update()
    except BaseException:
        os.close(fd)
        raise
    return result


def _read_owner_safely(job_dir: JobDir) -> Optional[OwnerRecord]:
    """The owner, for a message: None when it cannot be read (a newer mmt's record says nothing this one can)."""
    try:
        return OwnerRecord.read(job_dir.owner)
    except UnknownSchemaError:
        return None


def _may_run(job_dir: JobDir, owner: OwnerRecord, still_active: StillActive) -> bool:
    """Whether the launch an owner.json names may still run: not when its attempt was concluded (by its launcher, or
    by the job's own last step), which a look at the job dir tells without asking the scheduler."""
    attempt = job_dir.attempt(str(owner.attempt or "-"))
    if attempt.concluded.exists() or attempt.finalized.exists():
        return False
    return still_active(owner)


def _still_named(fd: int, path: Path) -> bool:
    try:
        opened, named = os.fstat(fd), os.stat(path)
    except OSError:
        return False
    return (opened.st_dev, opened.st_ino) == (named.st_dev, named.st_ino)


def refuse_sweep_in_use(sweep_dir: Path, still_active: StillActive) -> None:
    """Before the sweeper writes the sweep's ``multirun.yaml``: a sweep dir where a live launch owns a job dir is
    refused at once (the per-job claim would refuse it too, after Hydra had overwritten that launch's record)."""
    for job_dir in SweepDir(sweep_dir).job_dirs():
        if lock_is_held(job_dir.root):
            raise UsageError(f"hydra.sweep.dir {sweep_dir} is in use by a live launch: "
                             f"{_described(_read_owner_safely(job_dir))} owns {job_dir.root}. {_IN_USE_HINT}")
        owner = OwnerRecord.read(job_dir.owner)
        if owner is not None and _may_run(job_dir, owner, still_active):
            raise UsageError(f"hydra.sweep.dir {sweep_dir} is in use by {_described(owner)}, which outlived its "
                             f"launcher and is still running ({job_dir.root}). {_IN_USE_HINT}")


def read_owner(job_dir: Path) -> Optional[OwnerRecord]:
    """The launch that owns ``job_dir`` now (or owned it last: a SLURM job's owner.json stays), if one did."""
    return OwnerRecord.read(JobDir(job_dir).owner)


def lock_is_held(job_dir: Path) -> bool:
    """Whether a live process (a launcher, a detached supervisor) holds the job dir's lock."""
    try:
        fd = os.open(JobDir(job_dir).lock, os.O_RDWR)
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        fcntl.flock(fd, fcntl.LOCK_UN)
        return False
    except BlockingIOError:
        return True
    finally:
        os.close(fd)
