"""What the launcher prints while jobs run: ranks' output live, prefixed with job, node and rank.

The console must never get in the way of supervision:

* every line goes through one writer thread that does the blocking writes, so a stdout that nobody reads delays
  only the console, never the time limits, the fail-fast or the clean-up; when it falls behind, lines are dropped
  (and counted: they are all in the job's logs);
* a closed stdout (``| head``) ends the printing, not the jobs;
* memory per line is bounded (a 200 MB line is shown cut), and control sequences from a rank (an ANSI title, BEL,
  cursor moves) are removed before they reach the terminal.
"""

import os
import queue
import re
import sys
import threading
import time
from pathlib import Path
from typing import Any, List, Optional, TextIO, Tuple

MAX_LINE = 16 * 1024  # characters of one line that are shown
_CHUNK = 64 * 1024  # bytes read from a log per poll
_QUEUE = 4096  # lines waiting to be written before the console starts dropping
_COUNT_CHUNK = 1 << 20  # bytes read at a time to count the lines a finished job's console did not show
_COUNT_S = 0.5  # how long that count may take (past it, the note says "N+")
# ESC sequences (CSI, OSC, two-character) and C0 controls other than tab
_CONTROL = re.compile(
    r"\x1b\[[0-?]*[ -/]*[@-~]|\x1b\][^\x07\x1b]*(?:\x07|\x1b\\)?|\x1b[@-Z\\-_]?|[\x00-\x08\x0b-\x1f\x7f]"
)


def clean(line: str) -> str:
    """A line as the terminal may show it: what a carriage return left visible, no control sequences."""
    if "\r" in line:
        line = line.rstrip("\r").rsplit("\r", 1)[-1]
    return _CONTROL.sub("", line)


class Console:
    """Writes text from a thread of its own; ``write`` never blocks."""

    def __init__(self, stream: Optional[TextIO] = None) -> None:
        stream = stream or sys.stdout
        try:
            self._fd: Optional[int] = stream.fileno()
            stream.flush()
        except (AttributeError, OSError, ValueError):  # no real file (pytest's capture): write through it
            self._fd = None
        self._stream = stream
        # on a terminal, lines go through rich, which keeps a live status block (mmt.monitor.progress) below them
        self._rich: Any = None
        if self.is_terminal:
            from rich.console import Console as RichConsole

            self._rich = RichConsole(file=stream, markup=False, highlight=False, emoji=False, soft_wrap=True)
        self._queue: "queue.Queue[Optional[str]]" = queue.Queue(maxsize=_QUEUE)
        self.dropped = 0
        self.closed = False  # stdout went away: nothing more is printed
        self._thread = threading.Thread(target=self._run, name="mmt-console", daemon=True)
        self._thread.start()

    @property
    def is_terminal(self) -> bool:
        try:
            return self._fd is not None and os.isatty(self._fd)
        except OSError:
            return False

    def write(self, text: str) -> None:
        if self.closed or not text:
            return
        try:
            if self.dropped:
                self._queue.put_nowait(self._dropped_note())
                self.dropped = 0
            self._queue.put_nowait(text)
        except queue.Full:
            self.dropped += text.count("\n") or 1

    def _dropped_note(self) -> str:
        return (
            f"[mmt] {self.dropped} line(s) not shown: the console could not keep up; every line is in the job's logs/\n"
        )

    def _run(self) -> None:
        while True:
            text = self._queue.get()
            if text is None:
                return
            try:
                if self._rich is not None:
                    self._rich.print(text, end="")
                elif self._fd is None:
                    self._stream.write(text)
                    self._stream.flush()
                else:
                    data = text.encode(errors="replace")
                    while data:
                        data = data[os.write(self._fd, data) :]
            except (BrokenPipeError, OSError, ValueError):
                self.closed = True  # a closed or broken stdout: stop printing, keep supervising
                self._silence()
                return

    def _silence(self) -> None:
        # later writes by anyone to this stdout (Hydra's logging, the interpreter's exit flush) must not fail either
        if self._fd is not None:
            try:
                null = os.open(os.devnull, os.O_WRONLY)
                os.dup2(null, self._fd)
                os.close(null)
            except OSError:
                pass

    def live(self, renderable: Any) -> Any:
        """A rich Live block under the lines (a terminal only); the caller updates and stops it."""
        from rich.live import Live

        live = Live(
            renderable,
            console=self._rich,
            refresh_per_second=4,
            transient=True,
            redirect_stdout=False,
            redirect_stderr=False,
        )
        live.start()
        return live

    def close(self, timeout_s: float = 5.0) -> None:
        """Let what is queued be written, for at most ``timeout_s`` (a stdout nobody reads cannot hold us)."""
        deadline = time.monotonic() + timeout_s
        try:
            if self.dropped and not self.closed:  # no later line carried the note: it goes last
                self._queue.put(self._dropped_note(), timeout=timeout_s)
                self.dropped = 0
            self._queue.put(None, timeout=max(0.0, deadline - time.monotonic()))
        except queue.Full:
            return
        self._thread.join(max(0.0, deadline - time.monotonic()))


