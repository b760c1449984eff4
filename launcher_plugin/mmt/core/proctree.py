"""Linux process-tree facts and controls that clean-up relies on: parent-death signals, subreapers, descendants,
and the processes of a job found by the ``MMT_JOB_ID`` every one of them inherits.

Standard library only (the agent, the workers and the launcher all use it).
"""

import ctypes
import os
import signal
import time
from typing import Dict, Iterable, Iterator, List, Mapping, Optional, Tuple

_PR_SET_PDEATHSIG = 1
_PR_SET_CHILD_SUBREAPER = 36


def _prctl(option: int, value: int) -> bool:
    try:
        return ctypes.CDLL(None, use_errno=True).prctl(option, value, 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


def set_parent_death_signal(sig: int) -> None:
    """Ask Linux to send ``sig`` to this process when its parent dies (a no-op elsewhere)."""
    _prctl(_PR_SET_PDEATHSIG, int(sig))


def become_subreaper() -> bool:
    """Adopt orphaned descendants (Linux >= 3.4), instead of letting them escape to init."""
    return _prctl(_PR_SET_CHILD_SUBREAPER, 1)


def _stat_fields(pid: str) -> Optional[List[bytes]]:
    try:
        with open(f"/proc/{pid}/stat", "rb") as handle:
            # "pid (comm) state ppid ...": comm may hold spaces or parentheses, so split after the last ')'
            return handle.read().rsplit(b")", 1)[1].split()
    except (OSError, IndexError):
        return None


def start_time(pid: int) -> Optional[int]:
    """When process ``pid`` started (clock ticks since boot: /proc/<pid>/stat's field 22), or None when it is gone
    (or a zombie). A pid with the start time seen before is the same process, not one that reused its number."""
    fields = _stat_fields(str(pid))
    if not fields or fields[0] == b"Z" or len(fields) < 20:
        return None
    try:
        return int(fields[19])
    except ValueError:
        return None


def still_running(pid: Optional[int], started: Optional[int]) -> bool:
    """Whether process ``pid`` that started at ``started`` (:func:`start_time`) is still there, on this host."""
    return pid is not None and started is not None and start_time(pid) == started


def _live_pids() -> Dict[int, int]:
    """pid -> ppid of every live process (zombies excluded)."""
    table: Dict[int, int] = {}
    try:
        entries = os.listdir("/proc")
    except OSError:
        return table
    for name in entries:
        if name.isdigit():
            fields = _stat_fields(name)
            if fields and fields[0] != b"Z":
                table[int(name)] = int(fields[1])
    return table


def family(root: int) -> List[int]:
    """``root`` and its live descendants, from the kernel's per-thread children lists (no scan of every process;
    what the metrics sampler reads every second). Falls back to the scan where the kernel has no such lists."""
    found, stack = [], [root]
    while stack:
        pid = stack.pop()
        try:
            threads = os.listdir(f"/proc/{pid}/task")
        except OSError:
            continue
        found.append(pid)
        for thread in threads:
            try:
                with open(f"/proc/{pid}/task/{thread}/children") as handle:
                    stack.extend(int(child) for child in handle.read().split())
            except FileNotFoundError:
                return [root] + descendants(root) if pid == root else found
            except OSError:
                continue
    return found


def descendants(root: int) -> List[int]:
    """Pids of every live descendant of ``root``."""
    children: Dict[int, List[int]] = {}
    for pid, ppid in _live_pids().items():
        children.setdefault(ppid, []).append(pid)
    found: List[int] = []
    stack = list(children.get(root, []))
    while stack:
        pid = stack.pop()
        found.append(pid)
        stack.extend(children.get(pid, []))
    return found


def tagged(tags: Mapping[str, str], exclude: Iterable[int] = ()) -> List[int]:
    """Live processes of this user whose environment holds every ``name=value`` of ``tags`` (what every process of
    a job inherits, even one that left the job's process group or session)."""
    needles = {f"{name}={value}".encode() for name, value in tags.items()}
    skip = {os.getpid(), *exclude}
    uid = os.geteuid()
    found = []
    for pid in _live_pids():
        if pid in skip:
            continue
        try:
            if os.stat(f"/proc/{pid}").st_uid != uid:
                continue
            with open(f"/proc/{pid}/environ", "rb") as handle:
                if needles <= set(handle.read().split(b"\0")):
                    found.append(pid)
        except OSError:
            continue
    return found


def signal_all(pids: Iterable[int], sig: int) -> None:
    for pid in pids:
        try:
            os.kill(pid, sig)
        except (ProcessLookupError, PermissionError):
            pass


def signal_group(pgid: int, sig: int) -> None:
    try:
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def group_alive(pgid: int) -> bool:
    """Whether any process of process group ``pgid`` is still there (zombies count until reaped)."""
    try:
        os.killpg(pgid, 0)
        return True
    except (ProcessLookupError, PermissionError):
        return False


def reaped() -> Iterator[Tuple[int, int]]:
    """(pid, exit code) of every child that has exited (adopted orphans included), collected so none lingers as a
    zombie; a negative code: killed by that signal."""
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        yield pid, os.waitstatus_to_exitcode(status)


def reap_any() -> None:
    """Collect every exited child without looking at it."""
    for _ in reaped():
        pass


def stop_tagged(tags: Mapping[str, str], grace_s: float, exclude: Iterable[int] = (), reap: bool = False) -> List[int]:
    """SIGTERM every process tagged with ``tags``, SIGKILL those left after ``grace_s``; their pids.

    ``reap``: also collect exited children (only where every child of this process is ours to reap).
    """
    first = tagged(tags, exclude)
    signal_all(first, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    left = first
    while left and time.monotonic() < deadline:
        time.sleep(0.02)
        if reap:
            reap_any()
        left = tagged(tags, exclude)
    signal_all(left, signal.SIGKILL)
    if reap:
        reap_any()
    return first
