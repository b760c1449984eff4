"""The launch-speed gate: this version of mmt against an earlier one, on the same host, in one run, alternating.

For each backend (local, and SLURM where the test cluster runs) both versions run the 2 nodes x 2 probe
(``python train.py -m recipe=probe num_nodes=2 devices=2``) from submit to exit, in turn, ``--rounds`` times after a
warm-up; the medians are compared as a ratio. The gate fails (exit 1) when this version is more than ``--bound``
times slower than the earlier one on either backend: generous, because these hosts are noisy, but a doubling never
lands again.

    python benchmarks/bench_gate.py                        # against the last release (benchmarks/RELEASE)
    python benchmarks/bench_gate.py --against 3f93098 --backend slurm --rounds 5
    python benchmarks/bench_gate.py --candidate /path/to/edited/tree    # a copy of another tree, installed beside

The earlier version is exported from git and installed beside this one (``benchmarks/_install.py``): a venv of its
own on the same packages, cached by commit.
"""

import argparse
import json
import os
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Callable, Dict, List

import _install
from _timing import alternate, report, run, slurm_idle

REPO = Path(__file__).resolve().parents[1]
RELEASE = REPO / "benchmarks" / "RELEASE"


def release() -> str:
    """The last release's commit, as ``benchmarks/RELEASE`` names it (its first word)."""
    return RELEASE.read_text().split()[0]


def slurm_running() -> bool:
    return shutil.which("sbatch") is not None and bool(os.environ.get("SLURM_CONF") or Path("/etc/slurm").exists())


def probe(version: _install.Version, backend: str) -> Callable[[Path], None]:
    def one(scratch: Path) -> None:
        sweep = tempfile.mkdtemp(prefix=f"{backend}-", dir=scratch)
        env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_JOB", "SLURM_PROC", "PYTHONPATH"))}
        run(
            [
                version.python,
                "train.py",
                "-m",
                f"cluster={backend}",
                "recipe=probe",
                "num_nodes=2",
                "devices=2",
                f"hydra.sweep.dir={sweep}",
            ],
            cwd=version.tree,
            env=dict(env, OMP_NUM_THREADS="1"),
        )

    return one


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--against", help="the earlier version: a git revision (default: benchmarks/RELEASE)")
    parser.add_argument("--candidate", type=Path, help="a source tree to measure instead of this one (copied)")
    parser.add_argument("--backend", choices=["local", "slurm", "both"], default="both")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--bound", type=float, default=1.3, help="fail above this ratio (this / earlier)")
    parser.add_argument("--json", type=Path, help="also write the figures here")
    args = parser.parse_args()
    backends = ["local", "slurm"] if args.backend == "both" else [args.backend]
    if "slurm" in backends and not slurm_running():
        if args.backend == "slurm":
            sys.exit('no SLURM cluster: scripts/slurm_cluster.sh start && eval "$(scripts/slurm_cluster.sh env)"')
        print("gate: no SLURM cluster here; the local backend only")
        backends.remove("slurm")
    scratch = Path(tempfile.mkdtemp(prefix="mmt-bench-gate-"))
    try:
        earlier = _install.of_revision(args.against or release())
        this = (
            _install.of_tree(args.candidate, f"{args.candidate}", scratch / "candidate")
            if args.candidate
            else _install.current()
        )
        print(f"gate: {this.label} against {earlier.label}, {args.rounds} rounds, bound {args.bound}x")
        figures: Dict[str, Dict] = {}
        failed: List[str] = []
        for backend in backends:
            variants = {f"a_this_{backend}": probe(this, backend), f"b_earlier_{backend}": probe(earlier, backend)}
            times = alternate(variants, args.rounds, scratch, settle=slurm_idle if backend == "slurm" else None)
            ratio_name = f"this/earlier {backend}"
            figures[backend] = report(
                times, {ratio_name: tuple(variants)}, None, rounds=args.rounds, against=earlier.label
            )
            ratio = figures[backend]["ratios"][ratio_name]
            if ratio > args.bound:
                failed.append(f"{backend}: {ratio:.2f}x the earlier version's time (bound {args.bound}x)")
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    if args.json:
        args.json.write_text(json.dumps(figures, indent=2))
    if failed:
        print("gate: FAILED: this version is slower than " + earlier.label + ": " + "; ".join(failed))
        sys.exit(1)
    print("gate: passed")


if __name__ == "__main__":
    main()
