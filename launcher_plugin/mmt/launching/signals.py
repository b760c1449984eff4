"""Ctrl-C, SIGTERM and SIGHUP while jobs run: flags the engine acts on, never an exception in the middle of it.

The first SIGINT/SIGTERM asks for an orderly stop (every rank stopped within the kill grace, every result written);
a second one asks to hurry (SIGKILL now), still writing every result. Once a signal has been received the flags stay
until the process exits: every caller ends its process with 128+signal after an interrupted launch. SIGHUP is a lost
terminal: the engine stops local jobs like SIGTERM, and lets SLURM jobs run on, detached, to be re-attached with
``mmt wait``.

A signal that is ignored when the trap is set stays ignored, as Python itself does for SIGINT: ``nohup python
train.py -m ...`` asks for a launcher that survives its terminal, and a background job of a script has SIGINT
ignored on purpose.
"""

import signal
from typing import Dict, Optional

WATCHED = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
_ignoring_at_exit = False


class SignalTrap:
    """Turn SIGINT/SIGTERM/SIGHUP into flags for the duration of a ``with`` block."""

    def __init__(self) -> None:
        self.received: Optional[int] = None  # the first signal
        self.urgent = False  # a second SIGINT/SIGTERM
        self._previous: Dict[int, object] = {}

    def __enter__(self) -> "SignalTrap":
        try:
            for sig in WATCHED:
                if signal.getsignal(sig) is not signal.SIG_IGN:
                    self._previous[sig] = signal.signal(sig, self._handle)
        except ValueError:  # not the main thread: leave signals alone
            pass
        return self

    def _handle(self, signum: int, _frame: object) -> None:
        if self.received is None:
            self.received = signum
        elif signum != signal.SIGHUP:
            self.urgent = True

    @property
    def name(self) -> Optional[str]:
        return None if self.received is None else signal.Signals(self.received).name

    def __exit__(self, *_: object) -> None:
        if self.received is not None:
            # an interrupted launch ends its process (exit 128+signal) once its last results and lines are written; a
            # Ctrl-C pressed twice in quick succession must not break those last steps with a KeyboardInterrupt, so
            # the flags stay in place until the process exits, and are ignored from its exit on: Python's
            # finalization puts back the default handlers, under which a late Ctrl-C killed the launcher by SIGINT
            # instead of its exit 130 (an ignored signal stays ignored)
            _ignore_at_exit()
            return
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)  # type: ignore[arg-type]


def _ignore_at_exit() -> None:
    global _ignoring_at_exit
    if not _ignoring_at_exit:
        import atexit

        atexit.register(_ignore_watched)  # run before the callbacks registered earlier (the plot's settle)
        _ignoring_at_exit = True


def _ignore_watched() -> None:
    try:
        for sig in WATCHED:
            signal.signal(sig, signal.SIG_IGN)
    except ValueError:  # not the main thread
        pass
