"""Timing shared by the benchmarks: every variant once to warm up, then rounds in which the variants alternate; the
medians, the ratios that matter, and a JSON copy of the figures."""

import json
import os
import statistics
import subprocess
import time
from pathlib import Path
from typing import Callable, Dict, List, Optional, Sequence, Tuple


def run(args: Sequence[str], **popen: object) -> None:
    """Run one variant's command; if it fails, stop the benchmark with the command's own last lines."""
    done = subprocess.run(list(args), capture_output=True, text=True, **popen)  # type: ignore[call-overload]
    if done.returncode != 0:
        tail = (done.stdout + done.stderr)[-3000:]
        raise SystemExit(f"benchmark variant failed (exit {done.returncode}): {' '.join(args)}\n{tail}")


def alternate(
    variants: Dict[str, Callable[[Path], None]],
    rounds: int,
    scratch: Path,
    settle: Optional[Callable[[], None]] = None,
) -> Dict[str, List[float]]:
    """Wall seconds of every run of every variant. Each round starts with the next variant, so that none always
    runs first (cold caches) or right after the same neighbour. ``settle``, untimed, before every run: what makes
    each start from the same state (a SLURM cluster whose last job has left the queue)."""
    times: Dict[str, List[float]] = {name: [] for name in variants}
    for run in variants.values():  # warm-up: page cache, .pyc files, the cluster's first job
        run(scratch)
    items = list(variants.items())
    for round_ in range(rounds):
        for name, run in items[round_ % len(items) :] + items[: round_ % len(items)]:
            if settle is not None:
                settle()
            started = time.perf_counter()
            run(scratch)
            times[name].append(time.perf_counter() - started)
    return times


def slurm_idle(timeout_s: float = 60.0, env: Optional[Dict[str, str]] = None) -> None:
    """Wait (untimed) until SLURM's queue is empty and every node idle: the last job's allocation has drained (SLURM
    holds its nodes for a second or so after its launcher has returned), so that a run never waits for its
    predecessor's nodes and for the scheduler's next pass (up to a second more, at random)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        queued = subprocess.run(["squeue", "-h", "-o", "%i"], capture_output=True, text=True, env=env).stdout.strip()
        states = subprocess.run(["sinfo", "-h", "-o", "%T"], capture_output=True, text=True, env=env).stdout.split()
        if not queued and all(state == "idle" for state in states):
            return
        time.sleep(0.05)


def main(
    description: str, variants: Dict[str, Callable[[Path], None]], ratios: Dict[str, Tuple[str, str]], prefix: str
) -> None:
    """A benchmark's command line (--rounds, --json), its runs in a scratch dir, and its report."""
    import argparse
    import shutil
    import tempfile

    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--json", type=Path, help="also write the figures here")
    args = parser.parse_args()
    scratch = Path(tempfile.mkdtemp(prefix=prefix))
    try:
        times = alternate(variants, args.rounds, scratch)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    report(times, ratios, args.json, rounds=args.rounds)


def report(
    times: Dict[str, List[float]], ratios: Dict[str, Tuple[str, str]], json_path: Optional[Path], **facts: object
) -> Dict[str, object]:
    """Print each variant's median and every ratio (``name: (numerator, denominator)``); write them as JSON."""
    medians = {name: statistics.median(values) for name, values in times.items()}
    figures = {name: round(medians[a] / medians[b], 3) for name, (a, b) in ratios.items()}
    for name, median in medians.items():
        print(f"{name:28s} median {median:6.2f} s   runs {', '.join(f'{x:.2f}' for x in times[name])}")
    print("ratios  " + "  ".join(f"{k} = {v:.2f}" for k, v in figures.items()))
    result = {
        "cpu_cores": os.cpu_count(),
        **facts,
        "median_s": {k: round(v, 3) for k, v in medians.items()},
        "all_s": {k: [round(x, 3) for x in v] for k, v in times.items()},
        "ratios": figures,
    }
    if json_path:
        json_path.write_text(json.dumps(result, indent=2))
    return result
