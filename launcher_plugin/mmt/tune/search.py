"""The micro-batch tuner: the largest micro-batch a recipe fits in one device's memory, and the fastest one below it.

Each candidate runs the real recipe for a few steps in a fresh process (``mmt.tune.trial``, started by
``mmt.tune.runner``) under the machine's
memory budget per device, so an out-of-memory error or a kill ends that trial, not the search. The search
doubles from ``start`` until a candidate does not fit (or ``max_micro`` fits), then bisects the gap, never running
more than ``max_trials`` candidates. A safety margin caps the result at ``largest fit x (1 - margin)``: training
runs longer than a trial (validation and checkpoint peaks, fragmentation, DDP's gradient buckets: the trial runs
one process). Throughput often peaks below the memory maximum, between the powers of two the search measured, so
up to ``refine_trials`` more candidates probe around the fastest one, and the ``confirm_trials`` fastest are
measured twice; of the candidates that fit below the cap, the fastest (samples/s) is the limit. The entry goes into
the recipe's tuned table with how it was measured.

Lightning's batch-size finder is not used: it refuses distributed strategies, tunes inside the live process (an
OOM can leave it unusable, and a kill ends everything), and in 2.6.6 returns ``max_val`` untried.

    python tune.py recipe=lm machine=cpu                  # writes recipes/tuned/lm.yaml
    python tune.py recipe=lm machine=cpu devices=2        # CPU: the node's memory shared by 2 processes
    python tune.py recipe=lm tune.budget_gb=1.5 tune.table=/tmp/lm.yaml   # a small budget, a scratch table
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable, List, Optional, Tuple


class TuneError(RuntimeError):
    """The search cannot give an answer (nothing fits, or the smallest candidate fails for another reason)."""


@dataclass(frozen=True)
class TuneSettings:
    budget_gb: float
    margin: float = 0.1
    start: int = 1
    max_micro: int = 1024
    max_trials: int = 16
    resolution: float = 0.05
    tie: float = 0.0
    trial_timeout_s: float = 600.0
    refine_trials: int = 4
    confirm_trials: int = 3

    def __post_init__(self) -> None:
        checks = [
            (self.budget_gb > 0, "tune.budget_gb must be > 0"),
            (0 <= self.margin < 1, "tune.margin must be in [0, 1)"),
            (1 <= self.start <= self.max_micro, "need 1 <= tune.start <= tune.max_micro"),
            (self.max_trials >= 2, "tune.max_trials must be >= 2"),
            (0 <= self.resolution < 1 and 0 <= self.tie < 1, "tune.resolution and tune.tie are in [0, 1)"),
            (self.trial_timeout_s > 0, "tune.trial_timeout_s must be > 0"),
            (
                self.refine_trials >= 0 and self.confirm_trials >= 0,
                "tune.refine_trials and tune.confirm_trials must be >= 0",
            ),
        ]
        for ok, message in checks:
            if not ok:
                raise ValueError(message)


@dataclass(frozen=True)
class Trial:
    micro: int
    fits: bool
    samples_per_s: Optional[float] = None
    why: str = ""  # why it does not fit: "oom: ...", "killed by SIGKILL", "error: ...", "timeout"
    seconds: float = 0.0
    peak_rss_mb: Optional[float] = None


def search(run: Callable[[int], Trial], settings: TuneSettings) -> List[Trial]:
    """Every trial run, in order: doubling from ``start`` to the first misfit, then bisection."""
    trials: List[Trial] = []

    def attempt(micro: int) -> Trial:
        trial = run(micro)
        assert trial.micro == micro
        trials.append(trial)
        return trial

    fit, misfit = 0, None  # largest known fit, smallest known misfit
    micro = settings.start
    while len(trials) < settings.max_trials:
        if attempt(micro).fits:
            fit = micro
            if micro == settings.max_micro:
                break
            micro = min(2 * micro, settings.max_micro)
        else:
            misfit = micro
            break
    while (
        misfit is not None
        and misfit - fit > max(1, math.floor(fit * settings.resolution))
        and len(trials) < settings.max_trials
    ):
        micro = (fit + misfit) // 2
        if attempt(micro).fits:
            fit = micro
        else:
            misfit = micro
    return trials


def refine(run: Callable[[int], Trial], trials: List[Trial], settings: TuneSettings) -> List[Trial]:
    """Up to ``refine_trials`` more candidates around the fastest one below the margin cap, appended to ``trials``.

    The search measures powers of two and points near the memory limit; throughput usually peaks somewhere in
    between, so probe the midpoints between the fastest candidate and its measured neighbours, and repeat around
    whichever is then fastest.
    """
    budget = settings.refine_trials
    while budget > 0:
        _, _, cap = choose(trials, settings)
        fitting = {t.micro: t.samples_per_s for t in trials if t.fits and t.samples_per_s and t.micro <= cap}
        if not fitting:
            break
        ordered = sorted(fitting)
        best = max(ordered, key=lambda m: fitting[m])
        at = ordered.index(best)
        neighbours = ordered[max(0, at - 1) : at] + ordered[at + 1 : at + 2]
        tried = {t.micro for t in trials}
        points = [p for p in ((best + n) // 2 for n in neighbours) if p not in tried]
        if not points:
            break
        for point in points[:budget]:
            trials.append(run(point))
            budget -= 1
    return trials


def confirm(run: Callable[[int], Trial], trials: List[Trial], settings: TuneSettings) -> List[Trial]:
    """Measure the ``confirm_trials`` fastest candidates below the cap again; keep the mean of both runs.

    One short trial is noisy (other work on the host, frequency changes), and the fastest of many noisy numbers
    is biased upwards: a second measurement of the contenders keeps a lucky one from being chosen. A contender
    that does not fit the second time is dropped (memory that close to the edge is no limit to rely on).
    """
    _, _, cap = choose(trials, settings)
    contenders = sorted(
        (t for t in trials if t.fits and t.samples_per_s and t.micro <= cap), key=lambda t: -(t.samples_per_s or 0.0)
    )[: settings.confirm_trials]
    for first in contenders:
        again = run(first.micro)
        trials.remove(first)
        if again.fits and again.samples_per_s and first.samples_per_s:
            trials.append(
                Trial(
                    first.micro,
                    True,
                    samples_per_s=(first.samples_per_s + again.samples_per_s) / 2,
                    seconds=first.seconds + again.seconds,
                    peak_rss_mb=again.peak_rss_mb,
                )
            )
        else:
            trials.append(again)
    return trials


def sweep(run: Callable[[int], Trial], settings: TuneSettings) -> List[Trial]:
    """Every candidate from ``start`` up to the first misfit or ``max_micro`` (no trial limit): to check search()."""
    trials: List[Trial] = []
    for micro in range(settings.start, settings.max_micro + 1):
        trials.append(run(micro))
        if not trials[-1].fits:
            break
    return trials


def choose(trials: List[Trial], settings: TuneSettings) -> Tuple[Optional[Trial], int, int]:
    """(the limit's trial, largest fit, margin cap): the fastest fitting candidate at or below the cap.

    Candidates within ``tie`` of the fastest count as equally fast (trials are short and noisy): the smallest of
    them wins, for its memory headroom; a plateau of throughput is no reason to sit near the memory limit.
    """
    fitting = [t for t in trials if t.fits and t.samples_per_s]
    largest = max((t.micro for t in fitting), default=0)
    cap = max(1, math.floor(largest * (1 - settings.margin))) if largest else 0
    below = [t for t in fitting if t.micro <= cap]
    if not below:
        return None, largest, cap
    best = max(t.samples_per_s or 0.0 for t in below)
    fast = [t for t in below if (t.samples_per_s or 0.0) >= best * (1 - settings.tie)]
    return min(fast, key=lambda t: t.micro), largest, cap
