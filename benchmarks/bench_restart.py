"""Recovery from a failed rank: the seconds from the last rank's death (SIGKILL, after step 5) to the restarted job's
first training step, for the same 2 x 2 job (benchmarks/restart_probe.py: gloo, a checkpoint after every step) run
by mmt (``hydra.launcher.max_restarts=1``, everything else at its defaults: a 1 s back-off, ranks forked by the warm
agent) and by torchrun (``--max-restarts 1``, the c10d rendezvous, two agents on this host: one per node), in one
run, the variants alternating.

A variant whose restarted run never takes a step within ``--limit`` seconds did not recover; its recovery counts as
the limit (so a ratio against it is an upper bound). Goal: mmt <= 0.25x torchrun's recovery time.

    python benchmarks/bench_restart.py [--rounds 3] [--limit 120] [--json figures.json]
"""

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Dict, List, Optional

REPO = Path(__file__).resolve().parents[1]
HERE = REPO / "benchmarks"


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def _recovery(out: Path) -> Optional[float]:
    """Seconds from the death to the first step after it; None when no step came after it."""
    failed = float((out / "failed_at").read_text()) if (out / "failed_at").exists() else None
    steps = (
        [float(line) for line in (out / "first_steps").read_text().split()] if (out / "first_steps").exists() else []
    )
    after = [t for t in steps if failed is not None and t > failed]
    return min(after) - failed if after and failed is not None else None


def run_mmt(out: Path, limit: float) -> Optional[float]:
    env = {**os.environ, "MMT_HOME": str(out / "home"), "PYTHONPATH": str(HERE)}
    subprocess.run(
        [
            sys.executable,
            str(HERE / "restart_app.py"),
            "-m",
            "hydra/launcher=mmt_local",
            "+num_nodes=2",
            "+devices=2",
            f"+out={out}",
            "hydra.launcher.max_restarts=1",
            "hydra.launcher.preload=[torch.distributed]",
            "hydra.launcher.console=none",
            f"hydra.sweep.dir={out}/sweep",
        ],
        cwd=HERE,
        env=env,
        capture_output=True,
        timeout=limit + 60,
    )
    return _recovery(out)


def run_torchrun(out: Path, limit: float) -> Optional[float]:
    port, torchrun = _free_port(), str(Path(sys.executable).with_name("torchrun"))
    agents = [
        subprocess.Popen(
            [torchrun, "--nnodes", "2", "--nproc-per-node", "2", "--node-rank", str(node)]
            + ["--rdzv-backend", "c10d", "--rdzv-endpoint", f"127.0.0.1:{port}", "--rdzv-id", out.name]
            + ["--max-restarts", "1", str(HERE / "restart_probe.py"), str(out)],
            cwd=HERE,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )
        for node in range(2)
    ]
    deadline = time.monotonic() + limit
    while time.monotonic() < deadline and any(agent.poll() is None for agent in agents):
        time.sleep(0.2)
    for agent in agents:
        if agent.poll() is None:
            os.killpg(agent.pid, 9)
            agent.wait()
    return _recovery(out)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--limit", type=float, default=120.0, help="seconds a variant gets to recover")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    variants = {"mmt": run_mmt, "torchrun": run_torchrun}
    seconds: Dict[str, List[Optional[float]]] = {name: [] for name in variants}
    with tempfile.TemporaryDirectory(prefix="mmt-bench-restart.") as scratch:
        for round_ in range(args.rounds):
            order = list(variants) if round_ % 2 == 0 else list(reversed(variants))
            for name in order:
                out = Path(scratch) / f"{name}-{round_}"
                out.mkdir()
                seconds[name].append(variants[name](out, args.limit))
                print(f"round {round_} {name}: {seconds[name][-1]}", flush=True)
    figures: Dict[str, Dict[str, object]] = {}
    for name, values in seconds.items():
        recovered = [v for v in values if v is not None]
        counted = [v if v is not None else args.limit for v in values]
        figures[name] = {
            "recovered": f"{len(recovered)}/{len(values)}",
            "median_s": round(statistics.median(counted), 2),
            "each_s": [None if v is None else round(v, 2) for v in values],
        }
    ratio = figures["mmt"]["median_s"] / figures["torchrun"]["median_s"]  # type: ignore[operator]
    bound = "" if figures["torchrun"]["recovered"] == f"{args.rounds}/{args.rounds}" else " (at most: see recovered)"
    print(json.dumps(figures, indent=2))
    print(f"mmt / torchrun recovery time: {ratio:.2f}x{bound}; goal <= 0.25x")
    if args.json:
        args.json.write_text(json.dumps({**figures, "ratio": round(ratio, 3)}, indent=2))


if __name__ == "__main__":
    main()