class LogFollower:
    """Echo the lines appended to one process's log file, each prefixed, as they arrive (``tail -f`` by polling).

    Processes write their own log files (nothing is lost if the launcher dies); the console only follows them.
    """

    def __init__(self, path: Path, prefix: str, console: Console) -> None:
        self.path, self.prefix, self.console = path, prefix, console
        self._offset = 0
        self._partial = b""
        self._skipping = False  # inside a line longer than MAX_LINE, already shown cut

    def poll(self) -> None:
        try:
            with open(self.path, "rb") as handle:
                handle.seek(self._offset)
                data = handle.read(_CHUNK)
        except (FileNotFoundError, NotADirectoryError):
            return
        if not data:
            return
        self._offset += len(data)
        lines = (self._partial + data).split(b"\n")
        self._partial = lines.pop()
        shown: List[str] = []
        for line in lines:
            if self._skipping:
                self._skipping = False
                continue
            shown.append(self._render(line))
        if len(self._partial) > MAX_LINE * 4:  # a huge line in the making: show its start, skip the rest
            if not self._skipping:
                shown.append(self._render(self._partial) + " ...[line cut]")
            self._partial, self._skipping = b"", True
        self._emit(shown)

    def finish(self, budget_s: float = 2.0) -> None:
        """Read what is left, in bounded chunks, for at most ``budget_s``; what is left after that is counted, and
        the console says how many lines it did not show (they are all in the log)."""
        deadline = time.monotonic() + budget_s
        while time.monotonic() < deadline:
            before = self._offset
            self.poll()
            if self._offset == before:
                break
        if self._partial and not self._skipping:
            self._emit([self._render(self._partial)])
        self._partial = b""
        left = self._lines_left(deadline=time.monotonic() + _COUNT_S)
        if left:
            count = f"{left[0]}{'+' if left[1] else ''}"
            self.console.write(
                f"{self.prefix}[mmt] {count} more line(s) not shown: the job ended faster than the "
                f"console could follow it; every line is in {self.path}\n"
            )

    def _lines_left(self, deadline: float) -> Optional[Tuple[int, bool]]:
        """(lines of the log after what was read, whether there are more: the count stops at ``deadline``); None
        when nothing is left."""
        count, last, more = 0, b"", False
        try:
            with open(self.path, "rb") as handle:
                handle.seek(self._offset)
                while True:
                    data = handle.read(_COUNT_CHUNK)
                    if not data:
                        break
                    count, last = count + data.count(b"\n"), data
                    if time.monotonic() >= deadline:
                        more = bool(handle.read(1))
                        break
        except (FileNotFoundError, NotADirectoryError):
            return None
        if not last:
            return None
        return count + (0 if last.endswith(b"\n") else 1), more  # an unfinished last line counts too

    def _render(self, line: bytes) -> str:
        text = clean(line[: MAX_LINE * 4].decode(errors="replace"))
        if len(text) > MAX_LINE:
            text = text[:MAX_LINE] + " ...[line cut]"
        return text

    def _emit(self, lines: List[str]) -> None:
        if lines:
            self.console.write("".join(f"{self.prefix}{line}\n" for line in lines))


def tail(path: Path, lines: int = 15) -> List[str]:
    """The last ``lines`` lines of a log file (a failing rank's end, shown on the console)."""
    try:
        with open(path, "rb") as handle:
            handle.seek(0, os.SEEK_END)
            size = handle.tell()
            handle.seek(max(0, size - 64 * 1024))
            text = handle.read().decode(errors="replace")
    except (FileNotFoundError, NotADirectoryError):
        return []
    return [clean(line)[:MAX_LINE] for line in text.splitlines()[-lines:]]
