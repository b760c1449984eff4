"""Command mode: a task function that runs ``command`` in a shell with the rank contract, and owns what it starts.

The command's processes share the rank's process group, which the launcher signals as a whole; but a framework
may put its workers in sessions of their own (torchrun's workers call ``setsid``), and a command may leave
background processes behind. So the process running the command becomes a *child subreaper*: orphans of the
command are re-parented to it instead of init, and it can find and stop every descendant:

* when the command ends, whatever it left running is stopped (SIGTERM, then SIGKILL);
* when the rank is stopped (SIGTERM from the launcher), every descendant gets SIGTERM at once, the stragglers
  SIGKILL shortly after, well within the launcher's grace period; then the rank exits.
"""

import ctypes
import os
import signal
import subprocess
import sys
import time
from typing import Any, Callable, Dict, List, Set

_PR_SET_CHILD_SUBREAPER = 36
_STRAGGLER_WAIT_S = 0.5


class CommandFailedError(RuntimeError):
    pass


def become_subreaper() -> bool:
    """Adopt orphaned descendants (Linux >= 3.4); False where that is not possible."""
    try:
        return ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


def descendants(root: int) -> List[int]:
    """Pids of every live descendant of ``root`` (from /proc; zombies excluded)."""
    children: Dict[int, List[int]] = {}
    try:
        entries = os.listdir("/proc")
    except OSError:
        return []
    for name in entries:
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as handle:
                # "pid (comm) state ppid ...": comm may hold spaces or parentheses, so split after the last ')'
                fields = handle.read().rsplit(b")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if fields and fields[0] != b"Z":
            children.setdefault(int(fields[1]), []).append(int(name))
    found: List[int] = []
    stack = list(children.get(root, []))
    while stack:
        pid = stack.pop()
        found.append(pid)
        stack.extend(children.get(pid, []))
    return found


def _signal_all(pids: List[int], sig: int) -> None:
    for pid in pids:
        try:
            os.kill(pid, sig)
        except (ProcessLookupError, PermissionError):
            pass


def _reap() -> None:
    """Collect exited adopted orphans so they do not linger as zombies."""
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return


def stop_descendants(grace_s: float = _STRAGGLER_WAIT_S) -> Set[int]:
    """SIGTERM every descendant of this process, SIGKILL those still there after ``grace_s``; their pids."""
    me = os.getpid()
    first = descendants(me)
    _signal_all(first, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    left = first
    while left and time.monotonic() < deadline:
        time.sleep(0.02)
        _reap()
        left = descendants(me)
    _signal_all(left, signal.SIGKILL)
    _reap()
    return set(first)


def _on_sigterm(signum: int, _frame: Any) -> None:
    stop_descendants()
    signal.signal(signum, signal.SIG_DFL)
    os.kill(os.getpid(), signum)  # die of the signal, as a rank without a command would


def _signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"


def command_task(command: str) -> Callable[[Any], Dict[str, Any]]:
    """A task function that runs ``command`` in a shell with this process's environment (the rank contract)."""

    def run_command(_cfg: Any) -> Dict[str, Any]:
        sys.stdout.flush()
        sys.stderr.flush()
        become_subreaper()
        previous = signal.signal(signal.SIGTERM, _on_sigterm)
        started = time.monotonic()
        try:
            code = subprocess.run(["/bin/sh", "-c", command], env=os.environ.copy()).returncode
        finally:
            left = stop_descendants()
            signal.signal(signal.SIGTERM, previous)
        if left:
            print(f"mmt: stopped {len(left)} process(es) the command left running: {sorted(left)}", file=sys.stderr,
                  flush=True)
        if code != 0:
            how = f"was killed by {_signal_name(-code)}" if code < 0 else f"exited with code {code}"
            raise CommandFailedError(f"command {command!r} {how}")
        return {"seconds": round(time.monotonic() - started, 3), "exit_code": code}

    return run_command
