"""The process table: find what a test started (by its tag) and wait for it to go."""

import os
import signal
import time
from pathlib import Path
from typing import List

import pytest

# Every process a test starts inherits this variable (the launcher passes it to every rank), so the process
# table can be searched for leftovers of exactly this test.
TAG_VAR = "LEFTOVER_TAG"


def tagged_pids(tag: str) -> List[int]:
    """Pids of live processes whose environment carries ``LEFTOVER_TAG=<tag>`` (zombies excluded)."""
    needle = f"{TAG_VAR}={tag}".encode()
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            if needle in (entry / "environ").read_bytes().split(b"\0"):
                if "\nState:\tZ" not in (entry / "status").read_text():
                    found.append(int(entry.name))
        except (FileNotFoundError, ProcessLookupError, PermissionError):
            continue
    return found


def wait_until(predicate, timeout_s: float, what: str):
    """The first truthy value of ``predicate()``, polled; the test fails naming ``what`` after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.1)
    pytest.fail(f"timed out waiting for {what}")


def wait_gone(tag: str, timeout_s: float = 10.0) -> List[int]:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        left = tagged_pids(tag)
        if not left:
            return []
        time.sleep(0.1)
    return tagged_pids(tag)


# how long a cluster's processes may take to end after the launcher has returned (it does not wait for a SLURM
# allocation to drain, nor for Ray to end a job's actors): as long as the Ray tests' own wait for them
CLUSTER_DRAIN_S = 30.0


def assert_none_left(tag: str, timeout_s: float = 10.0) -> None:
    """No process carrying ``tag`` may be running once ``timeout_s`` has passed; any that is, is killed (so that one
    failure does not poison the next tests) and named."""
    left = wait_gone(tag, timeout_s)
    kill_all(left)
    assert not left, f"processes left behind: {left}"


def kill_all(pids: List[int]) -> None:
    """SIGKILL each of ``pids`` that is still there (so that one test's leftovers do not poison the next)."""
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def from_a_terminal() -> None:
    """``preexec_fn`` for a launcher that the test signals as a terminal would: SIGINT, SIGHUP at default.

    A runner started under ``nohup``, or as a background job of a script, passes them on ignored, and mmt
    (like Python) leaves an ignored signal ignored.
    """
    for sig in (signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, signal.SIG_DFL)
