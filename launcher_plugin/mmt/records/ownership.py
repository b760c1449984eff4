"""One launch owns a job dir at a time: a second launch into a dir that a live one owns is refused, before anything
starts, instead of the two deleting each other's payload and overwriting each other's results.

A launch holds an flock on ``.mmt/lock`` for as long as its process (or its detached supervisor) lives, and writes
``.mmt/owner.json`` (which attempt, which backend, which scheduler job). A dir whose lock is free may still belong to
a job that outlived its launcher (a SLURM job whose launcher was killed or detached): the backend says whether the
owner's scheduler job is still active. With the dir, a claim holds its attempt's beacon in the run dir
(mmt.records.liveness): what says the launch is alive, and takes its stop requests, where the job cannot delete it.

A Hydra launch also owns its sweep dir, from its launcher's ``setup()`` on (:func:`claim_sweep`): an flock on the
sweep dir's ``.mmt.lock`` taken before anything is checked, so of two launches started into one sweep dir at once
exactly one gets past ``setup()``, and the other is refused before Hydra's sweeper writes its ``multirun.yaml`` over
the first's.
"""

import fcntl
import json
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Dict, Mapping, Optional, Tuple, Union

from mmt.core.errors import UsageError
from mmt.core.jobdir import JobDir, SweepDir, make_private_dir
from mmt.records.liveness import Beacon, close_once, flock_held
from mmt.records.schema import OwnerRecord, UnknownSchemaError

_IN_USE_HINT = "HINT: wait for it (mmt wait NAME), stop it (mmt stop NAME), or choose another hydra.sweep.dir"


# whether the launch an owner.json names still runs, its launcher gone (a backend's owner_active)
StillActive = Callable[[OwnerRecord], bool]


@dataclass
class Claim:
    job_dir: JobDir
    fd: int
    owner: OwnerRecord
    # the attempt's lock in the run dir (None where that cannot be written)
    beacon: Optional[Beacon] = field(default=None, repr=False)

    def update(self, **facts: Any) -> None:
        """owner.json with ``facts`` added (OwnerRecord's fields: the scheduler's id once submitted)."""
        self.owner = self.owner.with_facts(**facts)
        self.owner.write(self.job_dir.owner)

    def stop_requested(self) -> bool:
        """Whether someone asked this attempt to stop (mmt stop)."""
        return self.beacon is not None and self.beacon.stop_requested()

    def release(self, forget: bool = True) -> None:
        """Give the dir up, and the attempt's beacon; ``forget``: also remove owner.json and, when empty, the
        private dir."""
        if self.beacon is not None:
            self.beacon.release()
            self.beacon = None
        if forget:
            self.job_dir.owner.unlink(missing_ok=True)
            self.job_dir.lock.unlink(missing_ok=True)
            for path in (self.job_dir.attempts, self.job_dir.private):
                try:
                    path.rmdir()
                except OSError:
                    pass
        close_once(self)


def _described(owner: Optional[OwnerRecord]) -> str:
    if owner is None:
        return "another mmt launch"
    started = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(owner.started or 0))
    text = f"job {owner.name!r} (pid {owner.pid} on {owner.host}, started {started}"
    if owner.scheduler_id:
        text += f", {owner.scheduler_job or f'its scheduler job {owner.scheduler_id}'}"
    return text + ")"


def claim(job_dir: JobDir, owner: Union[OwnerRecord, Mapping[str, Any]], still_active: StillActive) -> Claim:
    """Own ``job_dir`` or raise UsageError naming who owns it. ``owner``: what owner.json records
    (OwnerRecord.of_this_process), or its facts (attempt, name, backend, job id) to make one of."""
    try:
        make_private_dir(job_dir.private)
        fd = os.open(job_dir.lock, os.O_RDWR | os.O_CREAT, 0o600)
    except OSError as exc:
        raise UsageError(
            f"cannot use job dir {job_dir.root}: {exc.strerror or exc}. HINT: choose a writable hydra.sweep.dir"
        ) from None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        if not _still_named(fd, job_dir.lock):
            # its owner released the dir (and removed the lock file) between our open and our flock: the lock we
            # hold is on a file nobody else will open again; take the one the path names now
            os.close(fd)
            return claim(job_dir, owner, still_active)
    except BlockingIOError:
        os.close(fd)
        raise UsageError(
            f"job dir {job_dir.root} is in use by a live launch: "
            f"{_described(_read_owner_safely(job_dir))}. {_IN_USE_HINT}"
        ) from None
    try:
        previous = OwnerRecord.read(job_dir.owner)
        if previous is not None and _may_run(job_dir, previous, still_active):
            raise UsageError(
                f"job dir {job_dir.root} is in use by {_described(previous)}, which outlived its "
                f"launcher and is still running. {_IN_USE_HINT}"
            )
        record = owner if isinstance(owner, OwnerRecord) else OwnerRecord.of_this_process(**owner)
        result = Claim(job_dir=job_dir, fd=fd, owner=record)
        result.update()
        if record.attempt:
            result.beacon = Beacon.hold(record.job_id, record.attempt)
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
            raise UsageError(
                f"hydra.sweep.dir {sweep_dir} is in use by a live launch: "
                f"{_described(_read_owner_safely(job_dir))} owns {job_dir.root}. {_IN_USE_HINT}"
            )
        owner = OwnerRecord.read(job_dir.owner)
        if owner is not None and _may_run(job_dir, owner, still_active):
            raise UsageError(
                f"hydra.sweep.dir {sweep_dir} is in use by {_described(owner)}, which outlived its "
                f"launcher and is still running ({job_dir.root}). {_IN_USE_HINT}"
            )


