"""The micro-batch tuner's search on its own: the limit within a logarithmic number of trials, the choice below the
margin, the refinement between powers of two. (Real trial processes under an enforced memory budget:
tests/e2e/test_tune.py.)"""

import math

import pytest

from mmt.tune import Trial, TuneSettings, choose, refine, search


def _fake(limit: int, rates=None):
    """A trial runner for which exactly the micro-batches <= ``limit`` fit."""
    calls = []

    def run(micro: int) -> Trial:
        calls.append(micro)
        fits = micro <= limit
        return Trial(
            micro,
            fits,
            samples_per_s=(rates or (lambda m: float(m)))(micro) if fits else None,
            why="" if fits else "oom",
        )

    return run, calls


@pytest.mark.parametrize("start", [1, 3, 16])
def test_search_finds_the_exact_limit_within_a_logarithmic_number_of_trials(start):
    settings = TuneSettings(budget_gb=1, start=start, max_micro=1024, max_trials=40, resolution=0)
    for limit in list(range(1, 70)) + [100, 257, 511, 512, 513, 1000, 1023]:
        run, calls = _fake(limit)
        trials = search(run, settings)
        fits = [t.micro for t in trials if t.fits]
        assert (max(fits) if fits else 0) == limit, (limit, calls)
        assert any(t.micro == limit + 1 and not t.fits for t in trials) or limit < start, (limit, calls)
        # doubling up to the first misfit, then bisection of the gap
        top = max(limit, start)
        bound = math.ceil(math.log2(max(2, 2 * top / start))) + math.ceil(math.log2(max(2, top))) + 1
        assert len(calls) <= bound and len(set(calls)) == len(calls), (limit, calls, bound)


def test_search_stops_at_max_micro_and_within_max_trials():
    run, calls = _fake(limit=10_000)
    trials = search(run, TuneSettings(budget_gb=1, start=1, max_micro=100, max_trials=16))
    assert calls == [1, 2, 4, 8, 16, 32, 64, 100]  # the cap itself is tried, never assumed
    run, calls = _fake(limit=700)
    trials = search(run, TuneSettings(budget_gb=1, start=1, max_micro=4096, max_trials=12, resolution=0))
    assert len(trials) == 12  # stopped by the trial budget, the largest fit so far is what it has
    assert max(t.micro for t in trials if t.fits) <= 700


def test_choose_takes_the_fastest_below_the_margin_not_the_largest():
    trials = [Trial(m, True, samples_per_s=r) for m, r in ((8, 80.0), (16, 99.0), (32, 100.0), (64, 60.0), (70, 120.0))]
    trials.append(Trial(128, False, why="oom"))
    settings = TuneSettings(budget_gb=1, margin=0.1, tie=0.02)
    chosen, largest, cap = choose(trials, settings)
    assert (largest, cap) == (70, 63)  # 70 is the fastest, but above the margin cap
    assert chosen.micro == 16  # 99 is within 2 % of the fastest below the cap (32: 100): equally fast, smaller
    chosen, _, _ = choose(trials, TuneSettings(budget_gb=1, margin=0.1, tie=0.0))
    assert chosen.micro == 32
    assert choose([Trial(1, False, why="oom")], settings) == (None, 0, 0)


def test_refine_finds_a_throughput_peak_between_the_powers_of_two():
    settings = TuneSettings(budget_gb=1, max_micro=512, refine_trials=4)
    run, calls = _fake(limit=96, rates=lambda m: 100.0 - abs(m - 24))  # fastest at 24, fits up to 96
    trials = search(run, settings)
    searched = len(trials)
    refine(run, trials, settings)
    assert len(trials) - searched <= 4
    chosen, largest, _ = choose(trials, TuneSettings(budget_gb=1, tie=0))
    assert largest == 96 and chosen.micro == 24, calls
