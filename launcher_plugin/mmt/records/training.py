"""``<job dir>/metrics.csv``: the training curves rank 0 writes, read one way by every view (the live page,
``summary.png``, the terminal's progress line).

The file is Lightning's CSVLogger (``epoch,step,train_loss,val_loss,...``, a step's validation on a row of its own
with the other cells empty) or the recipes' own writer (``step,train_loss,...``). Rows are merged by step; a step
that goes back marks where a later run took over (a restart or a requeue resumed from a checkpoint), and its rows
win. A row still being written (no newline yet) is left out. Nothing here raises on a bad file: what cannot be
read is not there.
"""

from __future__ import annotations

import csv
import math
import os
import stat
from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, List, Optional, Tuple

# columns that index a row rather than measure something
INDEX_COLUMNS = ("step", "epoch")
# beyond this only the header and the end of the file are read (a long run's file grows without bound)
MAX_BYTES = 8 * 1024 * 1024


def _number(cell: Optional[str]) -> Optional[float]:
    try:
        value = float(cell) if cell else None
    except ValueError:
        return None
    return value if value is not None and math.isfinite(value) else None


@dataclass(frozen=True)
class TrainingMetrics:
    """Every measured column against the steps, merged by step (None where a step has no value)."""

    steps: Tuple[float, ...] = ()
    series: Dict[str, Tuple[Optional[float], ...]] = field(default_factory=dict)
    # the steps where a later run took over (its step went back)
    restarts: Tuple[float, ...] = ()

    def points(self, column: str) -> Tuple[List[float], List[float]]:
        """(steps, values) of one column, where it has values."""
        pairs = [(s, v) for s, v in zip(self.steps, self.series.get(column, ())) if v is not None]
        return [s for s, _ in pairs], [v for _, v in pairs]

    def last(self, column: str) -> Optional[float]:
        """The column's value at the newest step that has one."""
        values = [v for v in self.series.get(column, ()) if v is not None]
        return values[-1] if values else None

    @property
    def last_step(self) -> Optional[float]:
        return self.steps[-1] if self.steps else None


def parse(text: str) -> TrainingMetrics:
    """The metrics of a metrics.csv's text (a row without a step counts by its position)."""
    lines = text.split("\n")
    if not text.endswith("\n"):
        lines = lines[:-1]  # a row still being written
    try:
        rows = list(csv.reader(lines))
    except csv.Error:
        return TrainingMetrics()
    if not rows:
        return TrainingMetrics()
    header, body = rows[0], [r for r in rows[1:] if r]
    step_col = header.index("step") if "step" in header else None
    by_step: Dict[float, Dict[str, float]] = {}
    restarts: List[float] = []
    previous: Optional[float] = None
    for index, row in enumerate(body):
        step = _number(row[step_col]) if step_col is not None and step_col < len(row) else float(index)
        if step is None:
            continue
        if previous is not None and step < previous:
            restarts.append(step)
        previous = step
        merged = by_step.setdefault(step, {})
        for name, cell in zip(header, row):
            value = _number(cell) if name not in INDEX_COLUMNS else None
            if value is not None:
                merged[name] = value  # Lightning writes a step's train and val values on separate rows
    steps = sorted(by_step)
    names = [n for n in header if n not in INDEX_COLUMNS and any(n in by_step[s] for s in steps)]
    return TrainingMetrics(
        steps=tuple(steps),
        series={n: tuple(by_step[s].get(n) for s in steps) for n in names},
        restarts=tuple(restarts),
    )


def read(path: Path, max_bytes: int = MAX_BYTES) -> TrainingMetrics:
    """The metrics in ``path`` (its header and at most its last ``max_bytes``); empty when there is no regular
    file to read there. Never through a symlink, never a FIFO that would block."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError:
        return TrainingMetrics()
    info = os.fstat(fd)
    if not stat.S_ISREG(info.st_mode):
        os.close(fd)
        return TrainingMetrics()
    with os.fdopen(fd, "rb") as handle:
        header = handle.readline()
        if info.st_size > max_bytes:
            handle.seek(info.st_size - max_bytes)
            body = handle.read()
            body = body[body.find(b"\n") + 1 :]  # from a row's start
        else:
            body = handle.read()
    return parse((header + body).decode("utf-8", errors="replace"))
