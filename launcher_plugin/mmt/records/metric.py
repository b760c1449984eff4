"""A job's summary metric: the one number the console summary, ``summary.png`` and the live page show for it, chosen
here and nowhere else, so that the three never disagree on which number a job produced.

A job returns a number, or a dict of them (``val_loss``, ``seconds_to_first_collective`` ...). The key is the
recipe's ``summary_metric`` (or the sweeper's ``optimized_metric``), recorded in ``result.json``:

* a dict: its value under that key; with no key, its first number;
* a bare number: itself, named after the key, or ``result`` when there is none.
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass
from typing import Any, Iterable, Optional

# the name of a bare number returned by a job whose recipe names no metric
UNNAMED = "result"


def number(value: Any) -> Optional[float]:
    """A finite int/float as a float; None for anything else (bools, strings, NaN)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value) if math.isfinite(value) else None


@dataclass(frozen=True)
class SummaryMetric:
    name: str
    value: Optional[float]  # None: the job produced no such number (it failed, or returned something else)


def summary_metric(value: Any, key: Optional[str], fallback_key: Optional[str] = None) -> SummaryMetric:
    """The summary metric of a job that returned ``value`` with ``result.json``'s ``summary_metric`` ``key``;
    ``fallback_key``: the key to use when the result names none (a result written before it was recorded, whose
    sweep's summary.csv names the column the console showed)."""
    key = key if isinstance(key, str) and key else fallback_key
    if isinstance(value, dict):
        if key:
            return SummaryMetric(key, number(value.get(key)))
        for name, item in value.items():
            if number(item) is not None:
                return SummaryMetric(str(name), number(item))
        return SummaryMetric(UNNAMED, None)
    return SummaryMetric(key or UNNAMED, number(value))


def sweep_metric_name(metrics: Iterable[SummaryMetric]) -> Optional[str]:
    """The name a sweep's metric column, axis or chart shows: the one most of its jobs with a number have (the
    earliest such job's on a tie); None when no job has one."""
    names = [metric.name for metric in metrics if metric.value is not None]
    if not names:
        return None
    counts = Counter(names)
    best = max(counts.values())
    return next(name for name in names if counts[name] == best)
