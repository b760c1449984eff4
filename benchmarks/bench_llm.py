"""recipe=llm, measured: prints the figures for docs/llm.md (a script, not a timed test).

1. tokens/s of ``recipe=llm model=micro`` on a 2 x 2 job (compiled with ``recipe.compile=true``, as litgpt compiles,
   and eager, the recipe's default) against litgpt's own pretraining loop
   (``litgpt.pretrain.main``: its model setup with ``torch.compile``, its LitData loader, its loop and its
   ThroughputMonitor) on the same model config, the same dataset dir and the same global and micro batch, also 2 x 2
   through mmt, alternating, ``--rounds`` times each. ``litgpt pretrain`` itself cannot run this job on CPU: with
   more than one device it always picks FSDP, which Lightning runs only on GPUs, so the driver below hands litgpt's
   ``main`` a DDP Fabric instead (everything after that is litgpt's). Both figures: the median over the steps after
   the 10th of the job's tokens/s (ours per step; litgpt's over its 5-step window).
2. the data loader's wait per step, LitData streaming (the recipe's loader) against an in-memory loader (a plain
   DataLoader over the same samples, already in a tensor), one process, the micro config's batch.

    python benchmarks/bench_llm.py                     # both parts, 2 rounds
    python benchmarks/bench_llm.py --part loader
"""

import argparse
import csv
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Dict, List

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from recipes.llm_config import DataSpec  # noqa: E402

MICRO = dict(  # conf/model/micro.yaml's overrides
    name="micro",
    block_size=64,
    vocab_size=512,
    padding_multiple=64,
    n_layer=2,
    n_head=4,
    n_query_groups=2,
    n_embd=64,
    intermediate_size=176,
)
GLOBAL, MICRO_BATCH, LR = 32, 8, 3e-3

# litgpt's pretraining, per rank (mmt's command mode per_rank gives each process its place)
LITGPT_DRIVER = """
import os, sys
from pathlib import Path
import lightning as L
from lightning.fabric.loggers import CSVLogger
from lightning.fabric.strategies import DDPStrategy
from litgpt import pretrain
from litgpt.args import EvalArgs, TrainArgs
from litgpt.config import Config, name_to_config
from litgpt.data import LitData

data_path, out_dir, steps = sys.argv[1], Path(sys.argv[2]), int(sys.argv[3])
# litgpt's final save_checkpoint re-parses sys.argv as `litgpt pretrain`'s command line: give it that line
sys.argv = [sys.argv[0], "micro"]
nodes, devices = int(os.environ["NUM_NODES"]), int(os.environ["LOCAL_WORLD_SIZE"])
config = Config(**{{**name_to_config["tiny-llama-1.1b"], **{micro!r}}})
fabric = L.Fabric(accelerator="cpu", num_nodes=nodes, devices=devices, strategy=DDPStrategy(), precision="32-true",
                  loggers=[CSVLogger(str(out_dir), name="", version="", flush_logs_every_n_steps=1)])
fabric.launch()
pretrain.main(
    fabric=fabric, devices=devices, num_nodes=nodes, seed=42, initial_checkpoint_dir=None, resume=False,
    config=config, data=LitData(data_path=data_path, split_names=("train", "val"), num_workers=0),
    out_dir=out_dir, tokenizer_dir=None, tokenizer=None,
    train=TrainArgs(save_interval=None, log_interval=1, global_batch_size={global_}, micro_batch_size={micro_batch},
                    max_tokens=steps * {global_} * 64, max_norm=1.0, min_lr={lr} / 10, lr_warmup_steps=5,
                    tie_embeddings=False),
    eval=EvalArgs(interval=10**6, max_iters=2, initial_validation=False, final_validation=False),
    optimizer={{"class_path": "torch.optim.AdamW",
               "init_args": {{"lr": {lr}, "weight_decay": 0.1, "betas": [0.9, 0.95]}}}},
)
"""


def _run(args: List[str], timeout: float = 900) -> subprocess.CompletedProcess:
    done = subprocess.run([sys.executable, *args], cwd=REPO, capture_output=True, text=True, timeout=timeout)
    if done.returncode != 0:
        raise SystemExit(f"failed: {' '.join(args)}\n{done.stdout[-2000:]}{done.stderr[-3000:]}")
    return done


def _median_after(path: Path, column: str, skip: int = 10) -> float:
    with open(path) as handle:
        values = [float(row[column]) for row in csv.DictReader(handle) if row.get(column)]
    return statistics.median(values[skip:])


def _ours(cache: Path, sweep: Path, steps: int, compile: bool) -> float:
    _run(
        [
            "train.py",
            "-m",
            "recipe=llm",
            "model=micro",
            "num_nodes=2",
            "devices=2",
            f"recipe.compile={str(compile).lower()}",
            f"recipe.max_steps={steps}",
            "recipe.checkpoint_every=0",
            f"recipe.data.cache_dir={cache}",
            f"hydra.sweep.dir={sweep}",
        ]
    )
    return _median_after(sweep / "0" / "metrics.csv", "tokens_per_s")


