"""The three LM recipes (Lightning Trainer, Lightning Fabric, raw PyTorch DDP) on 2 nodes x 2 processes.

Same model, data, seed and batch plan: each must train one model (identical weights on every rank), lower its
loss, return its validation loss, and, with dropout off, land on the same validation loss as the others.
"""

import csv
import json
import math
import uuid
from pathlib import Path

import pytest

from helpers.app import job_dirs, results, run_app
from helpers.processes import wait_gone

RECIPES = {"lm": "last.ckpt", "lm_fabric": "last.ckpt", "lm_torch": "last.pt"}
# dropout off: what is left to differ between the frameworks is floating-point summation order
COMMON = ("num_nodes=2", "devices=2", "recipe.model.dropout=0", "batch.micro=8")
_runs: dict = {}


def _train(recipe: str, tmp_path_factory) -> dict:
    """Run ``recipe`` once per test session (the comparison test reuses the three runs)."""
    if recipe not in _runs:
        sweep = tmp_path_factory.mktemp(recipe)
        tag = uuid.uuid4().hex
        done = run_app(f"recipe={recipe}", *COMMON, sweep_dir=sweep, tag=tag)
        assert not wait_gone(tag), "processes left behind"
        assert done.returncode == 0, done.stderr[-3000:]
        [result] = results(sweep)
        _runs[recipe] = {"result": result, "job": job_dirs(sweep)[0], "stdout": done.stdout}
    return _runs[recipe]


@pytest.mark.parametrize("recipe", list(RECIPES))
def test_recipe_trains_one_model_on_two_by_two_and_the_loss_goes_down(recipe, tmp_path_factory):
    run = _train(recipe, tmp_path_factory)
    value = run["result"]["return_value"]
    assert value["world_size"] == 4 and value["steps"] == 40
    # the batch plan reached the recipe: global 64 = 4 ranks x micro 8 x accumulate 2
    assert (value["global_batch_size"], value["micro_batch_size"], value["grad_accum"]) == (64, 8, 2)
    # DDP kept the four ranks' weights identical
    assert len(value["weight_digests"]) == 4 and len(set(value["weight_digests"])) == 1
    assert value["train_loss_last"] < value["train_loss_first"] - 1.0
    assert math.log(100) < value["val_loss"] < math.log(8000)  # learnt something, but not implausibly much
    assert value["samples_per_s"] > 0
    job = run["job"]
    assert (job / "checkpoints" / RECIPES[recipe]).stat().st_size > 0, "rank 0 saves the checkpoint"
    with open(job / "metrics.csv") as handle:
        rows = [row for row in csv.DictReader(handle) if row.get("val_loss")]
    assert len(rows) == 2, "validation at steps 20 and 40"
    assert len(list((job / "logs").glob("node*.rank*.log"))) == 4
    # rank 0 reports; the other ranks' logs stay free of the recipe's report lines
    assert f"[#0 n0 r0] {recipe}: 40 steps on 4 ranks (micro-batch 8 x 2)" in run["stdout"]
    for log in (job / "logs").glob("node*.rank[123].log"):
        assert f"{recipe}: 40 steps" not in log.read_text()


def test_the_three_frameworks_reach_the_same_validation_loss(tmp_path_factory):
    losses = {name: _train(name, tmp_path_factory)["result"]["return_value"]["val_loss"] for name in RECIPES}
    assert max(losses.values()) - min(losses.values()) < 1e-3, losses


# loaded by every interpreter of the job (PYTHONPATH): records every rename and move, to see how checkpoints land
RECORD_MOVES = """
import json, os, shutil
_log = os.environ["MOVES_LOG"]
def _recorded(name, original):
    def call(src, dst, *args, **kwargs):
        with open(_log, "a") as handle:
            handle.write(json.dumps([name, os.fspath(src), os.fspath(dst)]) + "\\n")
        return original(src, dst, *args, **kwargs)
    return call
os.replace = _recorded("replace", os.replace)
shutil.move = _recorded("move", shutil.move)
"""


@pytest.mark.parametrize("recipe", list(RECIPES))
def test_recipe_runs_as_a_single_process_with_accumulation(recipe, tmp_path, tag):
    hooks = tmp_path / "hooks"
    hooks.mkdir()
    (hooks / "sitecustomize.py").write_text(RECORD_MOVES)
    moves = tmp_path / "moves.jsonl"
    # one rank: no process group, no DDP wrapper; the plan still splits the global batch (32 = 1 x 8 x 4)
    done = run_app(
        f"recipe={recipe}",
        "batch.global_size=32",
        "batch.micro=8",
        "recipe.max_steps=4",
        "recipe.val_check_interval=2",
        "recipe.limit_val_batches=2",
        sweep_dir=tmp_path / "sweep",
        tag=tag,
        PYTHONPATH=str(hooks),
        MOVES_LOG=str(moves),
    )
    assert done.returncode == 0, done.stderr[-3000:]
    [result] = results(tmp_path / "sweep")
    value = result["return_value"]
    assert (value["world_size"], value["steps"], value["micro_batch_size"], value["grad_accum"]) == (1, 4, 8, 4)
    assert math.isfinite(value["val_loss"]) and value["samples_per_s"] > 0
    # every checkpoint is put in place by a rename from its own dir, never moved in from elsewhere (a move across
    # filesystems is a copy that a kill can cut short)
    checkpoint = job_dirs(tmp_path / "sweep")[0] / "checkpoints" / RECIPES[recipe]
    placed = [
        (how, Path(src)) for how, src, dst in map(json.loads, moves.read_text().splitlines()) if Path(dst) == checkpoint
    ]
    assert placed and all(how == "replace" and src.parent == checkpoint.parent for how, src in placed), placed
