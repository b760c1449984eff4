"""The sweep summary: one row per job, printed at the end of a launch and appended to ``summary.csv``."""

import csv
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, List, Optional, Sequence

from mmt.launching.console import clean

# characters of a job's overrides the printed summary shows (summary.csv keeps them all): a sweep over long values
# (a command, a list) must not widen every row of the table to hundreds of columns
MAX_OVERRIDES = 100
_ELISION = " ... "


@dataclass(frozen=True)
class SummaryRow:
    job: int
    name: str
    overrides: str
    status: str
    num_nodes: int
    devices: int
    duration_s: Optional[float]
    metric: str
    note: str = ""

    @property
    def topology(self) -> str:
        return f"{self.num_nodes} x {self.devices}" if self.num_nodes else "-"


def first_line(text: str) -> str:
    """The first line that says something (torch's errors start with blank lines), as a terminal may show it: an
    exception's message can carry colours and other control sequences (rich, click), which never reach the
    summary raw."""
    return next((shown for line in text.splitlines() if (shown := clean(line).strip())), "")


def one_line(text: str, limit: int = MAX_OVERRIDES) -> str:
    """``text`` on one line of at most ``limit`` characters: control sequences removed, a newline shown as ``\\n``,
    the middle elided (both ends say the most: the first override, and the last that varies)."""
    text = clean(text.replace("\r\n", "\\n").replace("\n", "\\n").replace("\r", "\\r"))
    if len(text) <= limit:
        return text
    keep = max(2, limit - len(_ELISION))
    head = (keep + 1) // 2
    # no double space around the elision: readers split the table's columns on them
    return text[:head].rstrip() + _ELISION + text[len(text) - (keep - head) :].lstrip()


def metric_of(value: object, key: Optional[str]) -> Dict[str, str]:
    """The number shown in the summary: ``value[key]``, else the first number of a returned dict, else value."""
    if isinstance(value, dict):
        items = [(key, value.get(key))] if key else list(value.items())
        for name, item in items:
            if isinstance(item, (int, float)) and not isinstance(item, bool):
                return {"name": str(name), "value": f"{item:.4g}"}
        return {"name": key or "result", "value": "-"}
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return {"name": key or "result", "value": f"{value:.4g}"}
    return {"name": key or "result", "value": "-"}


def format_summary(title: str, rows: Sequence[SummaryRow], metric_name: str) -> str:
    header = ["#", "overrides", "status", "nodes x devices", "duration", metric_name]
    body = [
        [
            str(r.job),
            one_line(r.overrides) or "(none)",
            r.status,
            r.topology,
            "-" if r.duration_s is None else f"{r.duration_s:.1f} s",
            r.metric,
        ]
        for r in rows
    ]
    widths = [max(len(line[i]) for line in [header] + body) for i in range(len(header))]
    render = lambda cells: "  ".join(c.ljust(w) for c, w in zip(cells, widths)).rstrip()  # noqa: E731
    lines = [title, render(header), render(["-" * w for w in widths])] + [render(b) for b in body]
    lines += [f"  job {r.job}: {r.note}" for r in rows if r.note]
    return "\n".join(lines)


def append_summary_csv(path: Path, rows: List[SummaryRow], metric_name: str) -> None:
    new = not path.exists()
    with open(path, "a", newline="") as handle:
        writer = csv.writer(handle)
        if new:
            writer.writerow(
                ["job", "name", "overrides", "status", "num_nodes", "devices", "duration_s", metric_name, "note"]
            )
        for row in rows:
            writer.writerow(
                [
                    row.job,
                    row.name,
                    row.overrides,
                    row.status,
                    row.num_nodes,
                    row.devices,
                    "" if row.duration_s is None else f"{row.duration_s:.2f}",
                    row.metric,
                    row.note,
                ]
            )
