"""The scale curve on SLURM: what a job of N nodes costs against what SLURM itself costs for N nodes.

At each size N (``--sizes``, default 4,16,64), alternating within a round, medians of ``--rounds``:

    (a) mmt, a torch-free command, 1 task per node: python train.py -m cluster=slurm num_nodes=N command=hostname
    (b) its floor, the same command:                srun -N N --ntasks-per-node=1 hostname
    (c) mmt, the probe, 1 rank per node:             python train.py -m cluster=slurm recipe=probe num_nodes=N
    (d) its floor, one torch import per node:        srun -N N --ntasks-per-node=1 python -c "import torch"

The probe runs at its own sizes (``--probe-sizes``, default 4,8,16): each of its nodes imports torch, and 64 imports
at once take this 2-core host 70-100 s a run (245 s cold; 10 GB at the peak): ``--probe-sizes 64`` runs it there.
The cluster must have at least the largest N nodes (``MMT_SLURM_NODES=64 scripts/slurm_cluster.sh start``); every
size runs on that one cluster (a small job costs the same on a big cluster: bench_slurm.py --other-cluster). The
report gives each ratio, and the slope per added node (least squares over the sizes) of mmt and of the floor;
``--plot`` draws the curve (matplotlib).

    python benchmarks/bench_scale.py --rounds 5 --json scale.json --plot docs/img/scale_curve.png
"""

import argparse
import json
import os
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Callable, Dict, Sequence, Tuple

from _timing import alternate, report, run, slurm_idle

REPO = Path(__file__).resolve().parents[1]
PY = sys.executable
COMMAND = "hostname"  # a real program on every node; `true` would be read by Hydra as a boolean


def _env() -> Dict[str, str]:
    return dict(os.environ, OMP_NUM_THREADS="1")


def _mmt(nodes: int, *job: str) -> Callable[[Path], None]:
    def one(scratch: Path) -> None:
        sweep = tempfile.mkdtemp(prefix="mmt", dir=scratch)
        args = [PY, "train.py", "-m", "cluster=slurm", f"num_nodes={nodes}", "devices=1", *job]
        run([*args, f"hydra.sweep.dir={sweep}"], cwd=REPO, env=_env())

    return one


def _srun(nodes: int, *command: str) -> Callable[[Path], None]:
    def one(scratch: Path) -> None:
        run(["srun", f"-N{nodes}", "--ntasks-per-node=1", *command], cwd=scratch, env=_env())

    return one


def variants(
    nodes: int, command: bool, probe: bool
) -> Tuple[Dict[str, Callable[[Path], None]], Dict[str, Tuple[str, str]]]:
    found: Dict[str, Callable[[Path], None]] = {}
    ratios: Dict[str, Tuple[str, str]] = {}
    if command:
        found[f"a_mmt_command_{nodes}"] = _mmt(nodes, f"command={COMMAND}")
        found[f"b_floor_command_{nodes}"] = _srun(nodes, COMMAND)
        ratios[f"command/floor {nodes}"] = (f"a_mmt_command_{nodes}", f"b_floor_command_{nodes}")
    if probe:
        found[f"c_mmt_probe_{nodes}"] = _mmt(nodes, "recipe=probe")
        found[f"d_floor_torch_{nodes}"] = _srun(nodes, PY, "-c", "import torch")
        ratios[f"probe/floor {nodes}"] = (f"c_mmt_probe_{nodes}", f"d_floor_torch_{nodes}")
    return found, ratios


def slope(sizes: Sequence[int], seconds: Sequence[float]) -> float:
    """Seconds per added node: the least-squares line through (size, seconds)."""
    mean_x, mean_y = sum(sizes) / len(sizes), sum(seconds) / len(seconds)
    spread = sum((x - mean_x) ** 2 for x in sizes)
    return sum((x - mean_x) * (y - mean_y) for x, y in zip(sizes, seconds)) / spread if spread else 0.0


def plot(curve: Dict[str, Dict[int, float]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    labels = {
        "a_mmt_command": "mmt, command (1 task/node)",
        "b_floor_command": "floor: srun -N n hostname",
        "c_mmt_probe": "mmt, probe (1 rank/node)",
        "d_floor_torch": 'floor: srun -N n python -c "import torch"',
    }
    styles = {"a_mmt_command": "o-", "b_floor_command": "o--", "c_mmt_probe": "s-", "d_floor_torch": "s--"}
    figure, axes = plt.subplots(figsize=(7, 4.2))
    for key, label in labels.items():
        if key in curve:
            sizes = sorted(curve[key])
            axes.plot(sizes, [curve[key][n] for n in sizes], styles[key], label=label)
    ticks = sorted({n for series in curve.values() for n in series})
    axes.set_xlabel("nodes (simulated, one 2-core host)")
    axes.set_ylabel("seconds, submit to exit (median)")
    axes.set_xscale("log", base=2)
    axes.set_xticks(ticks, [str(n) for n in ticks])
    axes.grid(True, alpha=0.3)
    axes.legend(fontsize=8)
    axes.set_title("mmt on SLURM against the floor, by job size")
    figure.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=110)
    plt.close(figure)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--sizes", default="4,16,64", help="nodes per job of the command job, comma-separated")
    parser.add_argument(
        "--probe-sizes",
        default="4,8,16",
        help="nodes per job of the probe (each node imports torch: 64 at once take this 2-core host 70-100 s)",
    )
    parser.add_argument("--json", type=Path, help="also write the figures here")
    parser.add_argument("--plot", type=Path, help="draw the curve here (PNG)")
    args = parser.parse_args()
    if shutil.which("sbatch") is None:
        sys.exit('no SLURM cluster: MMT_SLURM_NODES=64 scripts/slurm_cluster.sh start && eval "$(... env)"')
    sizes = [int(n) for n in args.sizes.split(",") if n]
    probe_sizes = [int(n) for n in args.probe_sizes.split(",") if n]
    figures: Dict[str, object] = {}
    curve: Dict[str, Dict[int, float]] = {}
    for nodes in sorted(set(sizes) | set(probe_sizes)):
        scratch = Path(tempfile.mkdtemp(prefix="mmt-bench-scale-"))
        try:
            found, ratios = variants(nodes, nodes in sizes, nodes in probe_sizes)
            times = alternate(found, args.rounds, scratch, settle=slurm_idle)
        finally:
            shutil.rmtree(scratch, ignore_errors=True)
        result = report(times, ratios, None, rounds=args.rounds, nodes=nodes)
        figures[str(nodes)] = result
        medians = result["median_s"]
        assert isinstance(medians, dict)
        for name, median in medians.items():
            curve.setdefault(name.rsplit("_", 1)[0], {})[nodes] = median
    slopes = {
        name: round(slope(sorted(series), [series[n] for n in sorted(series)]), 4) for name, series in curve.items()
    }
    print("seconds per added node  " + "  ".join(f"{name} = {value:.4f}" for name, value in slopes.items()))
    figures["slope_s_per_node"] = slopes
    if args.json:
        args.json.write_text(json.dumps(figures, indent=2))
    if args.plot:
        plot(curve, args.plot)


if __name__ == "__main__":
    main()
