"""A sweep of trivial 1 x 1 jobs on the local SLURM cluster, from the command's start to the last result: mmt
against hydra-submitit-launcher (which submits a sweep as one job array), and the submit RPCs each makes.

    (a) mmt:      python benchmarks/sweep_app.py -m hydra/launcher=mmt_slurm +x=range(N)
                  (one job array per resource group: here one sbatch)
    (b) submitit: the same with hydra/launcher=submitit_slurm, its settings at their defaults

The variants alternate within each round and the medians of ``--rounds`` rounds are compared as a ratio. Around
every run slurmctld's ``sdiag`` count of REQUEST_SUBMIT_BATCH_JOB is read: the sbatch calls the run made. Every
run's results are counted (N COMPLETED result files for mmt, N pickled results for submitit), and mmt's registry
rows (its own MMT_HOME). ``--points 1000`` is the large sweep: with ``--rounds 1`` it is run once each, and the
launchers' peak memory (max RSS, GNU time's) is reported too.

    MMT_SLURM_NODES=4 MMT_SLURM_CPUS=16 scripts/slurm_cluster.sh restart && eval "$(scripts/slurm_cluster.sh env)"
    python benchmarks/bench_sweep.py --points 100 --rounds 3
    python benchmarks/bench_sweep.py --points 1000 --rounds 1
"""

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Callable, Dict, List

from _timing import report, slurm_idle

REPO = Path(__file__).resolve().parents[1]
PY = sys.executable
MMT = str(Path(sys.executable).with_name("mmt"))


def submits() -> int:
    """slurmctld's count of sbatch submissions so far (sdiag: REQUEST_SUBMIT_BATCH_JOB)."""
    out = subprocess.run(["sdiag"], capture_output=True, text=True, check=True).stdout
    found = re.search(r"REQUEST_SUBMIT_BATCH_JOB\s+\(\s*\d+\)\s+count:(\d+)", out)
    return int(found.group(1)) if found else 0


def _sweep(launcher: str, points: int, sweep_dir: Path, env: Dict[str, str]) -> int:
    """Run the sweep; the launcher's peak memory in MB (max RSS, GNU time's %M: the largest of the launcher and
    what it waited for)."""
    peak = sweep_dir / "peak_rss_kb"
    done = subprocess.run(
        ["/usr/bin/time", "-f", "%M", "-o", str(peak), PY, "benchmarks/sweep_app.py", "-m",
         f"hydra/launcher={launcher}", f"+x=range({points})", f"hydra.sweep.dir={sweep_dir}"],
        cwd=REPO, env=env, capture_output=True, text=True,
    )  # fmt: skip
    if done.returncode != 0:
        raise SystemExit(f"{launcher} failed (exit {done.returncode}):\n{(done.stdout + done.stderr)[-3000:]}")
    return int(peak.read_text().split()[-1]) // 1024


def _mmt_results(sweep_dir: Path) -> int:
    statuses = [json.loads(p.read_text()).get("status") for p in sweep_dir.glob("*/result.json")]
    return statuses.count("COMPLETED")


def _mmt_rows(home: Path) -> int:
    out = subprocess.run([MMT, "list", "--all", "--json"], env=dict(os.environ, MMT_HOME=str(home)),
                         capture_output=True, text=True, check=True).stdout  # fmt: skip
    return sum(row["status"] == "Completed" for row in json.loads(out))


def _submitit_results(sweep_dir: Path) -> int:
    return len(list(sweep_dir.glob(".submitit/*/*_result.pkl")))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--points", type=int, default=100)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--launchers", default="mmt,submitit", help="which to run (comma-separated)")
    parser.add_argument("--json", type=Path, help="also write the figures here")
    args = parser.parse_args()
    if shutil.which("sbatch") is None or "SLURM_CONF" not in os.environ:
        sys.exit('no SLURM cluster: scripts/slurm_cluster.sh start && eval "$(scripts/slurm_cluster.sh env)"')
    scratch = Path(tempfile.mkdtemp(prefix="mmt-bench-sweep-"))
    env = dict(os.environ, MMT_HOME=str(scratch / "home"), OMP_NUM_THREADS="1")
    counts: Dict[str, List[Dict[str, int]]] = {"a_mmt": [], "b_submitit": []}  # each run's counts

    def variant(name: str, launcher: str, results: Callable[[Path], int]) -> Callable[[], float]:
        def one() -> float:
            sweep_dir = Path(tempfile.mkdtemp(prefix=name, dir=scratch))
            before, started = submits(), time.perf_counter()
            peak_mb = _sweep(launcher, args.points, sweep_dir, env)
            took = time.perf_counter() - started
            seen = {"submit_rpcs": submits() - before, "results": results(sweep_dir), "peak_rss_mb": peak_mb}
            if name == "a_mmt":
                seen["registry_rows_completed"] = _mmt_rows(scratch / "home")
                shutil.rmtree(scratch / "home", ignore_errors=True)
            counts[name].append(seen)
            print(f"  {name}: {took:.1f} s {seen}", flush=True)
            return took

        return one

    variants = {"a_mmt": variant("a_mmt", "mmt_slurm", _mmt_results),
                "b_submitit": variant("b_submitit", "submitit_slurm", _submitit_results)}  # fmt: skip
    wanted = args.launchers.split(",")
    variants = {name: one for name, one in variants.items() if name.split("_", 1)[1] in wanted}
    times: Dict[str, List[float]] = {name: [] for name in variants}
    items = list(variants.items())
    try:
        for round_ in range(args.rounds):  # alternating; no warm-up round at 1,000 points (minutes each)
            for name, one in items[round_ % len(items) :] + items[: round_ % len(items)]:
                slurm_idle(120)
                times[name].append(one())
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    for name, seen in counts.items():
        for run in seen:
            if run["results"] != args.points or run.get("registry_rows_completed", args.points) != args.points:
                raise SystemExit(f"{name}: a run did not end with {args.points} results and rows: {run}")
    report(
        times,
        {f"mmt/submitit_slurm {args.points} points": ("a_mmt", "b_submitit")} if len(variants) == 2 else {},
        args.json,
        rounds=args.rounds,
        points=args.points,
        runs=counts,
    )


if __name__ == "__main__":
    main()
