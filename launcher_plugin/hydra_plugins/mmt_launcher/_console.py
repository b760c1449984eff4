"""What the launcher prints: ranks' output live (prefixed with job, node and rank) and the sweep summary."""

import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, List, Optional, Sequence, TextIO


class LogFollower:
    """Echo the lines appended to one rank's log file, each prefixed, as they arrive (``tail -f`` by polling).

    Ranks write their own log files (so nothing is lost if the launcher dies); the console only follows them.
    """

    def __init__(self, path: Path, prefix: str, out: TextIO = sys.stdout) -> None:
        self.path, self.prefix, self.out = path, prefix, out
        self._offset = 0
        self._partial = b""

    def poll(self) -> None:
        try:
            with open(self.path, "rb") as handle:
                handle.seek(self._offset)
                data = handle.read()
        except FileNotFoundError:
            return
        if not data:
            return
        self._offset += len(data)
        lines = (self._partial + data).split(b"\n")
        self._partial = lines.pop()
        self._emit(lines)

    def finish(self) -> None:
        self.poll()
        if self._partial:
            self._emit([self._partial])
            self._partial = b""

    def _emit(self, lines: List[bytes]) -> None:
        text = "".join(f"{self.prefix}{line.decode(errors='replace').rstrip(chr(13))}\n" for line in lines)
        self.out.write(text)
        self.out.flush()


def tail(path: Path, lines: int = 15) -> List[str]:
    """The last ``lines`` lines of a log file (for showing a failing rank's end on the console)."""
    try:
        with open(path, "rb") as handle:
            handle.seek(0, os.SEEK_END)
            size = handle.tell()
            handle.seek(max(0, size - 64 * 1024))
            text = handle.read().decode(errors="replace")
    except FileNotFoundError:
        return []
    return text.splitlines()[-lines:]


@dataclass(frozen=True)
class SummaryRow:
    job: int
    overrides: str
    status: str
    topology: str
    duration_s: Optional[float]
    metric: str
    note: str = ""


def format_summary(title: str, rows: Sequence[SummaryRow], metric_name: str) -> str:
    header = ["#", "overrides", "status", "nodes x devices", "duration", metric_name]
    body = [
        [str(r.job), r.overrides or "(none)", r.status, r.topology,
         "-" if r.duration_s is None else f"{r.duration_s:.1f} s", r.metric]
        for r in rows
    ]
    widths = [max(len(line[i]) for line in [header] + body) for i in range(len(header))]
    render = lambda cells: "  ".join(c.ljust(w) for c, w in zip(cells, widths)).rstrip()  # noqa: E731
    lines = [title, render(header), render(["-" * w for w in widths])] + [render(b) for b in body]
    lines += [f"  job {r.job}: {r.note}" for r in rows if r.note]
    return "\n".join(lines)


def metric_of(value: object, key: Optional[str]) -> Dict[str, str]:
    """The number shown in the summary: ``value[key]``, else the first number of a returned dict, else value."""
    if isinstance(value, dict):
        items = [(key, value.get(key))] if key else list(value.items())
        for name, item in items:
            if isinstance(item, (int, float)) and not isinstance(item, bool):
                return {"name": str(name), "value": f"{item:.4g}"}
        return {"name": key or "result", "value": "-"}
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return {"name": "result", "value": f"{value:.4g}"}
    return {"name": key or "result", "value": "-"}