def _litgpt(dataset: Path, sweep: Path, steps: int) -> float:
    script = sweep.parent / "litgpt_driver.py"
    script.write_text(LITGPT_DRIVER.format(micro=MICRO, global_=GLOBAL, micro_batch=MICRO_BATCH, lr=LR))
    out = sweep.parent / f"{sweep.name}-out"
    _run(
        [
            "train.py",
            "-m",
            "num_nodes=2",
            "devices=2",
            "command_mode=per_rank",
            f"command='{sys.executable} {script} {dataset} {out} {steps}'",
            f"hydra.sweep.dir={sweep}",
        ]
    )
    [metrics] = out.rglob("metrics.csv")  # Lightning's CSVLogger picks the dir under out
    return _median_after(metrics, "items_per_sec")  # items = tokens; the job's, over 5 steps


def bench_throughput(rounds: int, steps: int, scratch: Path) -> Dict[str, List[float]]:
    from recipes.llm_data import prepare

    cache = scratch / "cache"
    dataset = prepare(DataSpec(str(cache), 512, 65))
    variants = {
        "mmt recipe=llm compile": lambda r: _ours(cache, scratch / f"ours-compiled{r}", steps, True),
        "mmt recipe=llm eager": lambda r: _ours(cache, scratch / f"ours{r}", steps, False),
        "litgpt pretrain loop": lambda r: _litgpt(dataset, scratch / f"litgpt{r}", steps),
    }
    rates: Dict[str, List[float]] = {name: [] for name in variants}
    names = list(variants)
    for round_ in range(rounds):
        for name in names[round_ % 3 :] + names[: round_ % 3]:  # none always first
            rates[name].append(variants[name](round_))
        print(f"  round {round_ + 1}/{rounds}: " + ", ".join(f"{k} {v[-1]:.0f}" for k, v in rates.items()), flush=True)
    medians = {name: statistics.median(values) for name, values in rates.items()}
    print(f"\nmicro config, 2 x 2 (local backend, gloo, CPU), global batch {GLOBAL} x 64 tokens, job tokens/s:")
    for name, values in rates.items():
        print(f"  {name:<24} median {medians[name]:8.0f}  (runs: {', '.join(f'{v:.0f}' for v in values)})")
    theirs = medians["litgpt pretrain loop"]
    print(
        f"  mmt / litgpt = {medians['mmt recipe=llm compile'] / theirs:.3f} compiled as litgpt is, "
        f"{medians['mmt recipe=llm eager'] / theirs:.3f} eager  (n={rounds})"
    )
    return rates


def bench_loader(batches: int, scratch: Path) -> Dict[str, float]:
    """Seconds a step waits for its batch: LitData's StreamingDataLoader over the chunks vs a DataLoader over the
    same samples in memory (one process, no workers, as the recipe's default)."""
    import torch
    from litdata import StreamingDataLoader, StreamingDataset, TokensLoader

    from recipes.llm_data import prepare

    dataset = prepare(DataSpec(str(scratch / "cache"), 512, 65)) / "train"
    streaming = StreamingDataLoader(
        StreamingDataset(str(dataset), item_loader=TokensLoader(block_size=65), shuffle=True, seed=1),
        batch_size=MICRO_BATCH,
    )
    in_memory_set = torch.stack([sample for sample in StreamingDataset(str(dataset), item_loader=TokensLoader(65))])
    in_memory: Any = torch.utils.data.DataLoader(in_memory_set, batch_size=MICRO_BATCH, shuffle=True)  # type: ignore[arg-type]
    waits: Dict[str, float] = {}
    for name, loader in (("litdata streaming", streaming), ("in-memory tensor", in_memory)):
        times: List[float] = []
        while len(times) < batches:
            iterator = iter(loader)
            while len(times) < batches:
                started = time.perf_counter()
                if next(iterator, None) is None:
                    break
                times.append(time.perf_counter() - started)
        waits[name] = statistics.median(times[1:])
    print(f"\ndata-loader wait per batch of {MICRO_BATCH} x 65 tokens (median of {batches}, one process):")
    for name, seconds in waits.items():
        print(f"  {name:<18} {seconds * 1e6:8.1f} us")
    print(f"  litdata / in-memory = {waits['litdata streaming'] / waits['in-memory tensor']:.2f}")
    return waits


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--part", choices=("all", "throughput", "loader"), default="all")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--json", type=Path, help="also write the figures here")
    parser.add_argument("--keep", type=Path, help="run in this dir and keep it (the jobs' logs), not a temp dir")
    args = parser.parse_args()
    figures: Dict[str, object] = {}
    with tempfile.TemporaryDirectory(prefix="bench-llm-") as temp:
        scratch = args.keep or Path(temp)
        scratch.mkdir(parents=True, exist_ok=True)
        if args.part in ("all", "loader"):
            figures["loader_wait_s"] = bench_loader(2000, scratch)
        if args.part in ("all", "throughput"):
            figures["tokens_per_s"] = bench_throughput(args.rounds, args.steps, scratch)
    if args.json:
        args.json.write_text(json.dumps(figures, indent=1))


if __name__ == "__main__":
    main()
