"""The training loop every variant of benchmarks/bench_elastic.py runs: a gloo process group over the world its
launcher gives it (read at every start: an elastic launcher starts it again in a smaller world), one all-reduce per
step, a checkpoint written by rank 0 after every step and loaded on start. Each rank notes its pid and node; rank 0
notes every step (when, which, in which world, by which process), paced at ``STEP_S`` so that a loss lands mid-run.

    torchrun ... benchmarks/elastic_probe.py <out dir>
    a Hydra task (benchmarks/elastic_app.py): elastic_probe.train(out)
"""

import os
import sys
import time
from pathlib import Path

STEPS = 60
STEP_S = 0.1


def train(out: str) -> float:
    import torch
    import torch.distributed as dist

    folder, rank = Path(out), int(os.environ["RANK"])
    node = os.environ.get("NODE_RANK") or os.environ.get("GROUP_RANK") or "?"
    (folder / f"pid.{os.getpid()}").write_text(f"{rank} {node}\n")
    began = time.time()
    if not dist.is_initialized():  # (Ray Train makes the group itself)
        dist.init_process_group("gloo")
    world = dist.get_world_size()
    with open(folder / "phases", "a") as notes:
        notes.write(f"{rank} {world} start {began!r} joined {time.time()!r}\n")
    model = torch.nn.Linear(64, 64)
    checkpoint = folder / "checkpoint.pt"
    step = 0
    if checkpoint.exists():
        state = torch.load(checkpoint)
        model.load_state_dict(state["model"])
        step = state["step"]
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    while step < STEPS:
        started = time.monotonic()
        loss = model(torch.ones(8, 64)).pow(2).mean()
        optimizer.zero_grad()
        loss.backward()
        for parameter in model.parameters():
            dist.all_reduce(parameter.grad)
        optimizer.step()
        step += 1
        if rank == 0:
            torch.save({"model": model.state_dict(), "step": step}, checkpoint.with_suffix(".tmp"))
            checkpoint.with_suffix(".tmp").replace(checkpoint)
            with open(folder / "steps", "a") as notes:
                notes.write(f"{time.time()!r} {step} {world} {os.getpid()}\n")
        time.sleep(max(0.0, STEP_S - (time.monotonic() - started)))
    dist.destroy_process_group()
    return float(step)


if __name__ == "__main__":
    train(sys.argv[1])
