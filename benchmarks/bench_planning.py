"""Sweep planning is linear in the number of jobs: a 20-job and a 500-job sweep of ``command=true``, as dry runs
(every job composed, planned and packed; nothing started), in one run.

For each size: the median seconds spent preparing one job (compose, plan, payload) over the sweep, and the pickled
payload's size of the first and the last job. Goal: per job, the 500-job sweep costs at most 1.2x what the 20-job
sweep costs, and a job's payload does not grow with the sweep (first = last).

    python benchmarks/bench_planning.py [--json figures.json]
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Dict, List, Tuple

REPO = Path(__file__).resolve().parents[1]
SIZES = (20, 500)


def sweep(size: int, scratch: Path) -> Tuple[List[Dict[str, float]], float]:
    probe = scratch / f"probe-{size}.json"
    env = {**os.environ, "MMT_PLANNING_PROBE": str(probe), "PYTHONPATH": str(REPO / "benchmarks")}
    args = [
        sys.executable,
        str(REPO / "benchmarks" / "planning_probe.py"),
        "-m",
        "command='true'",
        f"+i=range({size})",
        "hydra.launcher.dry_run=true",
        f"hydra.sweep.dir={scratch}/sweep-{size}",
    ]
    started = time.perf_counter()
    done = subprocess.run(args, cwd=REPO, env=env, capture_output=True, text=True)
    wall = time.perf_counter() - started
    if done.returncode != 0:
        raise SystemExit(f"the {size}-job dry run failed:\n{(done.stdout + done.stderr)[-3000:]}")
    samples = json.loads(probe.read_text())
    if len(samples) != size:
        raise SystemExit(f"expected {size} prepared jobs, the probe saw {len(samples)}")
    return sorted(samples, key=lambda s: s["num"]), wall


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    figures: Dict[str, Dict[str, float]] = {}
    with tempfile.TemporaryDirectory(prefix="mmt-bench-planning.") as scratch:
        for size in SIZES:
            samples, wall = sweep(size, Path(scratch))
            figures[str(size)] = {
                "wall_s": round(wall, 2),
                "median_ms_per_job": round(1000 * statistics.median(s["seconds"] for s in samples), 2),
                "total_s": round(sum(s["seconds"] for s in samples), 2),
                "first_payload_kb": round(samples[0]["payload_bytes"] / 1024, 1),
                "last_payload_kb": round(samples[-1]["payload_bytes"] / 1024, 1),
            }
    small, large = figures[str(SIZES[0])], figures[str(SIZES[-1])]
    ratio = round(large["median_ms_per_job"] / small["median_ms_per_job"], 3)
    for size, row in figures.items():
        print(
            f"{size:>4} jobs: {row['median_ms_per_job']:7.2f} ms/job (median), {row['total_s']:6.2f} s in all, "
            f"payload {row['first_payload_kb']} KB (job 0) .. {row['last_payload_kb']} KB (last job)"
        )
    print(f"per-job cost, {SIZES[-1]} vs {SIZES[0]} jobs: {ratio}x (goal <= 1.2x)")
    # the whole dry run, the sweeper's own composing and the printing included: the cost of each job past the 20th
    marginal = round(1000 * (large["wall_s"] - small["wall_s"]) / (SIZES[-1] - SIZES[0]), 1)
    print(
        f"whole dry run: {small['wall_s']} s for {SIZES[0]} jobs, {large['wall_s']} s for {SIZES[-1]}: "
        f"{marginal} ms for each job past the {SIZES[0]}th"
    )
    growth = round(large["first_payload_kb"] / large["last_payload_kb"], 3)
    print(f"payload of job 0 / last job in the {SIZES[-1]}-job sweep: {growth}x (goal 1.0x: no growth)")
    if args.json:
        args.json.write_text(
            json.dumps(
                {"sizes": figures, "per_job_ratio": ratio, "payload_growth": growth, "marginal_ms_per_job": marginal},
                indent=2,
            )
        )


if __name__ == "__main__":
    main()
