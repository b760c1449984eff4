"""recipe=lm_fabric: the ``lm`` recipe's model, data and batch plan, trained with Lightning Fabric.

Fabric gets ``num_nodes``/``devices`` from the rank contract; ``fabric.launch()`` spawns nothing because the launcher
created every rank (LOCAL_RANK is set). Fabric inserts the DistributedSampler and advances its epoch; accumulation
skips the gradient all-reduce on all but the last micro-batch (``no_backward_sync``). Rank 0 writes
``metrics.csv`` and ``checkpoints/last.ckpt`` (``fabric.save``); a rerun in the same dir resumes from it.

    python train.py -m recipe=lm_fabric num_nodes=2 devices=2
"""

import os
from pathlib import Path
from typing import Any, Dict, Iterator, Optional

import lightning as L
from lightning.fabric.strategies import DDPStrategy
import torch
import torch.nn.functional as F
from lightning.pytorch.demos import Transformer
from torch.utils.data import DataLoader

from mmt import RankInfo
from mmt.checkpoints import resume_from
from mmt.lightning import AtomicCheckpointIO
from recipes.corpus import load_splits, weights_digest
from recipes.lm_common import StepClock, append_metrics, gather, keep_ddp_buckets, summary


def _loss(model: torch.nn.Module, batch: Any) -> torch.Tensor:
    inputs, target = batch
    return F.nll_loss(model(inputs, target), target.view(-1))


def _batches(loader: DataLoader) -> Iterator[Any]:
    """Micro-batches forever, epoch after epoch (Fabric's loader sets the sampler's epoch on each pass)."""
    while True:
        yield from loader


def _validate(fabric: L.Fabric, model: torch.nn.Module, loader: DataLoader, limit: int) -> float:
    """Mean loss over every rank's first ``limit`` validation batches, weighted by their samples."""
    model.eval()
    total = torch.zeros(2, device=fabric.device)
    with torch.no_grad():
        for index, batch in enumerate(loader):
            if index >= limit:
                break
            total[0] += _loss(model, batch) * len(batch[0])
            total[1] += len(batch[0])
    model.train()
    total = fabric.all_reduce(total, reduce_op="sum")
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
) -> Dict[str, Any]:
    """Train; return rank 0's summary. ``batch_size``/``accumulate_grad_batches``: None = the launcher's plan.

    ``max_steps`` and ``val_check_interval`` count optimizer steps, in all three LM recipes.
    ``fixed_buckets``: DDP keeps one gradient-bucket layout (``recipes.lm_common.keep_ddp_buckets``).
    """
    rank = RankInfo.from_env()
    out = Path(output_dir or rank.job_dir or os.getcwd())
    micro, accumulate = rank.batch_sizes(batch_size, accumulate_grad_batches)
    fabric = L.Fabric(accelerator=accelerator, num_nodes=rank.num_nodes, devices=rank.local_world_size,
                      strategy=DDPStrategy(find_unused_parameters=keep_ddp_buckets(fixed_buckets))
                      if rank.world_size > 1 else "auto",
                      precision=precision, plugins=[AtomicCheckpointIO()])
    fabric.launch()
    rank.check_world_size(fabric.world_size, "fabric")
    fabric.seed_everything(seed, workers=True, verbose=False)
    train_set, val_set, vocab_size = load_splits(data_dir, block_size, val_fraction, seed)
    network = Transformer(vocab_size=vocab_size, **model)
    optimizer = torch.optim.SGD(network.parameters(), lr=lr)
    network, optimizer = fabric.setup(network, optimizer)
    train_loader, val_loader = fabric.setup_dataloaders(DataLoader(train_set, batch_size=micro, shuffle=True),
                                                        DataLoader(val_set, batch_size=micro, shuffle=False))

    last = out / "checkpoints" / "last.ckpt"
    state: Dict[str, Any] = {"model": network, "optimizer": optimizer, "step": 0}
    resumed = resume_from(last, resume) is not None
    if resumed:
        fabric.load(last, state)
    clock, losses = StepClock(rank.world_size, accumulate), []
    val_loss, batches = float("nan"), _batches(train_loader)
    index = 0
    while state["step"] < max_steps:
        for micro_index in range(accumulate):
            batch = next(batches)
            clock.start()
            last_micro = micro_index == accumulate - 1
            with fabric.no_backward_sync(network, enabled=not last_micro):
                loss = _loss(network, batch)
                fabric.backward(loss / accumulate)
            if last_micro:
                fabric.clip_gradients(network, optimizer, max_norm=gradient_clip_val)
                optimizer.step()
                optimizer.zero_grad()
            clock.stop(index, len(batch[0]))
            index += 1
            losses.append(loss.item())
        state["step"] += 1
        row = {"step": state["step"], "train_loss": losses[-1], "val_loss": ""}
        if state["step"] % val_check_interval == 0:
            val_loss = _validate(fabric, network, val_loader, limit_val_batches)
            row["val_loss"] = val_loss
            fabric.save(last, state)  # rank 0 writes
            if fabric.global_rank == 0:  # fabric.print would print once per node
                print(f"lm_fabric: step {state['step']} train_loss {losses[-1]:.4f} val_loss {val_loss:.4f}",
                      flush=True)
        if fabric.global_rank == 0:  # every step, as it happens: the launcher's progress reads it
            append_metrics(out / "metrics.csv", [row])

    result = summary(val_loss=val_loss, train_losses=losses, steps=state["step"], world_size=fabric.world_size,
                     micro=micro, accumulate=accumulate, samples_per_s=clock.samples_per_s, resumed=resumed,
                     digests=gather(weights_digest(network.module), rank.world_size), checkpoint=str(last))
    if fabric.global_rank == 0:
        print(f"lm_fabric: {state['step']} steps on {fabric.world_size} ranks (micro-batch {micro} x {accumulate}), "
              f"val_loss={val_loss:.4f}, weights identical on all ranks: {result['weights_in_sync']}", flush=True)
    return result
