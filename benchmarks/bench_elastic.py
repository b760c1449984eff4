"""Recovery from a lost node: the seconds from the loss (SIGKILL of the node: its agent and its ranks) to the first
training step after it, for the same 3 nodes x 2 job (benchmarks/elastic_probe.py: gloo, a checkpoint after every
step, 0.1 s per step) run three ways on this host, the variants alternating in each round:

    (a) mmt elastic:      num_nodes=2:3: the surviving node agents stop their ranks and fork them again in a world
                          of 2 nodes (4 ranks) from their warm interpreters; node 2's agent is killed
    (b) mmt restart:      num_nodes=3, hydra.launcher.max_restarts=1 (its defaults: a 1 s back-off): the whole job
                          starts again (3 nodes); node 2's ranks are killed
    (c) torchrun elastic: --nnodes=2:3 with the c10d rendezvous at its defaults (--max-restarts 3), three agents on
                          this host; the third agent and its workers are killed
    (d) Ray Train elastic: ScalingConfig(num_workers=(4, 6)) on scripts/ray_cluster.sh's cluster of 3 workers with 2
                          CPUs each (benchmarks/elastic_raytrain.py; FailureConfig(max_failures=3), else Ray Train's
                          defaults); worker 3 is lost (`ray_cluster.sh fail-node 3`: its raylet and every process of
                          it SIGKILLed). The benchmark starts that cluster afresh for each of its rounds and stops
                          it after (`--no-ray` leaves Ray out; a Ray cluster must not run already)

mmt's agents import the probe's modules once per node (``hydra.launcher.preload``: torch.distributed, and
torch._dynamo, which the optimizer imports on first use). The loss comes once rank 0 has taken ``--kill-at`` steps;
recovery ends at the first step of a rank 0 that started after it (its pid is not one that stepped before). A
variant that takes no step after it within ``--limit`` seconds did not recover; its recovery counts as the limit (a
ratio against it is then a bound). Goals: mmt elastic <= 0.5x mmt's full restart and <= 0.25x torchrun's.

    python benchmarks/bench_elastic.py [--rounds 3] [--limit 120] [--no-ray] [--json figures.json]
"""

import argparse
import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Callable, Dict, List, Optional

REPO = Path(__file__).resolve().parents[1]
HERE = REPO / "benchmarks"
# what mmt's agents import once per node before they fork ranks: the probe's torch.optim.SGD imports torch._dynamo on
# first use (4 s of CPU here), as Lightning does on import (recipe=lm's preload takes it); torchrun's workers are new
# interpreters, which import both at every start
PRELOAD = ("torch.distributed", "torch._dynamo")


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def _steps(out: Path) -> List[List[float]]:
    try:
        return [[float(x) for x in line.split()] for line in (out / "steps").read_text().splitlines() if line]
    except FileNotFoundError:
        return []


def _wait(predicate: Callable[[], object], limit: float) -> object:
    deadline = time.monotonic() + limit
    while time.monotonic() < deadline:
        found = predicate()
        if found:
            return found
        time.sleep(0.05)
    return None


def _recovery(out: Path, lost_at: Optional[float]) -> Optional[float]:
    """Seconds from the loss to the first step of a rank 0 started after it (a new world, or a new run)."""
    if lost_at is None:
        return None
    steps = _steps(out)
    before = {pid for when, _, _, pid in steps if when <= lost_at}
    after = [when for when, _, _, pid in steps if when > lost_at and pid not in before]
    return min(after) - lost_at if after else None


def _kill_tree(pid: int) -> None:
    """A node lost: the process and everything under it (torchrun's workers run in sessions of their own)."""
    import psutil

    try:
        root = psutil.Process(pid)
        family = [root, *root.children(recursive=True)]
    except psutil.NoSuchProcess:
        return
    for process in family:
        try:
            process.kill()
        except psutil.NoSuchProcess:
            pass


def _mmt(out: Path, nodes: str, extra: List[str]) -> subprocess.Popen:
    env = {**os.environ, "MMT_HOME": str(out / "home"), "PYTHONPATH": str(HERE)}
    return subprocess.Popen(
        [sys.executable, str(HERE / "elastic_app.py"), "-m", "hydra/launcher=mmt_local", f"+num_nodes={nodes}"]
        + ["+devices=2", f"+out={out}", f"hydra.launcher.preload=[{','.join(PRELOAD)}]", "hydra.launcher.console=none"]
        + [f"hydra.sweep.dir={out}/sweep", *extra],
        cwd=HERE,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )


