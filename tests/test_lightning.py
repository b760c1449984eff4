"""The LM recipe (Lightning Trainer, DDP over gloo) on 2 simulated nodes x 2 processes."""

import csv
import math
import os
import subprocess
import sys

from conftest import REPO, job_dirs, results, run_app


def test_lm_two_by_two_trains_one_model_and_the_loss_goes_down(tmp_path, tag):
    done = run_app("num_nodes=2", "devices=2", sweep_dir=tmp_path, tag=tag)
    assert done.returncode == 0, done.stderr[-3000:]
    [result] = results(tmp_path)
    value = result["return_value"]
    assert value["world_size"] == 4 and value["steps"] > 0
    # DDP kept every rank's weights identical: four digests, computed on four ranks, one value
    assert len(value["weight_digests"]) == 4 and len(set(value["weight_digests"])) == 1
    assert value["train_loss_last"] < value["train_loss_first"] - 1.0
    assert value["val_loss"] < math.log(8000)  # below a uniform guess over the ~8.8k-word vocabulary

    [job] = job_dirs(tmp_path)
    assert (job / "checkpoints" / "last.ckpt").stat().st_size > 0
    with open(job / "metrics.csv") as handle:
        rows = list(csv.DictReader(handle))
    assert any(row["val_loss"] for row in rows) and any(row["train_loss"] for row in rows)
    assert len(list((job / "logs").glob("node*.rank*.log"))) == 4
    assert "[#0 n0 r0] lm: " in done.stdout and "val_loss" in done.stdout


def test_recipe_refuses_a_trainer_world_that_differs_from_the_launchers(tmp_path):
    # a corrupt contract: 2 processes per node on 1 node, but WORLD_SIZE says 4. Lightning would train a world of
    # 2 and exit 0; the recipe must refuse before training.
    env = dict(os.environ, MASTER_ADDR="127.0.0.1", MASTER_PORT="29999", NODE_RANK="0", LOCAL_RANK="0", RANK="0",
               WORLD_SIZE="4", LOCAL_WORLD_SIZE="2", NUM_NODES="1", MMT_JOB_DIR=str(tmp_path))
    code = (
        "from recipes.lm import train\n"
        f"train(seed=1, accelerator='cpu', data_dir={str(tmp_path / 'data')!r}, block_size=35, val_fraction=0.05,"
        " batch_size=4, accumulate_grad_batches=1, lr=1.0, model=dict(ninp=16, nhead=2, nhid=16, nlayers=1,"
        " dropout=0.0), max_steps=2, val_check_interval=1, limit_val_batches=1, gradient_clip_val=0.25,"
        " precision='32-true')\n"
    )
    done = subprocess.run([sys.executable, "-c", code], cwd=REPO, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode != 0
    assert "trainer.world_size=2 but the launcher started WORLD_SIZE=4 ranks" in done.stderr
