"""Ray Train's side of benchmarks/bench_ray.py: the probe's all-reduce (recipes/probe.py) in a ``TorchTrainer`` of
``nodes x per_node`` workers, on the same Ray cluster as mmt's, submitted the same way (Ray's job API).

    python benchmarks/ray_train_probe.py submit NODES PER_NODE     # from the launcher's side: submit, wait, check
    python benchmarks/ray_train_probe.py train NODES PER_NODE      # the Ray job's entrypoint, on the head

Each worker asks the node's CPUs over its ranks (4 / per_node on the test cluster's 4-CPU workers), packed: the same
``per_node`` workers on each of ``nodes`` Ray nodes that mmt's placement group gives. Torch's process group is Ray
Train's (gloo on CPU); every worker all-reduces its rank + 1, all-gathers where it runs, and the result is checked:
one world, ``nodes`` distinct Ray nodes. Submitting polls the job API every 0.1 s over plain HTTP (what mmt's
launcher does), so that the anchor pays no client import mmt does not pay.
"""

import json
import os
import sys
import tempfile
import time
import urllib.request
import uuid
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def train_loop(config: dict) -> None:
    import ray.train
    import torch
    import torch.distributed as dist

    context = ray.train.get_context()
    rank, world = context.get_world_rank(), context.get_world_size()
    total = torch.tensor([float(rank + 1)])
    dist.all_reduce(total)
    gathered: list = [None] * world
    dist.all_gather_object(gathered, {"rank": rank, "node": ray.util.get_node_ip_address(), "pid": os.getpid()})
    dist.barrier()
    if total.item() != world * (world + 1) / 2:
        raise RuntimeError(f"all_reduce gave {total.item()}: the world is not one group")
    if rank == 0:  # Ray Train 2's Result keeps metrics only with a checkpoint: rank 0 writes them itself
        found = {"all_reduce": total.item(), "nodes": sorted({g["node"] for g in gathered})}
        Path(config["out"]).write_text(json.dumps(found))


def train(nodes: int, per_node: int) -> None:
    from ray.train import RunConfig, ScalingConfig
    from ray.train.torch import TorchConfig, TorchTrainer

    out = Path(tempfile.mkdtemp(prefix="ray-train-")) / "probe.json"
    trainer = TorchTrainer(
        train_loop,
        train_loop_config={"out": str(out)},
        scaling_config=ScalingConfig(
            num_workers=nodes * per_node,
            use_gpu=False,
            resources_per_worker={"CPU": 4 / per_node},
            placement_strategy="PACK",
        ),
        torch_config=TorchConfig(backend="gloo"),
        run_config=RunConfig(storage_path=str(out.parent), name="probe"),
    )
    trainer.fit()
    metrics = json.loads(out.read_text())
    if metrics["all_reduce"] != nodes * per_node * (nodes * per_node + 1) / 2 or len(metrics["nodes"]) != nodes:
        raise SystemExit(f"unexpected result: {metrics}")
    print(f"ray train probe: {json.dumps(metrics)}", flush=True)


def submit(nodes: int, per_node: int) -> None:
    address = os.environ["RAY_API_SERVER_ADDRESS"]
    job = f"ray-train-probe-{uuid.uuid4().hex[:8]}"
    body = {
        "entrypoint": f"cd {REPO} && exec python -u benchmarks/ray_train_probe.py train {nodes} {per_node}",
        "submission_id": job,
        "runtime_env": {"env_vars": {"OMP_NUM_THREADS": "1"}},  # as mmt's ranks get: its cores over its ranks
    }
    request = urllib.request.Request(
        f"{address}/api/jobs/", data=json.dumps(body).encode(), headers={"Content-Type": "application/json"}
    )
    urllib.request.urlopen(request, timeout=30).read()
    while True:
        with urllib.request.urlopen(f"{address}/api/jobs/{job}", timeout=30) as answer:
            status = json.load(answer)["status"]
        if status in ("SUCCEEDED", "FAILED", "STOPPED"):
            break
        time.sleep(0.1)
    if status != "SUCCEEDED":
        with urllib.request.urlopen(f"{address}/api/jobs/{job}/logs", timeout=30) as answer:
            raise SystemExit(f"Ray Train job {job} {status}:\n{json.load(answer)['logs'][-3000:]}")


if __name__ == "__main__":
    mode, nodes_arg, per_node_arg = sys.argv[1:4]
    (submit if mode == "submit" else train)(int(nodes_arg), int(per_node_arg))
