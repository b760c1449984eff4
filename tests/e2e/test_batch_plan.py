"""The batch plan as a user sees it: shown in the dry run and carried by the rank contract, and an indivisible job
refused before anything starts. (The arithmetic: tests/unit/test_batch_plan.py.)"""

import re

from helpers.app import job_dirs, run_app


def test_dry_run_shows_the_plan_and_the_contract_carries_it(tmp_path):
    done = run_app(
        "num_nodes=2", "devices=4", "batch.global_size=96", "hydra.launcher.dry_run=true", sweep_dir=tmp_path
    )
    assert done.returncode == 0, done.stderr
    line = re.search(r"^  batch      (.*)$", done.stdout, re.M).group(1)
    assert line.startswith("global 96 = 8 ranks x micro 12 x accumulate 1; limit ")
    env_all = re.search(r"^  env \(all\)  (.*)$", done.stdout, re.M).group(1).split()
    assert "MMT_GLOBAL_BATCH_SIZE=96" in env_all and "MMT_MICRO_BATCH_SIZE=12" in env_all
    assert "MMT_GRAD_ACCUM=1" in env_all


def test_dry_run_says_when_nothing_is_tuned(tmp_path):
    done = run_app("machine=cpu_x_8", "hydra.launcher.dry_run=true", sweep_dir=tmp_path)
    assert done.returncode == 0, done.stderr
    assert (
        "  batch      global 64 = 1 rank x micro 16 x accumulate 4; limit 16 per device (batch.default_micro: "
        "no tuned entry for lm/cpu_x_8/32-true in pkg://recipes.tuned/lm.yaml)"
    ) in done.stdout


def test_an_indivisible_job_is_refused_before_anything_starts(tmp_path, tag):
    done = run_app("num_nodes=1,3", "devices=2", sweep_dir=tmp_path, tag=tag)
    assert done.returncode != 0 and "Traceback" not in done.stderr
    assert "Invalid batch.global_size=64: must be divisible by the world size 6 (3 nodes x 2 devices)" in done.stderr
    assert "HINT: with devices=2, num_nodes=1,2,4,8,16,32 divide it" in done.stderr
    assert job_dirs(tmp_path) == [], "not even the valid job of the sweep starts"
