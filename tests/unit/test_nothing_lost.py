"""Nothing lost, nobody in, without a process: a claim racing a release, and a payload in a dir others can write.
(Reruns, secrets, killed wrappers and agents, interrupts, a full disk, the MASTER_PORT race ... with real processes
and sockets: tests/e2e/test_nothing_lost.py.)"""

import json
import os
import pickle
import sys
from pathlib import Path

import pytest


def test_a_claim_racing_a_release_never_gives_one_dir_two_owners(tmp_path, monkeypatch):
    """A launch that opened the lock file just before its owner released the dir (and removed the file) holds,
    once it gets its flock, a lock on a file nobody else opens: it must take the one the path names now."""
    from mmt.core.errors import UsageError
    from mmt.core.jobdir import JobDir
    from mmt.records import ownership

    job_dir = JobDir(tmp_path / "0")
    first = ownership.claim(job_dir, {"name": "first"}, lambda owner: False)
    opened_before_release = [os.open(job_dir.lock, os.O_RDWR)]
    first.release(forget=True)
    second = ownership.claim(job_dir, {"name": "second"}, lambda owner: False)  # a new lock file
    real_open = os.open

    def racing_open(path, *args):  # the racer's first open happened before the release
        if Path(path) == job_dir.lock and opened_before_release:
            return opened_before_release.pop()
        return real_open(path, *args)

    monkeypatch.setattr(ownership.os, "open", racing_open)
    try:
        with pytest.raises(UsageError, match="is in use by a live launch: job 'second'"):
            ownership.claim(job_dir, {"name": "third"}, lambda owner: False)
    finally:
        monkeypatch.undo()
        second.release()


def test_a_payload_in_a_dir_others_can_write_is_not_unpickled(tmp_path):
    from mmt.core.jobdir import Attempt
    from mmt.records.payload import UnsafePayloadError, read_payload

    attempt = Attempt(tmp_path / "job" / ".mmt" / "attempts" / "a").create()
    (attempt.dir / "job.json").write_text(json.dumps({"sys_path": sys.path}))
    (attempt.dir / "job.pkl").write_bytes(b"not even read")
    os.chmod(attempt.dir, 0o777)
    with pytest.raises(UnsafePayloadError, match="writable by others"):
        read_payload(attempt)
    # the primary's return value is a pickle too: one planted there would run its code when loaded
    from mmt.records.outcome import read_primary_return

    planted = tmp_path / "planted-ran"
    (attempt.dir / "return.pkl").write_bytes(pickle.dumps(_Planted(str(planted))))
    assert read_primary_return(attempt) is None and not planted.exists()
    os.chmod(attempt.dir, 0o700)
    read_primary_return(attempt)  # from a private dir it is read (and here, runs)
    assert planted.exists()


class _Planted:
    def __init__(self, path: str) -> None:
        self.path = path

    def __reduce__(self):
        return (open, (self.path, "w"))
