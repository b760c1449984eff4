"""recipe=lm_torch: the ``lm`` recipe's model, data and batch plan, in raw PyTorch DDP (no Lightning loop).

What the seed's "few lines" amount to, done properly: the process group from the rank contract (RankInfo), a
``DistributedSampler`` with ``set_epoch`` every epoch, ``DistributedDataParallel`` with ``no_sync`` on
accumulating micro-batches, and only rank 0 printing, writing ``metrics.csv`` and saving
``checkpoints/last.pt`` (a rerun in the same dir resumes from it). Only the dataset and model classes come from
``lightning.pytorch.demos``, so that the three LM recipes train the very same thing.

    python train.py -m recipe=lm_torch num_nodes=2 devices=2
"""

import contextlib
import os
import random
from datetime import timedelta
from pathlib import Path
from typing import Any, Dict, Iterator, Optional

import torch
import torch.distributed as dist
import torch.nn.functional as F
from lightning.pytorch.demos import Transformer
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader
from torch.utils.data.distributed import DistributedSampler

from mmt import RankInfo
from mmt.checkpoints import resume_from, save_atomic
from recipes.corpus import load_splits, weights_digest
from recipes.lm_common import StepClock, append_metrics, gather, keep_ddp_buckets, summary

_AUTOCAST = {"32-true": None, "32": None, "bf16-mixed": torch.bfloat16, "16-mixed": torch.float16}


def _seed_everything(seed: int) -> None:
    """What ``L.seed_everything`` does, so that the three recipes start from the same weights."""
    random.seed(seed)
    torch.manual_seed(seed)
    try:
        import numpy

        numpy.random.seed(seed)
    except ImportError:
        pass


def _batches(loader: DataLoader, sampler: DistributedSampler, start_epoch: int = 0) -> Iterator[Any]:
    """Micro-batches forever; each pass over the data is a new epoch with its own shuffle on every rank."""
    epoch = start_epoch
    while True:
        sampler.set_epoch(epoch)  # without it every epoch repeats the first one's order
        yield from loader
        epoch += 1


class _Run:
    """One rank's training state: device, precision, process group."""

    def __init__(self, rank: RankInfo, accelerator: str, precision: str) -> None:
        if precision not in _AUTOCAST:
            raise ValueError(f"recipe.precision={precision!r}: expected one of {', '.join(_AUTOCAST)}")
        if accelerator not in ("cpu", "gpu"):
            raise ValueError(f"recipe.accelerator={accelerator!r}: expected cpu or gpu")
        self.rank = rank
        self.device = torch.device("cuda", rank.local_rank) if accelerator == "gpu" else torch.device("cpu")
        self.dtype = _AUTOCAST[precision]
        if self.device.type == "cuda":
            torch.cuda.set_device(self.device)

    def autocast(self) -> Any:
        if self.dtype is None:
            return contextlib.nullcontext()
        return torch.autocast(device_type=self.device.type, dtype=self.dtype)

    def loss(self, model: torch.nn.Module, batch: Any) -> torch.Tensor:
        inputs, target = (t.to(self.device, non_blocking=True) for t in batch)
        with self.autocast():
            output = model(inputs, target)
        return F.nll_loss(output.float(), target.view(-1))

    def validate(self, model: torch.nn.Module, loader: DataLoader, limit: int) -> float:
        """Mean loss over every rank's first ``limit`` validation batches, weighted by their samples."""
        model.eval()
        total = torch.zeros(2, device=self.device)
        with torch.no_grad():
            for index, batch in enumerate(loader):
                if index >= limit:
                    break
                total[0] += self.loss(model, batch) * len(batch[0])
                total[1] += len(batch[0])
        model.train()
        if self.rank.world_size > 1:
            dist.all_reduce(total)
        return float(total[0] / total[1])


def train(
    seed: int,
    accelerator: str,
    data_dir: str,
    block_size: int,
    val_fraction: float,
    lr: float,
    model: Dict[str, Any],
    max_steps: int,
    val_check_interval: int,
    limit_val_batches: int,
    gradient_clip_val: float,
    precision: str,
    resume: bool = True,
    fixed_buckets: Optional[bool] = None,
    output_dir: Optional[str] = None,
    batch_size: Optional[int] = None,
    accumulate_grad_batches: Optional[int] = None,
    init_timeout_s: float = 300,
) -> Dict[str, Any]:
    """Train; return rank 0's summary. ``batch_size``/``accumulate_grad_batches``: None = the launcher's plan.

    ``max_steps`` and ``val_check_interval`` count optimizer steps, in all three LM recipes.
    ``fixed_buckets``: DDP keeps one gradient-bucket layout (``recipes.lm_common.keep_ddp_buckets``).
    """
    rank = RankInfo.from_env()
    out = Path(output_dir or rank.job_dir or os.getcwd())
    micro, accumulate = rank.batch_sizes(batch_size, accumulate_grad_batches)
    run = _Run(rank, accelerator, precision)
    distributed = rank.world_size > 1
    if distributed:
        dist.init_process_group("nccl" if run.device.type == "cuda" else "gloo",
                                init_method=f"tcp://{rank.master_addr}:{rank.master_port}", rank=rank.rank,
                                world_size=rank.world_size, timeout=timedelta(seconds=init_timeout_s))
    try:
        return _train(rank, run, out, seed, data_dir, block_size, val_fraction, lr, model, max_steps,
                      val_check_interval, limit_val_batches, gradient_clip_val, resume, micro, accumulate,
                      fixed_buckets)
    finally:
        if distributed:
            dist.destroy_process_group()


