"""Timing shared by the benchmarks: every variant once to warm up, then rounds in which the variants alternate."""

import time
from pathlib import Path
from typing import Callable, Dict, List


def alternate(variants: Dict[str, Callable[[Path], None]], rounds: int, scratch: Path) -> Dict[str, List[float]]:
    """Wall seconds of every run of every variant. Each round starts with the next variant, so that none always
    runs first (cold caches) or right after the same neighbour."""
    times: Dict[str, List[float]] = {name: [] for name in variants}
    for run in variants.values():  # warm-up: page cache, .pyc files, the cluster's first job
        run(scratch)
    items = list(variants.items())
    for round_ in range(rounds):
        for name, run in items[round_ % len(items):] + items[:round_ % len(items)]:
            started = time.perf_counter()
            run(scratch)
            times[name].append(time.perf_counter() - started)
    return times
