"""recipe=llm for real: litgpt's GPT, Lightning Fabric DDP over gloo, the data step (a BPE trained by ``tokenizers``,
chunks written by ``litdata.optimize``) and LitData streaming, in real rank processes on simulated nodes.

Each test needs litgpt, litdata and tokenizers (scripts/setup_frameworks.sh): without them it skips, saying so,
unless MMT_REQUIRE_FRAMEWORKS=1 (CI), where that is a failure. The config side: tests/unit/test_llm_config.py.
"""

import csv
import importlib.util
import json
import os
import subprocess
import sys
from collections import Counter
from pathlib import Path
from typing import Dict, List

import pytest

from helpers.app import app_command, app_env, job_dirs, results, run_app
from helpers.elastic import lose_node, world_changes
from helpers.paths import REPO
from helpers.processes import from_a_terminal, wait_until

PY = sys.executable
MICRO_BLOCK = 65  # conf/model/micro.yaml: data_block_size


@pytest.fixture(scope="module", autouse=True)
def frameworks():
    missing = [name for name in ("litgpt", "litdata", "tokenizers") if importlib.util.find_spec(name) is None]
    if missing:
        why = f"{', '.join(missing)} not installed here (scripts/setup_frameworks.sh installs it)"
        if os.environ.get("MMT_REQUIRE_FRAMEWORKS") == "1":
            pytest.fail(f"MMT_REQUIRE_FRAMEWORKS=1 but {why}")
        pytest.skip(why)