def _train(rank: RankInfo, run: _Run, out: Path, seed: int, data_dir: str, block_size: int, val_fraction: float,
           lr: float, model: Dict[str, Any], max_steps: int, val_check_interval: int, limit_val_batches: int,
           gradient_clip_val: float, resume: bool, micro: int, accumulate: int,
           fixed_buckets: bool) -> Dict[str, Any]:
    _seed_everything(seed)
    train_set, val_set, vocab_size = load_splits(data_dir, block_size, val_fraction, seed)
    # the seed Lightning's samplers use (PL_GLOBAL_SEED): the same shuffle as lm and lm_fabric
    sampler = DistributedSampler(train_set, num_replicas=rank.world_size, rank=rank.rank, shuffle=True, seed=seed)
    val_sampler = DistributedSampler(val_set, num_replicas=rank.world_size, rank=rank.rank, shuffle=False)
    train_loader = DataLoader(train_set, batch_size=micro, sampler=sampler)
    val_loader = DataLoader(val_set, batch_size=micro, sampler=val_sampler)

    network = Transformer(vocab_size=vocab_size, **model).to(run.device)
    ddp = DistributedDataParallel(network, device_ids=[run.device.index] if run.device.type == "cuda" else None,
                                  find_unused_parameters=keep_ddp_buckets(fixed_buckets)) \
        if rank.world_size > 1 else network
    optimizer = torch.optim.SGD(ddp.parameters(), lr=lr)

    last = out / "checkpoints" / "last.pt"
    step, resumed = 0, resume_from(last, resume) is not None
    if resumed:  # every rank reads rank 0's checkpoint
        state = torch.load(last, map_location=run.device, weights_only=True)
        network.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        step = int(state["step"])

    clock, losses = StepClock(rank.world_size, accumulate), []
    val_loss, batches, index = float("nan"), _batches(train_loader, sampler), 0
    while step < max_steps:
        for micro_index in range(accumulate):
            batch = next(batches)
            clock.start()
            last_micro = micro_index == accumulate - 1
            # skip the gradient all-reduce until the last micro-batch of the step
            sync = contextlib.nullcontext() if last_micro or ddp is network else ddp.no_sync()
            with sync:
                loss = run.loss(ddp, batch)
                (loss / accumulate).backward()
            if last_micro:
                torch.nn.utils.clip_grad_norm_(ddp.parameters(), gradient_clip_val)
                optimizer.step()
                optimizer.zero_grad(set_to_none=True)
            clock.stop(index, len(batch[0]))
            index += 1
            losses.append(loss.item())
        step += 1
        row = {"step": step, "train_loss": losses[-1], "val_loss": ""}
        if step % val_check_interval == 0:
            val_loss = run.validate(ddp, val_loader, limit_val_batches)
            row["val_loss"] = val_loss
            if rank.is_main:
                print(f"lm_torch: step {step} train_loss {losses[-1]:.4f} val_loss {val_loss:.4f}", flush=True)
                _save(last, {"model": network.state_dict(), "optimizer": optimizer.state_dict(), "step": step})
            if rank.world_size > 1:
                dist.barrier()  # nobody resumes from a half-written checkpoint
        if rank.is_main:  # every step, as it happens: the launcher's progress reads it
            append_metrics(out / "metrics.csv", [row])

    result = summary(val_loss=val_loss, train_losses=losses, steps=step, world_size=rank.world_size, micro=micro,
                     accumulate=accumulate, samples_per_s=clock.samples_per_s, resumed=resumed,
                     digests=gather(weights_digest(network), rank.world_size), checkpoint=str(last))
    if rank.is_main:
        print(f"lm_torch: {step} steps on {rank.world_size} ranks (micro-batch {micro} x {accumulate}), "
              f"val_loss={val_loss:.4f}, weights identical on all ranks: {result['weights_in_sync']}", flush=True)
    return result


def _save(path: Path, state: Dict[str, Any]) -> None:
    save_atomic(state, path)  # a kill mid-save leaves the previous checkpoint intact