def read_owner(job_dir: Path) -> Optional[OwnerRecord]:
    """The launch that owns ``job_dir`` now (or owned it last: a SLURM job's owner.json stays), if one did."""
    return OwnerRecord.read(JobDir(job_dir).owner)


def lock_is_held(job_dir: Path) -> bool:
    """Whether a live process (a launcher, a detached supervisor) holds the job dir's lock. (Whether a registered
    job's supervisor is alive is mmt.records.liveness's question: the job may have deleted its dir.)"""
    return flock_held(JobDir(job_dir).lock) is True


# ------------------------------------------------------------------------------------------------ the sweep dir


@dataclass
class SweepClaim:
    """A Hydra launch's hold on its sweep dir, from its launcher's setup() until the launcher goes (at the latest,
    with its process)."""

    path: Path
    fd: int
    key: Tuple[int, int]

    def release(self) -> None:
        if self.fd >= 0:
            if _HELD.get(self.key) is self:
                del _HELD[self.key]
            close_once(self)


# the sweep dirs this process holds, by the lock file's (device, inode): a launch in this process into a sweep dir an
# earlier launch of this process still holds (an app that runs its sweep again, its first launcher not collected
# yet) takes the hold over: launches in one process run one after the other
_HELD: Dict[Tuple[int, int], SweepClaim] = {}


def _sweep_holder(fd: int) -> str:
    try:
        facts = json.loads(os.pread(fd, 4096, 0) or b"null")
        started = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(float(facts["started"])))
        return f"pid {int(facts['pid'])} on {facts['host']}, started {started}"
    except (OSError, ValueError, TypeError, KeyError):
        return "another mmt launch"


def claim_sweep(sweep_dir: Path, still_active: StillActive) -> SweepClaim:
    """Own ``sweep_dir`` for this launch, or raise UsageError naming who does: the sweep dir's lock, taken at once
    (never waited for), then the job dirs in it that a live launch owns refused (:func:`refuse_sweep_in_use`:
    a detached supervisor's, or a SLURM job's that outlived its launcher)."""
    sweep = SweepDir(sweep_dir)
    try:
        sweep.root.mkdir(parents=True, exist_ok=True)
        fd = os.open(sweep.lock, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    except OSError as exc:
        raise UsageError(
            f"cannot use hydra.sweep.dir {sweep_dir}: {exc.strerror or exc}. HINT: choose a writable hydra.sweep.dir"
        ) from None
    info = os.fstat(fd)
    key = (info.st_dev, info.st_ino)
    earlier = _HELD.pop(key, None)
    if earlier is not None:
        earlier.release()
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = _sweep_holder(fd)
        os.close(fd)
        refuse_sweep_in_use(sweep_dir, still_active)  # names the job and its dir, once the holder has claimed one
        raise UsageError(f"hydra.sweep.dir {sweep_dir} is in use by a live launch ({holder}). {_IN_USE_HINT}") from None
    held = SweepClaim(path=sweep.lock, fd=fd, key=key)
    facts = OwnerRecord.of_this_process()
    try:  # who holds it, for the message of a launch it refuses
        os.ftruncate(fd, 0)
        os.pwrite(fd, json.dumps({"pid": facts.pid, "host": facts.host, "started": facts.started}).encode(), 0)
    except OSError:
        pass
    try:
        refuse_sweep_in_use(sweep_dir, still_active)
    except BaseException:
        held.release()
        raise
    _HELD[key] = held
    return held
