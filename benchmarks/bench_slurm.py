"""Submit-to-result time of a 2 nodes x 2 tasks probe job on the local SLURM cluster, mmt against submitit_slurm.

    (a) mmt:      python train.py -m cluster=slurm recipe=probe num_nodes=2 devices=2
    (b) submitit: hydra-submitit-launcher's submitit_slurm, nodes=2 tasks_per_node=2, the same probe

Both are timed from the command's start to its exit (compose, sbatch, scheduling, 4 ranks, result back), the
variants alternate within each round, and the medians of ``--rounds`` rounds are compared as a ratio.

    scripts/slurm_cluster.sh start && eval "$(scripts/slurm_cluster.sh env)"
    python benchmarks/bench_slurm.py --rounds 5
"""

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Callable, Dict

from _timing import alternate

REPO = Path(__file__).resolve().parents[1]
PY = sys.executable


def _env() -> Dict[str, str]:
    return dict(os.environ, PYTHONPATH=str(REPO), OMP_NUM_THREADS="1")


def run_mmt(scratch: Path) -> None:
    subprocess.run([PY, "train.py", "-m", "cluster=slurm", "recipe=probe", "num_nodes=2", "devices=2",
                    "hydra.launcher.poll_interval_s=0.5", f"hydra.sweep.dir={scratch}/mmt"], cwd=REPO, env=_env(),
                   check=True, capture_output=True)


def run_submitit(scratch: Path) -> None:
    subprocess.run([PY, "benchmarks/submitit_probe_app.py", "-m", "hydra/launcher=submitit_slurm",
                    "hydra.launcher.nodes=2", "hydra.launcher.tasks_per_node=2", "hydra.launcher.cpus_per_task=2",
                    "hydra.launcher.timeout_min=5", f"hydra.sweep.dir={scratch}/submitit"], cwd=REPO, env=_env(),
                   check=True, capture_output=True)


VARIANTS: Dict[str, Callable[[Path], None]] = {"a_mmt_slurm": run_mmt, "b_submitit_slurm": run_submitit}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--json", type=Path, help="also write the figures here")
    args = parser.parse_args()
    if shutil.which("sbatch") is None or "SLURM_CONF" not in os.environ and not Path("/etc/slurm/slurm.conf").exists():
        sys.exit("no SLURM cluster: scripts/slurm_cluster.sh start && eval \"$(scripts/slurm_cluster.sh env)\"")
    scratch = Path(tempfile.mkdtemp(prefix="mmt-bench-slurm-", dir=REPO / "outputs" if (REPO / "outputs").exists()
                                    else None))
    try:
        times = alternate(VARIANTS, args.rounds, scratch)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    medians = {name: statistics.median(values) for name, values in times.items()}
    ratio = medians["a_mmt_slurm"] / medians["b_submitit_slurm"]
    for name, median in medians.items():
        print(f"{name:18s} median {median:6.2f} s   runs {', '.join(f'{x:.2f}' for x in times[name])}")
    print(f"ratio  mmt/submitit_slurm = {ratio:.2f}")
    if args.json:
        args.json.write_text(json.dumps({"rounds": args.rounds, "median_s": medians, "all_s": times,
                                         "ratio": ratio}, indent=2))


if __name__ == "__main__":
    main()
