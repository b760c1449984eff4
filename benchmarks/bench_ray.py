"""Submit-to-result time of the 2 nodes x 2 probe on a Ray cluster: mmt on Ray against Ray Train's ``TorchTrainer``
running the same all-reduce on the same cluster.

    (a) mmt:        python train.py -m cluster=ray recipe=probe num_nodes=N devices=M
                    (one Ray job; its driver places a STRICT_SPREAD placement group of N bundles, one actor per
                    bundle runs mmt's node agent, which imports torch once and forks the node's M ranks)
    (b) Ray Train:  benchmarks/ray_train_probe.py: a Ray job whose driver runs a TorchTrainer of N x M workers
                    (M per node, packed), each an actor that imports torch, joins Ray Train's process group and
                    all-reduces; submitted and waited for over the job API, as mmt's launcher does

Each is timed from the command's start to its exit (mmt: compose, plan, submit, the job, its result back; Ray Train:
submit, the job, its status back), the variants alternate within each round after a warm-up of each, and the
medians of ``--rounds`` rounds are compared. Before every run (untimed) the cluster is idle: no job running, no
actor alive. Goal: mmt at most 0.8x Ray Train's time.

    scripts/ray_cluster.sh start && eval "$(scripts/ray_cluster.sh env)"
    python benchmarks/bench_ray.py --rounds 5 --json /tmp/bench_ray.json
"""

import argparse
import json
import os
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Callable, Dict

from _timing import alternate, report, run

REPO = Path(__file__).resolve().parents[1]
PY = sys.executable


def _env() -> Dict[str, str]:
    return {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}


def _get(path: str) -> dict:
    with urllib.request.urlopen(os.environ["RAY_API_SERVER_ADDRESS"] + path, timeout=10) as answer:
        return json.load(answer)


def ray_idle(timeout_s: float = 60.0) -> None:
    """Wait (untimed) until no Ray job runs and no actor is alive (but detached ones, which outlive jobs by design:
    Ray Train's autoscaling coordinator): the last run's workers have gone, so that a run never waits for its
    predecessor's bundles."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        jobs = [j for j in _get("/api/jobs/") if j["status"] in ("PENDING", "RUNNING")]
        actors = [
            a
            for a in _get("/api/v0/actors?limit=10000&detail=true")["data"]["result"]["result"]
            if a.get("state") != "DEAD" and not a.get("is_detached")
        ]
        if not jobs and not actors:
            return
        time.sleep(0.1)


def variants(nodes: int, per_node: int) -> Dict[str, Callable[[Path], None]]:
    shape = f"{nodes}x{per_node}"

    def mmt(scratch: Path) -> None:
        sweep = tempfile.mkdtemp(prefix="mmt-", dir=scratch)
        run(
            [PY, "train.py", "-m", "cluster=ray", "recipe=probe", f"num_nodes={nodes}", f"devices={per_node}",
             f"hydra.sweep.dir={sweep}"],
            cwd=REPO,
            env=_env(),
        )  # fmt: skip

    def ray_train(scratch: Path) -> None:
        run([PY, "benchmarks/ray_train_probe.py", "submit", str(nodes), str(per_node)], cwd=REPO, env=_env())

    return {f"a_mmt_ray_{shape}": mmt, f"b_ray_train_{shape}": ray_train}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--nodes", type=int, default=2)
    parser.add_argument("--per-node", type=int, default=2)
    parser.add_argument("--json", type=Path, help="also write the figures here")
    args = parser.parse_args()
    if not os.environ.get("RAY_API_SERVER_ADDRESS"):
        sys.exit('no Ray cluster: scripts/ray_cluster.sh start && eval "$(scripts/ray_cluster.sh env)"')
    shape = f"{args.nodes}x{args.per_node}"
    scratch = Path(tempfile.mkdtemp(prefix="mmt-bench-ray-"))
    try:
        times = alternate(variants(args.nodes, args.per_node), args.rounds, scratch, settle=ray_idle)
    finally:
        import shutil

        shutil.rmtree(scratch, ignore_errors=True)
    figures = report(
        times,
        {f"mmt/ray_train {shape}": (f"a_mmt_ray_{shape}", f"b_ray_train_{shape}")},
        args.json,
        rounds=args.rounds,
        shape=shape,
    )
    ratio = figures["ratios"][f"mmt/ray_train {shape}"]  # type: ignore[index]
    print(f"goal: mmt at most 0.8x Ray Train's time: {'met' if ratio <= 0.8 else 'NOT met'} ({ratio:.2f}x)")


if __name__ == "__main__":
    main()
