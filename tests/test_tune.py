"""The micro-batch tuner: the search on its own, then real trial processes under an enforced memory budget.

The real-process tests tune ``recipe=memhog`` (tests/fixtures/shared_recipes), which holds 64 MiB per sample
and whose throughput peaks at a micro-batch of 8. Under a 1 GiB RLIMIT_DATA budget, with the trial process
itself using ~20 MiB, the largest micro-batch that fits is 15 (15 x 64 = 960 MiB; 16 x 64 = 1024 MiB does not).
"""

import math

import pytest
import yaml

from conftest import SHARED_SEARCHPATH, run_app, run_tune
from mmt.tune import TuneSettings, Trial, choose, refine, search


def _fake(limit: int, rates=None):
    """A trial runner for which exactly the micro-batches <= ``limit`` fit."""
    calls = []

    def run(micro: int) -> Trial:
        calls.append(micro)
        fits = micro <= limit
        return Trial(micro, fits, samples_per_s=(rates or (lambda m: float(m)))(micro) if fits else None,
                     why="" if fits else "oom")

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
    trials = [Trial(m, True, samples_per_s=r) for m, r in ((8, 80.0), (16, 99.0), (32, 100.0), (64, 60.0),
                                                           (70, 120.0))]
    trials.append(Trial(128, False, why="oom"))
    settings = TuneSettings(budget_gb=1, margin=0.1, tie=0.02)
    chosen, largest, cap = choose(trials, settings)
    assert (largest, cap) == (70, 63)  # 70 is the fastest, but above the margin cap
    assert chosen.micro == 16  # 99 is within 2 % of the fastest below the cap (32: 100): equally fast, smaller
    chosen, _, _ = choose(trials, TuneSettings(budget_gb=1, margin=0.1, tie=0.0))
    assert chosen.micro == 32
    assert choose([Trial(1, False, why="oom")], settings) == (None, 0, 0)


def _entries(path):
    return yaml.safe_load(path.read_text())["entries"]


def test_tuner_finds_the_limit_under_an_enforced_memory_budget(shared_recipes, tmp_path):
    env = {"PYTHONPATH": str(shared_recipes)}
    done = run_tune(SHARED_SEARCHPATH, "recipe=memhog", "tune.budget_gb=1", run_dir=tmp_path, **env)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "micro    16: does not fit (oom: MemoryError" in done.stdout
    # written into the recipe package's own table (batch.table = pkg://mmt_shared_recipes.tuned/memhog.yaml)
    [entry] = _entries(shared_recipes / "mmt_shared_recipes" / "tuned" / "memhog.yaml")
    assert (entry["recipe"], entry["machine"], entry["precision"], entry["memory_per_device_gb"]) == (
        "memhog", "cpu", "32-true", 1.0)
    assert entry["max_fit"] == 15 and entry["margin_cap"] == 13  # 15 x (1 - 0.1)
    assert entry["micro_batch"] == 8, "the fastest candidate below the cap, not the largest"
    assert entry["candidates"][16] == "oom" and entry["candidates"][8] == 8.0  # (8 + 8) / 2: measured twice
    assert entry["search"]["trials"] <= 16 + 1 + 4 + 3 and entry["search"]["budget_enforced_by"] == "RLIMIT_DATA"
    assert {"python", "torch", "lightning"} <= set(entry["versions"]) and entry["tuned_at"]
    assert sorted(p.name for p in (tmp_path / "trials").glob("micro*.log"))  # every trial kept its log
    # the next job of this recipe plans with it: 16 GiB per device on `cpu` >= the 1 GiB it was tuned under
    plan = run_app(SHARED_SEARCHPATH, "recipe=memhog", "hydra.launcher.dry_run=true", sweep_dir=tmp_path / "dry",
                   **env)
    assert plan.returncode == 0, plan.stderr
    assert ("batch      global 64 = 1 rank x micro 8 x accumulate 8; limit 8 per device (tuned for "
            "memhog/cpu/32-true with 1 GiB per device") in plan.stdout


def test_a_killed_candidate_does_not_end_the_search(shared_recipes, tmp_path):
    table = tmp_path / "memhog.yaml"
    done = run_tune(SHARED_SEARCHPATH, "recipe=memhog", "tune.budget_gb=4", "recipe.kill_above=10",
                    f"tune.table={table}", run_dir=tmp_path / "run", PYTHONPATH=str(shared_recipes))
    assert done.returncode == 0, done.stderr[-3000:]
    [entry] = _entries(table)
    assert entry["max_fit"] == 10 and entry["candidates"][11] == "killed by SIGKILL"
    assert entry["micro_batch"] == 8


def test_a_recipe_that_fails_for_another_reason_stops_the_tuner_with_its_error(shared_recipes, tmp_path):
    done = run_tune(SHARED_SEARCHPATH, "recipe=memhog", "tune.budget_gb=1", "recipe.per_sample_mb=-1",
                    f"tune.table={tmp_path / 't.yaml'}", run_dir=tmp_path / "run", PYTHONPATH=str(shared_recipes))
    assert done.returncode == 2
    assert "the first candidate failed for another reason than memory: error: ValueError" in done.stderr
    assert not (tmp_path / "t.yaml").exists()


def test_a_recipe_without_a_batch_section_cannot_be_tuned(tmp_path):
    done = run_tune("recipe=probe", run_dir=tmp_path)
    assert done.returncode == 2 and "has no batch.recipe / batch.table" in done.stderr


def test_refine_finds_a_throughput_peak_between_the_powers_of_two():
    settings = TuneSettings(budget_gb=1, max_micro=512, refine_trials=4)
    run, calls = _fake(limit=96, rates=lambda m: 100.0 - abs(m - 24))  # fastest at 24, fits up to 96
    trials = search(run, settings)
    searched = len(trials)
    refine(run, trials, settings)
    assert len(trials) - searched <= 4
    chosen, largest, _ = choose(trials, TuneSettings(budget_gb=1, tie=0))
    assert largest == 96 and chosen.micro == 24, calls
