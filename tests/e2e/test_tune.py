"""The micro-batch tuner with real trial processes under an enforced memory budget. (The search on its own:
tests/unit/test_tune.py.)

These tests tune ``recipe=memhog`` (tests/fixtures/shared_recipes), which holds 64 MiB per sample and whose
throughput peaks at a micro-batch of 8. Under a 1 GiB RLIMIT_DATA budget, with the trial process itself using
~20 MiB, the largest micro-batch that fits is 15 (15 x 64 = 960 MiB; 16 x 64 = 1024 MiB does not).
"""

import yaml

from helpers.app import run_app, run_tune
from helpers.recipes import SHARED_SEARCHPATH


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
        "memhog",
        "cpu",
        "32-true",
        1.0,
    )
    assert entry["max_fit"] == 15 and entry["margin_cap"] == 13  # 15 x (1 - 0.1)
    assert entry["micro_batch"] == 8, "the fastest candidate below the cap, not the largest"
    assert entry["candidates"][16] == "oom" and entry["candidates"][8] == 8.0  # (8 + 8) / 2: measured twice
    assert entry["search"]["trials"] <= 16 + 1 + 4 + 3 and entry["search"]["budget_enforced_by"] == "RLIMIT_DATA"
    assert {"python", "torch", "lightning"} <= set(entry["versions"]) and entry["tuned_at"]
    assert sorted(p.name for p in (tmp_path / "trials").glob("micro*.log"))  # every trial kept its log
    # the next job of this recipe plans with it: 16 GiB per device on `cpu` >= the 1 GiB it was tuned under
    plan = run_app(SHARED_SEARCHPATH, "recipe=memhog", "hydra.launcher.dry_run=true", sweep_dir=tmp_path / "dry", **env)
    assert plan.returncode == 0, plan.stderr
    assert (
        "batch      global 64 = 1 rank x micro 8 x accumulate 8; limit 8 per device (tuned for "
        "memhog/cpu/32-true with 1 GiB per device"
    ) in plan.stdout


def test_a_killed_candidate_does_not_end_the_search(shared_recipes, tmp_path):
    table = tmp_path / "memhog.yaml"
    done = run_tune(
        SHARED_SEARCHPATH,
        "recipe=memhog",
        "tune.budget_gb=4",
        "recipe.kill_above=10",
        f"tune.table={table}",
        run_dir=tmp_path / "run",
        PYTHONPATH=str(shared_recipes),
    )
    assert done.returncode == 0, done.stderr[-3000:]
    [entry] = _entries(table)
    assert entry["max_fit"] == 10 and entry["candidates"][11] == "killed by SIGKILL"
    assert entry["micro_batch"] == 8


def test_a_recipe_that_fails_for_another_reason_stops_the_tuner_with_its_error(shared_recipes, tmp_path):
    done = run_tune(
        SHARED_SEARCHPATH,
        "recipe=memhog",
        "tune.budget_gb=1",
        "recipe.per_sample_mb=-1",
        f"tune.table={tmp_path / 't.yaml'}",
        run_dir=tmp_path / "run",
        PYTHONPATH=str(shared_recipes),
    )
    assert done.returncode == 2
    assert "the first candidate failed for another reason than memory: error: ValueError" in done.stderr
    assert not (tmp_path / "t.yaml").exists()


def test_a_recipe_without_a_batch_section_cannot_be_tuned(tmp_path):
    done = run_tune("recipe=probe", run_dir=tmp_path)
    assert done.returncode == 2 and "has no batch.recipe / batch.table" in done.stderr