def _finish(processes: List[subprocess.Popen], limit: float) -> None:
    """Wait for the variant's processes to end, up to ``limit``; then kill what is left of them and of everything
    they started (torchrun's workers run in sessions of their own: a kill of the agent's group leaves them)."""
    deadline = time.monotonic() + limit
    while time.monotonic() < deadline and any(p.poll() is None for p in processes):
        time.sleep(0.2)
    for process in processes:
        if process.poll() is None:
            _kill_tree(process.pid)
            try:
                os.killpg(process.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
            process.wait()


def run_mmt_elastic(out: Path, kill_at: int, limit: float) -> Optional[float]:
    launcher = _mmt(out, "2:3", [])
    lost_at = None
    if _wait(lambda: len(_steps(out)) >= kill_at, limit):
        record = next((out / "sweep" / "0" / ".mmt" / "attempts").glob("*/agent.2.json"))
        pid = json.loads(record.read_text())["pid"]
        lost_at = time.time()
        os.kill(pid, signal.SIGKILL)  # node 2: its agent; its ranks die with it (their parent-death signal)
    _finish([launcher], limit)
    return _recovery(out, lost_at)


def run_mmt_restart(out: Path, kill_at: int, limit: float) -> Optional[float]:
    launcher = _mmt(out, "3", ["hydra.launcher.max_restarts=1"])
    lost_at = None
    if _wait(lambda: len(_steps(out)) >= kill_at, limit):
        ranks = [int(p.name.split(".")[1]) for p in out.glob("pid.*") if p.read_text().split()[1] == "2"]
        lost_at = time.time()
        for pid in ranks:  # node 2's ranks (the local host agent runs every node: it lives on)
            os.kill(pid, signal.SIGKILL)
    _finish([launcher], limit)
    return _recovery(out, lost_at)


def run_torchrun(out: Path, kill_at: int, limit: float) -> Optional[float]:
    port, torchrun = _free_port(), str(Path(sys.executable).with_name("torchrun"))
    agents = []
    for _ in range(3):
        agents.append(
            subprocess.Popen(
                [torchrun, "--nnodes", "2:3", "--nproc-per-node", "2", "--max-restarts", "3"]
                + ["--rdzv-backend", "c10d", "--rdzv-endpoint", f"127.0.0.1:{port}", "--rdzv-id", out.name]
                + [str(HERE / "elastic_probe.py"), str(out)],
                cwd=HERE,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                start_new_session=True,
            )
        )
        time.sleep(0.5)  # the first agent hosts the rendezvous store: it is not the one killed
    lost_at = None
    if _wait(lambda: len(_steps(out)) >= kill_at, limit):
        lost_at = time.time()
        _kill_tree(agents[-1].pid)  # the last agent and its workers: a node lost
    _finish(agents, limit)
    return _recovery(out, lost_at)


RAY_CLUSTER = REPO / "scripts" / "ray_cluster.sh"
RAY_ENV = {**os.environ, "MMT_RAY_CPUS": "2", "MMT_RAY_WORKERS": "3"}  # 6 workers of one CPU, 2 per node
RAY_GCS = "127.0.0.5:6390"  # the script's defaults: head 127.0.0.5, GCS port 6390


def _ray_cluster(*command: str) -> None:
    subprocess.run([str(RAY_CLUSTER), *command], env=RAY_ENV, check=True, capture_output=True, text=True)


def run_ray_train(out: Path, kill_at: int, limit: float) -> Optional[float]:
    # a fresh cluster each round, up only for this variant: a revived node is not always counted by Ray Train's
    # elastic start (it started with 4 workers), and an idle cluster's daemons would slow the other variants
    _ray_cluster("restart")
    driver = subprocess.Popen(
        [sys.executable, str(HERE / "elastic_raytrain.py"), str(out)],
        cwd=HERE,
        env={**os.environ, "RAY_ADDRESS": RAY_GCS},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    lost_at = None
    if _wait(lambda: len(_steps(out)) >= kill_at, limit):
        lost_at = time.time()
        _ray_cluster("fail-node", "3")  # a machine lost: its raylet and every process on it
    _finish([driver], limit)
    _ray_cluster("stop")
    return _recovery(out, lost_at)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--kill-at", type=int, default=10, help="rank 0's steps before the loss")
    parser.add_argument("--limit", type=float, default=120.0, help="seconds a variant gets to start and to recover")
    parser.add_argument("--no-ray", action="store_true", help="leave Ray Train's variant out")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    variants: Dict[str, Callable[[Path, int, float], Optional[float]]] = {
        "mmt_elastic": run_mmt_elastic,
        "mmt_restart": run_mmt_restart,
        "torchrun_elastic": run_torchrun,
    }
    if not args.no_ray:
        variants["ray_train_elastic"] = run_ray_train
    seconds: Dict[str, List[Optional[float]]] = {name: [] for name in variants}
    with tempfile.TemporaryDirectory(prefix="mmt-bench-elastic.") as scratch:
        for round_ in range(args.rounds):
            order = list(variants) if round_ % 2 == 0 else list(reversed(variants))
            for name in order:
                out = Path(scratch) / f"{name}-{round_}"
                out.mkdir()
                seconds[name].append(variants[name](out, args.kill_at, args.limit))
                worlds = sorted({int(world) for _, _, world, _ in _steps(out)}, reverse=True)
                print(f"round {round_} {name}: {seconds[name][-1]} (worlds {worlds})", flush=True)
    figures: Dict[str, Dict[str, object]] = {}
    for name, values in seconds.items():
        recovered = [v for v in values if v is not None]
        counted = [v if v is not None else args.limit for v in values]
        figures[name] = {
            "recovered": f"{len(recovered)}/{len(values)}",
            "median_s": round(statistics.median(counted), 2),
            "each_s": [None if v is None else round(v, 2) for v in values],
        }
    median = {name: float(figures[name]["median_s"]) for name in figures}  # type: ignore[arg-type]
    ratios = {
        "elastic_vs_restart": round(median["mmt_elastic"] / median["mmt_restart"], 3),
        "elastic_vs_torchrun": round(median["mmt_elastic"] / median["torchrun_elastic"], 3),
    }
    if "ray_train_elastic" in median:
        ratios["elastic_vs_ray_train"] = round(median["mmt_elastic"] / median["ray_train_elastic"], 3)
    print(json.dumps(figures, indent=2))
    print(f"mmt elastic / mmt restart: {ratios['elastic_vs_restart']:.2f}x (goal <= 0.5x)")
    print(f"mmt elastic / torchrun --nnodes=2:3: {ratios['elastic_vs_torchrun']:.2f}x (goal <= 0.25x)")
    if "elastic_vs_ray_train" in ratios:
        print(f"mmt elastic / Ray Train num_workers=(4, 6): {ratios['elastic_vs_ray_train']:.2f}x")
    if args.json:
        args.json.write_text(json.dumps({**figures, **ratios}, indent=2))


if __name__ == "__main__":
    main()
