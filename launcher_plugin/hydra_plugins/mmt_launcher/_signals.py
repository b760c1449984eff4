"""Ctrl-C and SIGTERM while jobs run: record the signal, so the backend stops every rank before the launcher exits."""

import signal
from typing import Dict, Optional


class SignalTrap:
    """Turn SIGINT/SIGTERM into a flag (``received``) for the duration of a ``with`` block."""

    def __init__(self) -> None:
        self.received: Optional[int] = None
        self._previous: Dict[int, object] = {}

    def __enter__(self) -> "SignalTrap":
        try:
            for sig in (signal.SIGINT, signal.SIGTERM):
                self._previous[sig] = signal.signal(sig, self._handle)
        except ValueError:  # not the main thread: leave signals alone
            pass
        return self

    def _handle(self, signum: int, _frame: object) -> None:
        if self.received is not None and signum == signal.SIGINT:
            raise KeyboardInterrupt  # a second Ctrl-C: stop waiting; clean-up paths still run
        self.received = signum

    def __exit__(self, *_: object) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)  # type: ignore[arg-type]
