"""Recipes and tuner, measured: prints medians and ratios (a script, not a timed test).

1. samples/s of the Trainer (``lm``), Fabric (``lm_fabric``) and raw PyTorch (``lm_torch``) recipes on the same
   2 x 2 job (same model, data, global batch and micro-batch), ``--repeats`` sweeps of the three in one launcher
   run each, jobs one at a time, their order rotated; the medians, and Trainer / raw PyTorch as a ratio.
2. the tuner's chosen micro-batch against the fastest candidate of an exhaustive sweep over the same range
   (every micro-batch from 1 up to the first that does not fit), both under the same memory budget.

    python benchmarks/bench_recipes.py                          # both parts
    python benchmarks/bench_recipes.py --part recipes --repeats 5
    python benchmarks/bench_recipes.py --part tuner --budget-gb 1 --max-micro 128
"""

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Dict, List

import yaml

REPO = Path(__file__).resolve().parents[1]
RECIPES = ("lm", "lm_fabric", "lm_torch")


def _run(args: List[str], timeout: float) -> subprocess.CompletedProcess:
    done = subprocess.run([sys.executable, *args], cwd=REPO, capture_output=True, text=True, timeout=timeout)
    if done.returncode != 0:
        raise SystemExit(f"failed: {' '.join(args)}\n{done.stderr[-3000:]}")
    return done


def bench_recipes(repeats: int, extra: List[str], scratch: Path) -> None:
    rates: Dict[str, List[float]] = {name: [] for name in RECIPES}
    durations: Dict[str, List[float]] = {name: [] for name in RECIPES}
    for repeat in range(repeats):
        order = RECIPES[repeat % 3 :] + RECIPES[: repeat % 3]  # no recipe always runs first (cold caches)
        sweep = scratch / f"recipes{repeat}"
        _run(
            [
                "train.py",
                "-m",
                f"recipe={','.join(order)}",
                "num_nodes=2",
                "devices=2",
                "hydra.launcher.max_parallel_ranks=4",
                f"hydra.sweep.dir={sweep}",
                *extra,
            ],
            timeout=1800,
        )
        for result in (json.loads(p.read_text()) for p in sweep.glob("*/result.json")):
            name = result["overrides"][0].split("=", 1)[1]
            rates[name].append(result["return_value"]["samples_per_s"])
            durations[name].append(result["duration_s"])
        print(f"  sweep {repeat + 1}/{repeats}: " + ", ".join(f"{n} {rates[n][-1]:.1f}" for n in RECIPES), flush=True)
    medians = {name: statistics.median(values) for name, values in rates.items()}
    print("\nrecipes on one 2 x 2 job (local backend, gloo, CPU), samples/s inside the training steps:")
    print(f"  {'recipe':<10} {'median':>8} {'min':>8} {'max':>8} {'job wall s (median)':>21}")
    for name in RECIPES:
        print(
            f"  {name:<10} {medians[name]:8.1f} {min(rates[name]):8.1f} {max(rates[name]):8.1f} "
            f"{statistics.median(durations[name]):21.1f}"
        )
    print(
        f"  Trainer / raw PyTorch = {medians['lm'] / medians['lm_torch']:.3f}; "
        f"Fabric / raw PyTorch = {medians['lm_fabric'] / medians['lm_torch']:.3f}  (n={repeats})"
    )


def _tune(recipe: str, mode: str, budget_gb: float, max_micro: int, scratch: Path) -> dict:
    table = scratch / f"{mode}.yaml"
    _run(
        [
            "tune.py",
            f"recipe={recipe}",
            f"tune.mode={mode}",
            f"tune.budget_gb={budget_gb}",
            f"tune.max_micro={max_micro}",
            f"tune.table={table}",
            f"hydra.run.dir={scratch / mode}",
        ],
        timeout=7200,
    )
    [entry] = yaml.safe_load(table.read_text())["entries"]
    return entry


def bench_tuner(recipe: str, budget_gb: float, max_micro: int, scratch: Path) -> None:
    searched = _tune(recipe, "search", budget_gb, max_micro, scratch)
    print(
        f"  search: {searched['search']['trials']} trials, {searched['search']['seconds']:.0f} s of trials; "
        f"largest fit {searched['max_fit']}, chose {searched['micro_batch']}",
        flush=True,
    )
    swept = _tune(recipe, "sweep", budget_gb, max_micro, scratch)
    rates = {int(m): r for m, r in swept["candidates"].items() if isinstance(r, (int, float))}
    cap = swept["margin_cap"]
    fastest = max((m for m in rates if m <= cap), key=lambda m: rates[m])
    chosen = searched["micro_batch"]
    print(
        f"\ntuner vs exhaustive sweep: recipe {recipe}, {budget_gb:g} GiB per device (RLIMIT_DATA), "
        f"candidates 1..{max_micro}"
    )
    print(f"  largest fit:      search {searched['max_fit']}, sweep {swept['max_fit']}")
    print(
        f"  trials:           search {searched['search']['trials']} ({searched['search']['seconds']:.0f} s), "
        f"sweep {swept['search']['trials']} ({swept['search']['seconds']:.0f} s)"
    )
    print(
        f"  chosen:           search {chosen} ({searched['samples_per_s']:.1f} samples/s when searched); "
        f"sweep's fastest below its margin cap {cap}: {fastest} ({rates[fastest]:.1f} samples/s)"
    )
    if chosen in rates:
        print(
            f"  the sweep measured the search's choice at {rates[chosen]:.1f} samples/s = "
            f"{rates[chosen] / rates[fastest]:.3f} x its fastest"
        )
    top = sorted(rates.items(), key=lambda kv: -kv[1])[:5]
    print("  sweep's five fastest: " + ", ".join(f"{m}: {r:.1f}" for m, r in top))
    # one short trial is noisy: compare on the sweep's curve smoothed over each candidate's +-2 neighbours
    smooth = {m: statistics.median(rates[n] for n in range(m - 2, m + 3) if n in rates) for m in rates}
    best = max((m for m in smooth if m <= cap), key=lambda m: smooth[m])
    if chosen in smooth:
        print(
            f"  on the smoothed sweep (median of 5 neighbours): the choice {chosen} {smooth[chosen]:.1f}, the "
            f"fastest {best} {smooth[best]:.1f} samples/s: {smooth[chosen] / smooth[best]:.3f} x"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--part", choices=("all", "recipes", "tuner"), default="all")
    parser.add_argument("--repeats", type=int, default=3, help="sweeps of the three recipes")
    parser.add_argument("--recipe", default="lm", help="the recipe the tuner part tunes")
    parser.add_argument("--budget-gb", type=float, default=1.0, help="memory per device for the tuner part")
    parser.add_argument("--max-micro", type=int, default=128, help="the largest candidate of the tuner part")
    parser.add_argument("overrides", nargs="*", help="extra train.py overrides for the recipes part")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="mmt-bench-") as scratch:
        if args.part in ("all", "recipes"):
            bench_recipes(args.repeats, args.overrides, Path(scratch))
        if args.part in ("all", "tuner"):
            bench_tuner(args.recipe, args.budget_gb, args.max_micro, Path(scratch))


if __name__ == "__main__":
    main()
