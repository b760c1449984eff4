"""The per-phase timeline of one 2 nodes x 2 probe job, from the launcher's start to its return, on each backend.

Runs ``python train.py -m recipe=probe num_nodes=2 devices=2`` (``cluster=slurm`` too, where the test cluster
runs) ``--runs`` times and prints, for every phase the job's processes marked in ``<job dir>/.mmt/timeline.jsonl``
(``mmt.core.timeline``), the seconds from the launcher's start to its first and last occurrence: median over the
runs. ``exited`` is when the launcher's process was seen to exit, from outside.

    python benchmarks/bench_timeline.py --runs 5                        # local, and SLURM when it runs
    python benchmarks/bench_timeline.py --backend slurm --runs 5 --json timeline.json
"""

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Dict, List, Sequence, Tuple

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "launcher_plugin"))

from mmt.core import timeline  # noqa: E402

ORDER = [
    timeline.LAUNCHER_START,
    timeline.SUBMIT,
    timeline.SUBMITTED,
    timeline.BATCH_START,
    timeline.TASK_START,
    timeline.AGENT_START,
    timeline.AGENT_READY,
    timeline.RANK_FORK,
    timeline.RANK_START,
    timeline.USER_CODE,
    timeline.FIRST_COLLECTIVE,
    timeline.RANK_EXIT,
    timeline.AGENT_END,
    timeline.CONCLUDED,
    timeline.LAUNCHER_RETURN,
    "exited",
]


def slurm_running() -> bool:
    return shutil.which("sbatch") is not None and bool(os.environ.get("SLURM_CONF") or Path("/etc/slurm").exists())


def one_run(backend: str, scratch: Path, python: str = sys.executable, tree: Path = REPO) -> Dict[str, Tuple]:
    """The phases of one job: phase -> (first, last) seconds after the launcher's start."""
    sweep = scratch / f"{backend}-{time.monotonic_ns()}"
    args = [python, "train.py", "-m", f"cluster={backend}", "recipe=probe", "num_nodes=2", "devices=2"]
    env = dict(os.environ, OMP_NUM_THREADS="1")
    done = subprocess.run([*args, f"hydra.sweep.dir={sweep}"], cwd=tree, env=env, capture_output=True, text=True)
    exited = time.time()
    if done.returncode != 0:
        raise SystemExit(f"the job failed (exit {done.returncode}):\n{(done.stdout + done.stderr)[-3000:]}")
    events = timeline.read(sweep / "0" / timeline.NAME)
    if not events:
        raise SystemExit(f"no timeline in {sweep}/0: is this mmt older than its timeline?")
    start = next((e.t for e in events if e.phase == timeline.LAUNCHER_START), events[0].t)
    phases: Dict[str, List[float]] = {}
    for event in events:
        phases.setdefault(event.phase, []).append(event.t - start)
    phases["exited"] = [exited - start]
    return {phase: (min(times), max(times)) for phase, times in phases.items()}


def table(runs: Sequence[Dict[str, Tuple]]) -> List[Tuple[str, float, float]]:
    names = [p for p in ORDER if any(p in run for run in runs)]
    names += sorted(
        {p for run in runs for p in run} - set(names),
        key=lambda p: statistics.median(run[p][0] for run in runs if p in run),
    )
    rows = []
    for phase in names:
        firsts = [run[phase][0] for run in runs if phase in run]
        lasts = [run[phase][1] for run in runs if phase in run]
        rows.append((phase, statistics.median(firsts), statistics.median(lasts)))
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--backend", choices=["local", "slurm", "both"], default="both")
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--json", type=Path, help="also write the figures here")
    args = parser.parse_args()
    backends = ["local", "slurm"] if args.backend == "both" else [args.backend]
    if "slurm" in backends and not slurm_running():
        if args.backend == "slurm":
            sys.exit('no SLURM cluster: scripts/slurm_cluster.sh start && eval "$(scripts/slurm_cluster.sh env)"')
        backends.remove("slurm")
    figures = {}
    scratch = Path(tempfile.mkdtemp(prefix="mmt-bench-timeline-"))
    try:
        for backend in backends:
            one_run(backend, scratch)  # warm-up: page cache, .pyc files, the cluster's first job
            runs = [one_run(backend, scratch) for _ in range(args.runs)]
            rows = table(runs)
            print(f"\n{backend}: 2 nodes x 2 probe, seconds after the launcher's start, median of {args.runs}")
            print(f"  {'phase':18s} {'first':>7s} {'last':>7s}")
            for phase, first, last in rows:
                print(f"  {phase:18s} {first:7.3f} {last:7.3f}")
            figures[backend] = {phase: {"first": round(f, 3), "last": round(la, 3)} for phase, f, la in rows}
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    if args.json:
        args.json.write_text(json.dumps({"cpu_cores": os.cpu_count(), "runs": args.runs, **figures}, indent=2))


if __name__ == "__main__":
    main()
