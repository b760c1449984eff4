"""recipe=probe: does this allocation work? Run it before a big job.

Every rank joins one process group, all-reduces its rank, all-gathers where it runs, and checks that the
launcher's rank contract and torch.distributed agree. Faults can be rehearsed: one rank raises, exits with a
chosen code, or hangs, before the group forms (``fail_at=start``) or after the collectives (``fail_at=end``).

    python train.py -m recipe=probe num_nodes=2 devices=2
    python train.py -m recipe=probe num_nodes=2 devices=2 recipe.fail_rank=3 recipe.fail_mode=exit recipe.exit_code=137
"""

import os
import socket
import time
from datetime import timedelta
from typing import Any, Dict, Optional

from mmt import RankInfo, mark_phase

FAIL_MODES = ("raise", "exit", "hang")


class ProbeFault(RuntimeError):
    """The fault a probe was asked to inject."""


def _inject(rank: RankInfo, fail_rank: Optional[int], fail_mode: str, exit_code: int) -> None:
    if fail_rank != rank.rank:
        return
    print(f"probe: rank {rank.rank} injects fault {fail_mode!r}", flush=True)
    if fail_mode == "raise":
        raise ProbeFault(f"injected failure on rank {rank.rank}")
    if fail_mode == "exit":
        os._exit(exit_code)
    while True:  # hang
        time.sleep(3600)


def _facts(rank: RankInfo) -> Dict[str, Any]:
    import torch

    return {
        "rank": rank.rank,
        "local_rank": rank.local_rank,
        "node_rank": rank.node_rank,
        "world_size": rank.world_size,
        "hostname": socket.gethostname(),
        "pid": os.getpid(),
        "ppid": os.getppid(),  # the node agent that forked this rank (or the SLURM task, per rank)
        "master": f"{rank.master_addr}:{rank.master_port}",
        "torch_threads": torch.get_num_threads(),
        "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES"),
        "time": time.time(),
        # under SLURM: the scheduler's own view, to check the launcher's mapping onto the contract
        "slurm_procid": os.environ.get("SLURM_PROCID"),
        "slurm_nodeid": os.environ.get("SLURM_NODEID"),
    }


def probe(
    backend: str = "auto",
    fail_rank: Optional[int] = None,
    fail_mode: str = "raise",
    fail_at: str = "start",
    exit_code: int = 1,
    init_timeout_s: float = 120,
    hold_s: float = 0,
) -> Dict[str, Any]:
    if fail_mode not in FAIL_MODES:
        raise ValueError(f"recipe.fail_mode={fail_mode!r}: expected one of {', '.join(FAIL_MODES)}")
    if fail_at not in ("start", "end"):
        raise ValueError(f"recipe.fail_at={fail_at!r}: expected start or end")
    import torch
    import torch.distributed as dist

    rank = RankInfo.from_env()
    if fail_at == "start":
        _inject(rank, fail_rank, fail_mode, exit_code)
    if backend == "auto":
        backend = "nccl" if torch.cuda.is_available() else "gloo"
    started = time.perf_counter()
    dist.init_process_group(
        backend,
        init_method=f"tcp://{rank.master_addr}:{rank.master_port}",
        rank=rank.rank,
        world_size=rank.world_size,
        timeout=timedelta(seconds=init_timeout_s),
    )
    try:
        device = torch.device("cuda", rank.local_rank) if backend == "nccl" else torch.device("cpu")
        total = torch.tensor([float(rank.rank + 1)], device=device)
        dist.all_reduce(total)
        mark_phase("first_collective", rank=rank.rank)
        expected = rank.world_size * (rank.world_size + 1) / 2
        if total.item() != expected:
            raise RuntimeError(f"all_reduce gave {total.item()}, expected {expected}: the world is not one group")
        gathered: list = [None] * rank.world_size
        dist.all_gather_object(gathered, _facts(rank))
        dist.barrier()
    finally:
        dist.destroy_process_group()
    if fail_at == "end":
        _inject(rank, fail_rank, fail_mode, exit_code)
    if hold_s:
        mark_phase("hold", rank=rank.rank)  # past every collective: what a test may now break is the hold
    time.sleep(hold_s)
    result = {
        "world_size": rank.world_size,
        "num_nodes": rank.num_nodes,
        "all_reduce": total.item(),
        "seconds_to_first_collective": round(time.perf_counter() - started, 3),
        "ranks": gathered,
    }
    if rank.is_main:
        print(f"probe: {rank.world_size} ranks on {rank.num_nodes} nodes answered; all_reduce={total.item():g}")
    return result
