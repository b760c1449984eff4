"""Whether the process that supervises an attempt is alive, and asking it to stop, out of reach of the job.

A job may delete its own job dir while it runs (``rm -rf "$MMT_JOB_DIR"``, ``shutil.rmtree(output_dir)``, ``git
clean -fdx`` over ``outputs/``), so neither can depend on a file in it: both live in the run dir,
``$MMT_HOME/run/`` (private, beside the registry; names: :class:`mmt.core.jobdir.RunDir`), one entry per attempt:

* the supervisor of an attempt (the launcher, or a detached supervisor) holds an flock on ``<key>.lock`` from the
  claim of its job dir until it has concluded the attempt; the kernel lets it go when that process dies, however
  it dies. The file goes when the supervisor releases the lock (after the registry says how the job ended), so a
  file nobody holds means a supervisor that died without concluding;
* ``mmt stop`` writes ``<key>.stop``; the supervisor looks for it every half second.

Where there is no lock file to ask (an attempt launched by an mmt from before run dirs, a run dir that could not be
written or was removed), the job dir's own lock, then the supervisor's pid and start time (in the registry) say
whether it still runs.
"""

import fcntl
import os
import socket
from dataclasses import dataclass
from pathlib import Path
from typing import Optional, Protocol

from mmt.core import proctree
from mmt.core.jobdir import RUN, AttemptRun, JobDir, RunDir, make_private_dir
from mmt.records.registry import JobRecord, home

_OPEN_FLAGS = os.O_RDWR | os.O_NOFOLLOW | os.O_CLOEXEC


def run_dir() -> RunDir:
    """``$MMT_HOME/run``: the registry's home decides it, so every process that finds a job in the registry finds
    its entries too."""
    return RunDir(home() / RUN)


def entries(job_id: Optional[str], attempt_id: str) -> AttemptRun:
    return run_dir().attempt(job_id, attempt_id)


@dataclass
class Beacon:
    """The lock that says an attempt's supervisor is alive, held by that supervisor."""

    run: AttemptRun
    fd: int

    @classmethod
    def hold(cls, job_id: Optional[str], attempt_id: str) -> Optional["Beacon"]:
        """Hold the attempt's lock (None when the run dir cannot be written: liveness then falls back on the job
        dir's lock and the supervisor's pid)."""
        run = entries(job_id, attempt_id)
        try:
            make_private_dir(run.root)
            run.stop_request.unlink(missing_ok=True)  # an attempt id is new: nothing could ask it to stop before
            fd = os.open(run.lock, _OPEN_FLAGS | os.O_CREAT, 0o600)
        except OSError:
            return None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            os.close(fd)
            return None
        return cls(run=run, fd=fd)

    def stop_requested(self) -> bool:
        return self.run.stop_request.exists()

    def beat(self) -> None:
        """The supervisor is alive now: the lock file's time (what :func:`last_beat` reads once it has died)."""
        try:
            os.utime(self.fd)
        except OSError:
            pass

    def release(self) -> None:
        """The attempt is concluded: its entries go, then the lock."""
        if self.fd < 0:
            return
        self.run.stop_request.unlink(missing_ok=True)
        self.run.lock.unlink(missing_ok=True)
        close_once(self)


class _HoldsFd(Protocol):
    fd: int


def close_once(holder: _HoldsFd) -> None:
    """Close ``holder.fd`` once, whatever interrupts: the number is given up before it is closed, so a second
    release (a signal handler's, during the first) never closes a number the kernel has since given to another
    file, such as the registry's (SQLite writing into a file it did not open is how databases are corrupted)."""
    fd, holder.fd = holder.fd, -1
    if fd >= 0:
        os.close(fd)


def flock_held(path: Path) -> Optional[bool]:
    """Whether a live process holds an flock on ``path``: True, False, or None when there is no such file."""
    try:
        fd = os.open(path, _OPEN_FLAGS)
    except OSError:
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        fcntl.flock(fd, fcntl.LOCK_UN)
        return False
    except BlockingIOError:
        return True
    finally:
        os.close(fd)


def beacon_held(job_id: Optional[str], attempt_id: str) -> Optional[bool]:
    """Whether the attempt's supervisor holds its lock: True, False (the file is there and nobody holds it: the
    supervisor died), or None (no file: released, or never made)."""
    return flock_held(entries(job_id, attempt_id).lock)


def supervisor_alive(record: JobRecord) -> bool:
    """Whether the process that supervises the registered job's attempt still runs, by nothing the job can delete
    (the job dir's lock is asked only for an attempt without a run-dir entry)."""
    held = beacon_held(record.job_id, record.attempt)
    if held is not None:
        return held
    if flock_held(JobDir(Path(record.job_dir)).lock):  # an attempt of an mmt from before run dirs
        return True
    if record.supervisor_host is not None and record.supervisor_host != socket.gethostname():
        return False  # another host's pid says nothing here
    return proctree.still_running(record.supervisor_pid, record.supervisor_start)


def last_beat(job_id: Optional[str], attempt_id: str) -> Optional[float]:
    """When the attempt's supervisor was last alive, as its beacon says (None without one)."""
    try:
        return entries(job_id, attempt_id).lock.stat().st_mtime
    except OSError:
        return None


def request_stop(job_id: Optional[str], attempt_id: str) -> None:
    """Ask the attempt's supervisor to stop it (it looks every half second). OSError when the run dir cannot be
    written."""
    run = entries(job_id, attempt_id)
    make_private_dir(run.root)
    run.stop_request.touch()


def forget(job_id: Optional[str], attempt_id: str) -> None:
    """The entries of an attempt concluded without its supervisor (which died holding its lock)."""
    run = entries(job_id, attempt_id)
    for path in (run.stop_request, run.lock):
        try:
            path.unlink(missing_ok=True)
        except OSError:
            pass
