"""Hang detection's two ends inside a rank: the heartbeat it touches as it makes progress, and the Python stack it
writes when asked; and reading those stacks back.

* ``MMT_HEARTBEAT`` names a file a rank touches at every training step (mmt's Lightning callback, the LM recipes)
  and whenever it wants to say "still working" through a long silent stretch (``touch "$MMT_HEARTBEAT"`` in a
  script). Output to the rank's log counts as progress too; the launcher watches both.
* ``MMT_STACKS_FILE`` names the file a Python rank writes every thread's stack to, on :data:`STACK_SIGNAL`.
  ``faulthandler`` writes it from a C signal handler, without the GIL, so a rank stuck inside a C call (a gloo or
  NCCL collective, a lock) still answers; py-spy would need ptrace rights that containers often withhold.
"""

import faulthandler
import os
import re
import signal
from dataclasses import dataclass
from pathlib import Path
from typing import IO, List, Optional

from mmt.core.rank_env import MMT_HEARTBEAT, MMT_STACKS_FILE

HEARTBEAT_VAR = MMT_HEARTBEAT
STACKS_VAR = MMT_STACKS_FILE
# a real-time signal: its default action would end a process that did not arm it, so the launcher sends it only to
# ranks whose stack file exists (armed); none of Python, torch or Lightning uses it
STACK_SIGNAL = signal.SIGRTMIN + 4

_armed: Optional[IO[str]] = None  # kept open for the life of the rank: faulthandler writes to its descriptor


def arm() -> bool:
    """In a rank: write every thread's stack to ``$MMT_STACKS_FILE`` on STACK_SIGNAL. False where not asked."""
    global _armed
    path = os.environ.get(STACKS_VAR)
    if not path or _armed is not None:
        return _armed is not None
    try:
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        _armed = open(path, "w")  # noqa: SIM115 (open for as long as the process lives)
    except OSError:
        return False
    faulthandler.register(STACK_SIGNAL, file=_armed, all_threads=True, chain=False)
    return True


def beat() -> None:
    """Say "still making progress" (cheap: one utime; nothing where no heartbeat was asked for)."""
    path = os.environ.get(HEARTBEAT_VAR)
    if not path:
        return
    try:
        os.utime(path)
    except FileNotFoundError:
        try:
            Path(path).touch()
        except OSError:
            pass
    except OSError:
        pass


@dataclass(frozen=True)
class Frame:
    file: str
    line: int
    function: str

    def __str__(self) -> str:
        return f"{Path(self.file).name}:{self.line} in {self.function}"


_FRAME = re.compile(r'^\s+File "(?P<file>[^"]+)", line (?P<line>\d+) in (?P<function>\S+)')
_THREAD = re.compile(r"^(Current thread|Thread) 0x[0-9a-f]+")
# frames of Python itself, of installed packages and of mmt (its worker and its guards): where a rank waits, not
# the code that made it wait
_LIBRARY = re.compile(r"(/site-packages/|/dist-packages/|/lib/python3\.\d+/|^<)")
_MMT = str(Path(__file__).resolve().parents[1]) + os.sep


def main_thread_frames(dump: str) -> List[Frame]:
    """The frames of the main thread in a faulthandler dump, innermost first: the last thread listed (Python lists
    threads newest first, and the main thread is the oldest)."""
    threads: List[List[Frame]] = []
    for line in dump.splitlines():
        if _THREAD.match(line):
            threads.append([])
            continue
        match = _FRAME.match(line)
        if match and threads:
            threads[-1].append(Frame(match["file"], int(match["line"]), match["function"]))
    return next((frames for frames in reversed(threads) if frames), [])


@dataclass(frozen=True)
class Whereabouts:
    """Where a rank's main thread is: the innermost frame of the user's own code, and the innermost frame of all
    (inside torch, a lock, a sleep) when that is further in."""

    own: Optional[Frame]
    innermost: Frame

    @property
    def place(self) -> str:
        """The user's line (what ranks waiting together share), else the innermost frame."""
        return str(self.own or self.innermost)

    @property
    def inside(self) -> Optional[str]:
        """The innermost function, when it is not the user's own line (``all_reduce``, ``sleep``)."""
        return None if self.own == self.innermost else self.innermost.function


def where(dump: str) -> Optional[Whereabouts]:
    """Where the main thread of a faulthandler dump is; None for an empty or unreadable dump."""
    frames = main_thread_frames(dump)
    if not frames:
        return None
    own = next((frame for frame in frames if not _LIBRARY.search(frame.file) and not frame.file.startswith(_MMT)), None)
    return Whereabouts(own=own, innermost=frames[0])
