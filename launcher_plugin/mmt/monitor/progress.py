"""Progress of an attached launch in the terminal: the jobs pending, running and done, and per running job its step
against the total, the last loss and an ETA.

The numbers come from what the recipes already log (``metrics.csv`` in the job dir: Lightning's CSV logger, or the
recipes' own rows), never from Lightning's progress bar. On a terminal the status is a live block under rank 0's
prefixed output (rich); elsewhere (CI, ``| tee``) a plain line every ``PLAIN_EVERY_S`` when something changed.
"""

import csv
import io
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple

from mmt.core.jobdir import JobDir

# seconds between plain progress lines (CI logs); MMT_PROGRESS_EVERY_S changes it
PLAIN_EVERY_S = float(os.environ.get("MMT_PROGRESS_EVERY_S") or 10.0)
_READ_EVERY_S = 1.0
_TAIL_BYTES = 32 * 1024


def last_step(path: Path) -> Optional[Tuple[int, Optional[float]]]:
    """(step, train loss) of the newest training row of a metrics.csv, read from its end only."""
    found = _last_step_and_rate(path)
    return None if found is None else found[:2]


def _number(cell: Optional[str]) -> Optional[float]:
    try:
        return float(cell) if cell not in (None, "") else None
    except ValueError:
        return None


def _last_step_and_rate(path: Path) -> Optional[Tuple[int, Optional[float], Optional[float]]]:
    """``last_step`` and the newest row's ``tokens_per_s`` (recipe=llm writes it; None where a file has none)."""
    try:
        with open(path, "rb") as handle:
            header = handle.readline().decode(errors="replace")
            handle.seek(0, 2)
            size = handle.tell()
            handle.seek(max(len(header), size - _TAIL_BYTES))
            tail = handle.read().decode(errors="replace")
    except OSError:
        return None
    lines = tail.splitlines()[1:] if size > _TAIL_BYTES else tail.splitlines()
    best: Optional[Tuple[int, Optional[float], Optional[float]]] = None
    for row in csv.DictReader(io.StringIO(header + "\n".join(lines))):
        try:
            step = int(float(row.get("step") or ""))
        except ValueError:
            continue
        value, rate = _number(row.get("train_loss")), _number(row.get("tokens_per_s"))
        if best is None or step >= best[0]:
            same = best is not None and best[0] == step
            best = (
                step,
                value if value is not None else (best[1] if best and same else None),
                rate if rate is not None else (best[2] if best and same else None),
            )
    return best


@dataclass
class _Job:
    num: int
    name: str
    total: Optional[int]
    metrics: Path
    state: str = "PENDING"
    step: Optional[int] = None
    loss: Optional[float] = None
    first_seen: Optional[Tuple[float, int]] = None  # (time, step) of the first step seen, for the rate
    eta_s: Optional[float] = None
    tokens_per_s: Optional[float] = None  # the job's, where the recipe logs it (recipe=llm)

    def read(self, now: float) -> None:
        found = _last_step_and_rate(self.metrics)
        if found is None:
            return
        self.step, loss, rate = found
        self.loss = loss if loss is not None else self.loss
        self.tokens_per_s = rate if rate is not None else self.tokens_per_s
        if self.first_seen is None:
            self.first_seen = (now, self.step)
        elif self.total and self.step > self.first_seen[1]:
            rate = (self.step - self.first_seen[1]) / max(1e-6, now - self.first_seen[0])
            self.eta_s = max(0.0, (self.total - self.step) / rate)

    def describe(self) -> str:
        parts = [f"#{self.num}"]
        if self.step is not None:
            parts.append(f"step {self.step}" + (f"/{self.total}" if self.total else ""))
        if self.loss is not None:
            parts.append(f"loss {self.loss:.4g}")
        if self.tokens_per_s is not None:
            parts.append(f"{self.tokens_per_s:,.0f} tok/s")
        if self.eta_s is not None:
            parts.append(f"eta {self.eta_s:.0f} s")
        return " ".join(parts)


@dataclass
class ProgressView:
    """Fed by the engine every tick; reads the jobs' metrics files at most once a second."""

    console: Any  # mmt.launching.console.Console
    jobs: Dict[int, _Job] = field(default_factory=dict)
    _live: Any = None
    _last_plain: float = field(default_factory=time.monotonic)  # the first plain line after PLAIN_EVERY_S
    _last_plain_text: str = ""
    _last_read: float = 0.0

    @classmethod
    def for_plans(cls, console: Any, plans: List[Any]) -> "ProgressView":
        view = cls(
            console=console,
            jobs={
                p.num: _Job(num=p.num, name=p.name, total=p.max_steps, metrics=JobDir(Path(p.job_dir)).training_metrics)
                for p in plans
            },
        )
        if console.is_terminal:
            view._live = console.live(view._table())
        return view

    def update(self, states: Dict[int, str]) -> None:
        now = time.monotonic()
        if now - self._last_read < _READ_EVERY_S:
            return
        self._last_read = now
        for num, state in states.items():
            job = self.jobs[num]
            job.state = state
            if state in ("RUNNING", "STOPPING"):
                job.read(now)
        if self._live is not None:
            self._live.update(self._table())
        else:
            self._plain(now)

    def _counts(self) -> Dict[str, int]:
        counts = {"pending": 0, "running": 0, "done": 0}
        for job in self.jobs.values():
            key = "pending" if job.state == "PENDING" else "running" if job.state in ("RUNNING", "STOPPING") else "done"
            counts[key] += 1
        return counts

    def _plain(self, now: float) -> None:
        running = [job.describe() for job in self.jobs.values() if job.state in ("RUNNING", "STOPPING")]
        counts = self._counts()
        text = f"[mmt] {counts['pending']} pending, {counts['running']} running, {counts['done']} done" + (
            " | " + "; ".join(running) if running else ""
        )
        if text != self._last_plain_text and now - self._last_plain >= PLAIN_EVERY_S:
            self._last_plain, self._last_plain_text = now, text
            self.console.write(text + "\n")

    def _table(self) -> Any:
        from rich.table import Table

        counts = self._counts()
        table = Table(
            box=None,
            show_header=True,
            header_style="bold",
            pad_edge=False,
            title=f"mmt: {counts['pending']} pending, {counts['running']} running, {counts['done']} done",
            title_justify="left",
        )
        for column in ("job", "state", "step", "loss", "eta"):
            table.add_column(column)
        for job in self.jobs.values():
            if job.state not in ("RUNNING", "STOPPING"):
                continue
            step = "-" if job.step is None else f"{job.step}" + (f"/{job.total}" if job.total else "")
            table.add_row(
                f"#{job.num} {job.name}",
                job.state,
                step,
                "-" if job.loss is None else f"{job.loss:.4g}",
                "-" if job.eta_s is None else f"{job.eta_s:.0f} s",
            )
        return table

    def close(self) -> None:
        if self._live is not None:
            self._live.stop()
            self._live = None
