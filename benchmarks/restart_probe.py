"""The training loop both restart variants run (benchmarks/bench_restart.py): a process group over every rank, a
checkpoint loaded on start and written by rank 0 after every step, one all-reduce per step. The last rank dies after
step 5 of the first run (SIGKILL, as the OOM killer would); rank 0 notes when each run's first step is done.

    python benchmarks/restart_probe.py <out dir>            (torchrun: TORCHELASTIC_RESTART_COUNT)
    python train.py-style task: restart_probe.train(out)    (mmt: MMT_RESTART_COUNT)
"""

import os
import signal
import sys
import time
from pathlib import Path

STEPS = 10
FAIL_AFTER = 5


def restart_count() -> int:
    for name in ("MMT_RESTART_COUNT", "TORCHELASTIC_RESTART_COUNT"):
        if os.environ.get(name):
            return int(os.environ[name])
    return 0


def train(out: str) -> float:
    import torch
    import torch.distributed as dist

    folder, restart = Path(out), restart_count()
    rank = int(os.environ["RANK"])
    dist.init_process_group("gloo")
    model = torch.nn.Linear(64, 64)
    checkpoint = folder / "checkpoint.pt"
    step = 0
    if checkpoint.exists():
        state = torch.load(checkpoint)
        model.load_state_dict(state["model"])
        step = state["step"]
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    first = True
    while step < STEPS:
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
            if first:  # each run's first step, whatever count its launcher gives it (torchrun's differ per agent)
                with open(folder / "first_steps", "a") as notes:
                    notes.write(f"{time.time()!r}\n")
        first = False
        dist.barrier()
        if rank == int(os.environ["WORLD_SIZE"]) - 1 and restart == 0 and step == FAIL_AFTER:
            (folder / "failed_at").write_text(repr(time.time()))
            os.kill(os.getpid(), signal.SIGKILL)
    dist.destroy_process_group()
    return float(step)


if __name__ == "__main__":
    train(sys.argv[1])
