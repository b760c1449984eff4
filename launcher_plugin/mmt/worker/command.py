"""Command mode: a task function that runs ``command`` in a shell with the rank contract, and owns what it starts.

The command's processes share the rank's process group, which the agent signals as a whole; but a framework may
put its workers in sessions of their own (torchrun's workers call ``setsid``), and a command may leave background
processes behind. So the process running the command becomes a *child subreaper*: orphans of the command are
re-parented to it instead of init, and it can find and stop every descendant:

* when the command ends, whatever it left running is stopped (SIGTERM, then SIGKILL);
* when the rank is stopped (SIGTERM from the agent), every descendant gets SIGTERM at once, the stragglers SIGKILL
  shortly after; then the rank exits. (Should this process be killed outright, the agent finds the rest by the
  job's ``MMT_JOB_ID``.)

``python``, ``torchrun`` and the venv's scripts in a command are the launcher's: its interpreter's directory is
first on PATH (``mmt.planning.environment``).
"""

import os
import signal
import subprocess
import sys
import time
from typing import Any, Callable, Dict, Optional, Set

from mmt.core import proctree

_STRAGGLER_WAIT_S = 0.5


def _signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"


class CommandFailedError(RuntimeError):
    """The command exited non-zero or was killed; carries its own exit status (not the wrapper's)."""

    def __init__(self, command: str, returncode: int) -> None:
        self.command, self.returncode = command, returncode
        self.exit_code: Optional[int] = returncode if returncode >= 0 else None
        self.signal: Optional[str] = _signal_name(-returncode) if returncode < 0 else None
        how = f"was killed by {self.signal}" if self.signal else f"exited with code {returncode}"
        super().__init__(f"command {command!r} {how}")

    def __reduce__(self):
        return (CommandFailedError, (self.command, self.returncode))


def stop_descendants(grace_s: float = _STRAGGLER_WAIT_S) -> Set[int]:
    """SIGTERM every descendant of this process, SIGKILL those still there after ``grace_s``; their pids."""
    me = os.getpid()
    first = proctree.descendants(me)
    proctree.signal_all(first, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    left = first
    while left and time.monotonic() < deadline:
        time.sleep(0.02)
        proctree.reap_any()
        left = proctree.descendants(me)
    proctree.signal_all(left, signal.SIGKILL)
    proctree.reap_any()
    return set(first)


def _on_sigterm(signum: int, _frame: Any) -> None:
    stop_descendants()
    signal.signal(signum, signal.SIG_DFL)
    os.kill(os.getpid(), signum)  # die of the signal, as a rank without a command would


def command_task(command: str) -> Callable[[Any], Dict[str, Any]]:
    """A task function that runs ``command`` in a shell with this process's environment (the rank contract)."""

    def run_command(_cfg: Any) -> Dict[str, Any]:
        sys.stdout.flush()
        sys.stderr.flush()
        proctree.become_subreaper()
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
            raise CommandFailedError(command, code)
        return {"seconds": round(time.monotonic() - started, 3), "exit_code": code}

    return run_command
