"""recipe=lm_fabric: the ``lm`` recipe's model, data and batch plan, trained with Lightning Fabric.

Fabric gets ``num_nodes``/``devices`` from the rank contract; ``fabric.launch()`` spawns nothing because the launcher
created every rank (LOCAL_RANK is set). Fabric inserts the DistributedSampler and advances its epoch; accumulation
skips the gradient all-reduce on all but the last micro-batch (``no_backward_sync``). Rank 0 writes
``metrics.csv`` and ``checkpoints/last.ckpt`` (``fabric.save``); a rerun in the same dir resumes from it.

    python train.py -m recipe=lm_fabric num_nodes=2 devices=2
"""

from pathlib import Path
from typing import Any, Dict, Iterator, Tuple

import lightning as L
import torch
import torch.nn.functional as F
from lightning.fabric.strategies import DDPStrategy
from lightning.pytorch.demos import Transformer
from torch.utils.data import DataLoader

from mmt import RankInfo
from mmt.core.checkpoints import resume_from
from mmt.core.stacks import beat
from mmt.lightning import AtomicCheckpointIO
from recipes.corpus import load_splits, weights_digest
from recipes.lm_common import Progress, RankPlan, append_metrics, fault_drill, gather, keep_ddp_buckets, report, summary
from recipes.lm_config import LMConfig


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


def train(**recipe: Any) -> Dict[str, Any]:
    """Train; return rank 0's summary. ``recipe``: the keys under ``recipe:`` (``recipes.lm_config.LMConfig``)."""
    config = LMConfig.from_kwargs("lm_fabric", recipe)
    plan = RankPlan.from_env(config)
    fabric = _fabric(config, plan.rank)
    network, optimizer, train_loader, val_loader = _setup(fabric, config, plan.micro)
    last = plan.out / "checkpoints" / "last.ckpt"
    state: Dict[str, Any] = {"model": network, "optimizer": optimizer, "step": 0}
    resumed = resume_from(last, config.resume) is not None
    if resumed:
        fabric.load(last, state)
    progress = _fit(fabric, config, plan, state, train_loader, val_loader, last)
    result = summary(
        val_loss=progress.val_loss,
        train_losses=progress.losses,
        steps=state["step"],
        world_size=fabric.world_size,
        micro=plan.micro,
        accumulate=plan.accumulate,
        samples_per_s=progress.clock.samples_per_s,
        resumed=resumed,
        digests=gather(weights_digest(network.module), plan.rank.world_size),
        checkpoint=str(last),
    )
    if fabric.global_rank == 0:
        report("lm_fabric", result)
    return result


def _fabric(config: LMConfig, rank: RankInfo) -> L.Fabric:
    """Fabric for the launcher's world (DDP over every rank), launched (it spawns nothing: the ranks exist)."""
    fabric = L.Fabric(
        accelerator=config.accelerator,
        num_nodes=rank.num_nodes,
        devices=rank.local_world_size,
        strategy=DDPStrategy(find_unused_parameters=keep_ddp_buckets(config.fixed_buckets))
        if rank.world_size > 1
        else "auto",
        precision=config.precision,
        plugins=[AtomicCheckpointIO()],
    )
    fabric.launch()
    rank.check_world_size(fabric.world_size, "fabric")
    return fabric


def _setup(fabric: L.Fabric, config: LMConfig, micro: int) -> Tuple[Any, Any, DataLoader, DataLoader]:
    """Seed, then the data, the model and its optimizer, set up by Fabric (it adds the DistributedSamplers)."""
    fabric.seed_everything(config.seed, workers=True, verbose=False)
    train_set, val_set, vocab_size = load_splits(config.data_dir, config.block_size, config.val_fraction, config.seed)
    network = Transformer(vocab_size=vocab_size, **config.model.kwargs())
    optimizer = torch.optim.SGD(network.parameters(), lr=config.lr)
    network, optimizer = fabric.setup(network, optimizer)
    train_loader, val_loader = fabric.setup_dataloaders(
        DataLoader(train_set, batch_size=micro, shuffle=True), DataLoader(val_set, batch_size=micro, shuffle=False)
    )
    return network, optimizer, train_loader, val_loader


def _fit(
    fabric: L.Fabric,
    config: LMConfig,
    plan: RankPlan,
    state: Dict[str, Any],
    train_loader: DataLoader,
    val_loader: DataLoader,
    last: Path,
) -> Progress:
    """Optimizer steps up to ``config.max_steps``; validate and checkpoint every ``val_check_interval``."""
    network, optimizer = state["model"], state["optimizer"]
    progress, batches = Progress(plan.rank.world_size, plan.accumulate), _batches(train_loader)
    while state["step"] < config.max_steps:
        _optimizer_step(fabric, network, optimizer, batches, config.gradient_clip_val, plan.accumulate, progress)
        beat()  # progress, for mmt's hang detection
        fault_drill(config, plan.rank, state["step"] + 1)
        state["step"] += 1
        row = progress.row(state["step"])
        if state["step"] % config.val_check_interval == 0:
            progress.val_loss = _validate(fabric, network, val_loader, config.limit_val_batches)
            row["val_loss"] = progress.val_loss
            fabric.save(last, state)  # rank 0 writes
            if fabric.global_rank == 0:  # fabric.print would print once per node
                print(
                    f"lm_fabric: step {state['step']} train_loss {progress.losses[-1]:.4f} "
                    f"val_loss {progress.val_loss:.4f}",
                    flush=True,
                )
        if fabric.global_rank == 0:  # every step, as it happens: the launcher's progress reads it
            append_metrics(plan.out / "metrics.csv", [row])
    return progress


def _optimizer_step(
    fabric: L.Fabric,
    network: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    batches: Iterator[Any],
    clip: float,
    accumulate: int,
    progress: Progress,
) -> None:
    """One optimizer step over ``accumulate`` micro-batches; the gradient all-reduce only on the last."""
    for micro_index in range(accumulate):
        batch = next(batches)
        progress.clock.start()
        last_micro = micro_index == accumulate - 1
        with fabric.no_backward_sync(network, enabled=not last_micro):
            loss = _loss(network, batch)
            fabric.backward(loss / accumulate)
        if last_micro:
            fabric.clip_gradients(network, optimizer, max_norm=clip)
            optimizer.step()
            optimizer.zero_grad()
        progress.micro_batch_done(len(batch[0]), loss)
