"""Submit-to-result time of a probe job on the local SLURM cluster: mmt against hydra-submitit-launcher.

    (a) mmt:      python train.py -m cluster=slurm recipe=probe num_nodes=2 devices=M
                  (one task per node: its agent imports torch once and forks the node's M ranks)
    (b) submitit: hydra-submitit-launcher's submitit_slurm, nodes=2 tasks_per_node=M, the same probe
                  (one task per rank, each importing torch on its own), its other settings at their defaults

Both are timed from the command's start to its exit (compose, sbatch, scheduling, the ranks, result back), the
variants alternate within each round, and the medians of ``--rounds`` rounds are compared as a ratio; mmt runs
with its own defaults too. ``--per-node 1,2,4`` repeats it for each number of ranks per node, to show how the cost
grows with them.

    scripts/slurm_cluster.sh start && eval "$(scripts/slurm_cluster.sh env)"
    python benchmarks/bench_slurm.py --rounds 5                    # 2 nodes x 2
    python benchmarks/bench_slurm.py --rounds 3 --per-node 1,2,4
"""

import argparse
import json
import os
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Callable, Dict

from _timing import alternate, report, run

REPO = Path(__file__).resolve().parents[1]
PY = sys.executable


def _env() -> Dict[str, str]:
    return dict(os.environ, PYTHONPATH=str(REPO), OMP_NUM_THREADS="1")


def variants(per_node: int) -> Dict[str, Callable[[Path], None]]:
    def mmt(scratch: Path) -> None:
        run(
            [
                PY,
                "train.py",
                "-m",
                "cluster=slurm",
                "recipe=probe",
                "num_nodes=2",
                f"devices={per_node}",
                f"hydra.sweep.dir={scratch}/mmt",
            ],
            cwd=REPO,
            env=_env(),
        )

    def submitit(scratch: Path) -> None:
        run(
            [
                PY,
                "benchmarks/submitit_probe_app.py",
                "-m",
                "hydra/launcher=submitit_slurm",
                "hydra.launcher.nodes=2",
                f"hydra.launcher.tasks_per_node={per_node}",
                f"hydra.sweep.dir={scratch}/submitit",
            ],
            cwd=REPO,
            env=_env(),
        )

    return {f"a_mmt_slurm_2x{per_node}": mmt, f"b_submitit_slurm_2x{per_node}": submitit}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--per-node", default="2", help="ranks per node, comma-separated (e.g. 1,2,4)")
    parser.add_argument("--json", type=Path, help="also write the figures here")
    args = parser.parse_args()
    if shutil.which("sbatch") is None or "SLURM_CONF" not in os.environ and not Path("/etc/slurm/slurm.conf").exists():
        sys.exit('no SLURM cluster: scripts/slurm_cluster.sh start && eval "$(scripts/slurm_cluster.sh env)"')
    figures = {}
    for per_node in [int(n) for n in args.per_node.split(",")]:
        scratch = Path(tempfile.mkdtemp(prefix="mmt-bench-slurm-"))
        try:
            times = alternate(variants(per_node), args.rounds, scratch)
        finally:
            shutil.rmtree(scratch, ignore_errors=True)
        a, b = list(times)
        figures[f"2x{per_node}"] = report(times, {f"mmt/submitit_slurm 2x{per_node}": (a, b)}, None, rounds=args.rounds)
    if args.json:
        args.json.write_text(json.dumps(figures, indent=2))


if __name__ == "__main__":
    main()
