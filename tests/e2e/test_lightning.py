"""The LM recipe (Lightning Trainer, DDP over gloo) on 2 simulated nodes x 2 processes."""

import csv
import json
import math
import os
import subprocess
import sys

from helpers.app import job_dirs, results, run_app
from helpers.paths import REPO


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
    env = dict(
        os.environ,
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT="29999",
        NODE_RANK="0",
        LOCAL_RANK="0",
        RANK="0",
        WORLD_SIZE="4",
        LOCAL_WORLD_SIZE="2",
        NUM_NODES="1",
        MMT_JOB_DIR=str(tmp_path),
    )
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


# The recipe itself on 2 nodes x 2 ranks (command mode, one process per rank), once straight and once stopped by
# the requeue flag and resumed in a new launch. The flag is raised at a chosen step through mmt.core.preemption (what
# SLURM's USR2 does inside an mmt SLURM task, tested end to end in test_slurm.py); the `scontrol requeue` call
# itself is replaced, as there is no SLURM here.
_RESUME_SCRIPT = """
import itertools, json, os, sys
sys.path.insert(0, {repo!r})
import torch.distributed
from mmt.core import preemption
from recipes import lm

os.environ[preemption.MAX_REQUEUES_VAR] = "1"  # what an mmt SLURM task sets from hydra.launcher.max_requeues
preemption.install()
preemption.requeue = lambda: None
out, stop_after = sys.argv[1], int(sys.argv[2])
kw = dict(seed=7, accelerator="cpu", data_dir={data!r}, block_size=35, val_fraction=0.05, lr=1.0,
          model=dict(ninp=32, nhead=2, nhid=32, nlayers=1, dropout=0.2), max_steps=40, val_check_interval=20,
          limit_val_batches=2, gradient_clip_val=0.25, precision="32-true", batch_size=16, accumulate_grad_batches=1)
if stop_after:
    calls = itertools.count(1)
    preemption.requested = lambda: next(calls) >= stop_after   # asked once per step until it says yes
    try:
        lm.train(output_dir=out, **kw)
    except preemption.Requeued as stopped:
        print("STOPPED", stopped, flush=True)
        sys.exit(0)
    sys.exit("the run was not interrupted")
result = lm.train(output_dir=out, **kw)
if os.environ["RANK"] == "0":
    print("RESULT " + json.dumps(result), flush=True)
torch.distributed.destroy_process_group()  # the Trainer leaves it open; gloo can abort the exit otherwise
"""


def _resume_launch(tmp_path, tag, name, stop_after):
    script = tmp_path / "resume_script.py"
    script.write_text(_RESUME_SCRIPT.format(repo=str(REPO), data=str(REPO / "data")))
    done = run_app(
        "num_nodes=2",
        "devices=2",
        "command_mode=per_rank",
        f"command='{sys.executable} {script} {tmp_path / name} {stop_after}'",
        sweep_dir=tmp_path / f"sweep-{name}-{stop_after}",
        tag=tag,
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    return done.stdout


def test_a_requeued_lm_run_resumes_to_the_uninterrupted_weights(tmp_path, tag):
    straight_out = _resume_launch(tmp_path, tag, "straight", 0)
    stopped_out = _resume_launch(tmp_path, tag, "requeued", 10)
    resumed_out = _resume_launch(tmp_path, tag, "requeued", 0)

    def result(output):
        [line] = [line for line in output.splitlines() if "] RESULT " in line]
        return json.loads(line.split("] RESULT ", 1)[1])

    straight, resumed = result(straight_out), result(resumed_out)
    # the flag came at step 10; the checkpoint waited for the end of that epoch (28 steps of 4 x 16 samples
    # with Python 3.11's docs as the corpus), before the last step
    [stopped] = [int(line.rsplit(" ", 1)[1]) for line in stopped_out.splitlines() if "] STOPPED " in line]
    assert 10 < stopped < 40
    assert resumed["resumed_from_checkpoint"] is True and straight["resumed_from_checkpoint"] is False
    assert resumed["steps"] == straight["steps"] == 40
    # bit for bit: data order, dropout, DDP's reduction order, the optimizer
    assert len(set(resumed["weight_digests"])) == 1
    assert resumed["weight_digests"] == straight["weight_digests"]
    assert resumed["val_loss"] == straight["val_loss"]