@pytest.fixture(scope="module")
def cache(tmp_path_factory) -> Path:
    """A data cache with the micro model's dataset, built once for the module by the data step's own CLI (what a
    user runs before a big job)."""
    where = tmp_path_factory.mktemp("llm-cache")
    done = subprocess.run(
        [PY, "-m", "recipes.llm_data", "--cache-dir", str(where)], cwd=REPO, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return where


def _builds(cache_dir: Path) -> List[dict]:
    log = cache_dir / "prepared.jsonl"
    return [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []


def _dataset(cache_dir: Path) -> Path:
    [path] = [p for p in cache_dir.iterdir() if (p / "meta.json").exists()]
    return path


def _all_samples(dataset: Path) -> List[str]:
    """Every train sample's digest, read here in one process (no ranks)."""
    code = (
        "import sys; from pathlib import Path; from recipes.llm_data import samples, digest\n"
        f"print('\\n'.join(digest(s) for s in samples(Path({str(dataset / 'train')!r}), {MICRO_BLOCK})))\n"
    )
    env = {k: v for k, v in os.environ.items() if k not in ("WORLD_SIZE", "RANK", "GLOBAL_RANK", "NNODES")}
    done = subprocess.run([PY, "-c", code], cwd=REPO, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout.split()


def _reads(out: Path) -> Dict[int, List[dict]]:
    """What each rank's trace says it read: rank -> its records (epoch, step, samples), in order."""
    return {
        int(path.stem.removeprefix("rank")): [json.loads(line) for line in path.read_text().splitlines()]
        for path in sorted((out / "reads").glob("rank*.jsonl"))
    }


def test_micro_llm_two_by_two_reads_every_sample_once_per_epoch_and_the_loss_goes_down(cache, tmp_path, tag):
    done = run_app(
        "recipe=llm",
        "model=micro",
        "num_nodes=2",
        "devices=2",
        f"recipe.data.cache_dir={cache}",
        "recipe.epochs=1",
        "recipe.max_steps=1000",  # the epoch ends first: 2880 samples / (4 ranks x 8) = 90 steps
        "recipe.trace_reads=true",
        "recipe.peak_tflops=0.05",  # a CPU has no datasheet peak in the catalogue: given, so MFU is computed
        sweep_dir=tmp_path,
        tag=tag,
        timeout=180,
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    [result] = results(tmp_path)
    value = result["return_value"]
    assert value["world_size"] == 4 and value["micro_batch_size"] * value["grad_accum"] * 4 == 32
    assert value["epochs_done"] == 1 and value["steps"] == 90
    assert value["weights_in_sync"] and len(value["weight_digests"]) == 4
    assert value["train_loss_last"] < value["train_loss_first"] - 1.0, value
    assert len(_builds(cache)) == 1  # the job found the module's dataset: no second build

    # every sample of the epoch, each read by exactly one of the four ranks, once
    [job] = job_dirs(tmp_path)
    reads = _reads(job)
    assert sorted(reads) == [0, 1, 2, 3]
    per_rank = {rank: [s for record in records for s in record["samples"]] for rank, records in reads.items()}
    assert len({len(samples) for samples in per_rank.values()}) == 1  # the same share each: DDP steps together
    read = Counter(s for samples in per_rank.values() for s in samples)
    expected = Counter(_all_samples(_dataset(cache)))
    assert sum(expected.values()) == 2880
    assert read == expected

    # the figures, every step: tokens/s for the job and per device, MFU, the loader's wait
    with open(job / "metrics.csv") as handle:
        rows = list(csv.DictReader(handle))
    assert [int(row["step"]) for row in rows] == list(range(1, 91))
    for row in rows:
        assert float(row["tokens_per_s"]) == pytest.approx(4 * float(row["tokens_per_s_device"]), rel=1e-3)
        # 64 tokens x 8 sequences per device per step
        assert float(row["tokens_per_s_device"]) == pytest.approx(512 / float(row["step_s"]), rel=1e-2)
        assert 0 < float(row["mfu"]) < 1 and 0 <= float(row["data_wait_s"]) < float(row["step_s"])
        assert float(row["mfu"]) == pytest.approx(
            value["flops_per_sequence"] * 8 / float(row["step_s"]) / 0.05e12, rel=1e-2
        )
    assert value["flops_per_sequence"] > 0 and value["tokens_per_s"] > 0


# The recipe on 2 nodes x 1 rank (command mode, one process per rank), straight and stopped by the requeue flag
# mid-epoch and resumed in a new launch, as tests/e2e/test_lightning.py does for recipe=lm: the flag is raised at a
# chosen step through mmt.core.preemption (what SLURM's USR2 does in an mmt SLURM task); `scontrol requeue` itself is
# replaced, as there is no SLURM here.
_RESUME_SCRIPT = """
import itertools, json, os, sys
sys.path.insert(0, {repo!r})
import torch.distributed
from mmt.core import preemption
from recipes import llm

os.environ[preemption.MAX_REQUEUES_VAR] = "1"
preemption.install()
preemption.requeue = lambda: None
out, stop_after = sys.argv[1], int(sys.argv[2])
kw = dict(seed=3, accelerator="cpu", precision="32-true", strategy="ddp",
          model=dict(name="micro", litgpt_name="tiny-llama-1.1b", overrides=dict(block_size=64, vocab_size=512,
              padding_multiple=64, n_layer=2, n_head=4, n_query_groups=2, n_embd=64, intermediate_size=176)),
          data=dict(cache_dir={cache!r}, vocab_size=512, block_size=65), max_steps=14, lr=3e-3,
          weight_decay=0.1, warmup_steps=2, gradient_clip_val=1.0, checkpoint_every=0, fixed_buckets=True,
          trace_reads=True, batch_size=8, accumulate_grad_batches=2)
if stop_after:
    calls = itertools.count(1)
    preemption.requested = lambda: next(calls) >= stop_after   # asked once per step until it says yes
    try:
        llm.train(output_dir=out, **kw)
    except preemption.Requeued as stopped:
        print("STOPPED", stopped, flush=True)
        sys.exit(0)
    sys.exit("the run was not interrupted")
result = llm.train(output_dir=out, **kw)
if os.environ["RANK"] == "0":
    print("RESULT " + json.dumps(result), flush=True)
torch.distributed.destroy_process_group()
"""


def _resume_launch(tmp_path: Path, tag: str, cache: Path, name: str, stop_after: int) -> str:
    script = tmp_path / "resume_script.py"
    script.write_text(_RESUME_SCRIPT.format(repo=str(REPO), cache=str(cache)))
    done = run_app(
        "num_nodes=2",
        "devices=1",
        "command_mode=per_rank",
        f"command='{PY} {script} {tmp_path / name} {stop_after}'",
        sweep_dir=tmp_path / f"sweep-{name}-{stop_after}",
        tag=tag,
        timeout=120,
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    return done.stdout


def test_a_run_stopped_mid_epoch_resumes_to_the_uninterrupted_weights_and_reads(cache, tmp_path, tag):
    straight_out = _resume_launch(tmp_path, tag, cache, "straight", 0)
    stopped_out = _resume_launch(tmp_path, tag, cache, "requeued", 5)
    resumed_out = _resume_launch(tmp_path, tag, cache, "requeued", 0)

    def result(output: str) -> dict:
        [line] = [line for line in output.splitlines() if "] RESULT " in line]
        return json.loads(line.split("] RESULT ", 1)[1])

    straight, resumed = result(straight_out), result(resumed_out)
    # stopped at step 5 of an epoch of 2880 / (2 ranks x 8 x 2) = 90 steps: mid-epoch, checkpointed right there
    assert [line.rsplit(" ", 1)[1] for line in stopped_out.splitlines() if "] STOPPED " in line] == ["5"]
    assert resumed["resumed_from_checkpoint"] is True and straight["resumed_from_checkpoint"] is False
    assert resumed["steps"] == straight["steps"] == 14 and resumed["epochs_done"] == 0
    # bit for bit: the data order (the loader's state), AdamW's state, DDP's reduction order
    assert len(set(resumed["weight_digests"])) == 1
    assert resumed["weight_digests"] == straight["weight_digests"]
    assert resumed["val_loss"] == straight["val_loss"]
    # and each rank read the same samples in the same order, none twice and none skipped across the stop
    straight_reads, resumed_reads = _reads(tmp_path / "straight"), _reads(tmp_path / "requeued")
    assert [r["step"] for r in resumed_reads[0]] == [step for step in range(14) for _ in range(2)]
    assert resumed_reads == straight_reads


def _steps_done(job: Path) -> int:
    try:
        return len((job / "metrics.csv").read_text().splitlines()) - 1
    except FileNotFoundError:
        return 0


def test_an_elastic_micro_llm_that_loses_a_node_mid_epoch_reads_every_sample_of_the_epoch_once(cache, tmp_path, tag):
    """recipe=llm on num_nodes=2:3 x 2, LitData streaming: node 2 lost at step 24 of a 60-step epoch, the world of
    4 resumes from the step-20 checkpoint. LitData's loader state re-stripes the epoch's rest over the new world: the
    samples the checkpointed steps read, plus those the new world read, are the epoch's 2880, each once."""
    launcher = subprocess.Popen(
        app_command(
            "recipe=llm", "model=micro", "num_nodes=2:3", "devices=2", "batch.global_size=48",
            f"recipe.data.cache_dir={cache}", "recipe.epochs=1", "recipe.max_steps=1000",
            "recipe.checkpoint_every=10", "recipe.trace_reads=true", sweep_dir=tmp_path,
        ),
        cwd=REPO, env=app_env(tag), preexec_fn=from_a_terminal, stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    job = tmp_path / "0"
    wait_until(lambda: _steps_done(job) >= 24, 240, "step 24 (after the step-20 checkpoint)")
    lose_node(job, 2)
    out, _ = launcher.communicate(timeout=300)
    assert launcher.returncode == 0, out[-3000:]
    [result] = results(tmp_path)
    value = result["return_value"]
    # 2880 samples / 48 per step: the epoch is 60 steps, in either world
    assert value["epochs_done"] == 1 and value["steps"] == 60 and value["world_size"] == 4
    assert value["resumed_from_checkpoint"] is True and value["micro_batch_size"] * value["grad_accum"] == 12
    assert value["weights_in_sync"] and len(set(value["weight_digests"])) == 1
    [change] = world_changes(job)
    assert (change["lost"], change["world_before"], change["world_after"]) == ([2], 6, 4)
    assert change["training_at"] is not None  # the recipe's heartbeat marks the new world's first step

    # the reads: world 0's steps up to the checkpoint the new world resumed from, then the new world's
    by_world: Dict[int, List[dict]] = {}
    for records in _reads(job).values():
        for record in records:
            by_world.setdefault(record.get("world", 0), []).append(record)
    resumed_at = min(record["step"] for record in by_world[1])
    assert resumed_at == 20
    kept = [record for record in by_world[0] if record["step"] < resumed_at] + by_world[1]
    read = Counter(sample for record in kept for sample in record["samples"])
    expected = Counter(_all_samples(_dataset(cache)))
    assert sum(expected.values()) == 2880 and read == expected
    # and the lost world read past its checkpoint (what the new world read again: training lost, not data)
    assert max(record["step"] for record in by_world[0]) >= 24


def test_a_sweep_of_four_jobs_runs_the_data_step_once(tmp_path, tag):
    # an empty cache; the four 1-rank jobs run at once (max_parallel_ranks defaults to 4) and race to build it
    cache = tmp_path / "cache"
    done = run_app(
        "recipe=llm",
        "model=micro",
        "num_nodes=1",
        "devices=1",
        "recipe.lr=1e-3,2e-3,3e-3,4e-3",
        "recipe.max_steps=3",
        f"recipe.data.cache_dir={cache}",
        sweep_dir=tmp_path / "sweep",
        tag=tag,
        timeout=240,
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    jobs = results(tmp_path / "sweep")
    assert [r["status"] for r in jobs] == ["COMPLETED"] * 4
    assert max(r["started_at"] for r in jobs) < min(r["ended_at"] for r in jobs)  # they ran at once: a race
    [build] = _builds(cache)  # one build for the four jobs, by one of them
    assert build["job_dir"] in {str(job) for job in job_dirs(tmp_path / "sweep")}
    assert [p.name for p in cache.iterdir() if p.name.startswith(".") and "tmp" in p.name] == []
    assert {r["return_value"]["steps"] for r in results(tmp_path / "sweep")} == {3}


def test_micro_llm_trains_on_slurm_with_the_data_prepared_once_inside_the_allocation(slurm_cluster, tmp_path, tag):
    cache = tmp_path / "cache"  # empty: rank 0 builds it inside the job while rank 1 waits at the barrier
    done = run_app(
        "cluster=slurm",
        "recipe=llm",
        "model=micro",
        "num_nodes=2",
        "devices=1",
        "recipe.max_steps=12",
        f"recipe.data.cache_dir={cache}",
        "hydra.launcher.timeout_min=5",
        sweep_dir=tmp_path / "sweep",
        tag=tag,
        timeout=300,
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    [result] = results(tmp_path / "sweep")
    value = result["return_value"]
    assert result["status"] == "COMPLETED" and value["world_size"] == 2 and value["steps"] == 12
    assert value["weights_in_sync"] and value["train_loss_last"] < value["train_loss_first"]
    [build] = _builds(cache)
    assert build["job_dir"] == str(job_dirs(tmp_path / "sweep")[0])


def test_tiny_llama_runs_a_few_steps_on_one_gpu_and_records_its_mfu(tmp_path, tag):
    import torch

    if not torch.cuda.is_available():
        pytest.skip("no CUDA GPU on this host: the TinyLlama 1.1B config needs one (it runs where a device is lent)")
    from recipes.llm_config import CHIPS

    name = torch.cuda.get_device_name(0).lower()
    gpu = next((g for g, c in CHIPS.items() if c and c.split()[0] in name), None)
    machine = {"A100": "a100", "H100": "h100", "H200": "h200", "L4": "l4", "L40S": "l40s", "A10G": "a10g"}.get(gpu)
    if machine is None:
        pytest.skip(f"{name}: no machine in the catalogue with its peak FLOPs")
    done = run_app(
        "recipe=llm",
        "model=tiny-llama-1.1b",
        f"machine={machine}",
        "devices=1",
        "batch.global_size=4",
        "recipe.max_steps=4",
        "recipe.checkpoint_every=0",
        f"recipe.data.cache_dir={tmp_path / 'cache'}",
        sweep_dir=tmp_path / "sweep",
        tag=tag,
        timeout=600,
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    [result] = results(tmp_path / "sweep")
    value = result["return_value"]
    assert value["steps"] == 4 and 0 < value["mfu"] < 1, value
    [job] = job_dirs(tmp_path / "sweep")
    with open(job / "metrics.csv") as handle:
        assert all(0 < float(row["mfu"]) < 1 for row in csv.DictReader(handle))


@pytest.mark.parametrize("harm", ["truncated", "missing"])
def test_a_damaged_cache_is_rebuilt_before_any_rank_trains(tmp_path, tag, harm):
    """A chunk cut to a third of its size (a disk that filled mid-copy), or gone (a partial rsync): the cache key
    still matches, so without a check LitData would wait for the missing bytes as for a hung download."""
    cache = tmp_path / "cache"
    done = subprocess.run(
        [PY, "-m", "recipes.llm_data", "--cache-dir", str(cache)], cwd=REPO, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr[-3000:]
    chunk = _dataset(cache) / "train" / "chunk-0-0.bin"
    if harm == "truncated":
        chunk.write_bytes(chunk.read_bytes()[: chunk.stat().st_size // 3])
    else:
        chunk.unlink()
    run = run_app(
        "recipe=llm",
        "model=micro",
        "num_nodes=1",
        "devices=2",
        f"recipe.data.cache_dir={cache}",
        "recipe.max_steps=3",
        sweep_dir=tmp_path / "sweep",
        tag=tag,
        timeout=180,
    )
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-3000:]
    [result] = results(tmp_path / "sweep")
    assert result["status"] == "COMPLETED" and result["return_value"]["steps"] == 3
    assert len(_builds(cache)) == 2  # built again, under the same lock, before training
    assert chunk.exists() and chunk.stat().st_size > 0
    [aside] = list(cache.glob(".*.damaged-*"))  # the damaged copy is kept out of the way, named
    assert (aside / "train" / "index.json").exists()
