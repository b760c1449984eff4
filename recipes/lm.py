"""recipe=lm: the seed's Transformer language model, trained with the Lightning Trainer under DDP.

The launcher starts every rank (LOCAL_RANK is set, so Lightning spawns nothing) and hands over the topology
through the rank contract; the Trainer gets ``num_nodes``/``devices`` from it and refuses to train if its world
differs from the launcher's. Rank 0 writes metrics (``metrics.csv``) and ``checkpoints/last.ckpt``; a rerun or a
requeued job in the same dir resumes from that checkpoint.

    python train.py -m num_nodes=1,2 devices=2
    python train.py -m recipe.lr=0.5,1.0 num_nodes=2 devices=2
"""

import os
import time
from pathlib import Path
from typing import Any, Dict, Optional

import lightning as L
import torch
import torch.nn.functional as F
from lightning.pytorch.demos import Transformer

from mmt import RankInfo
from recipes.corpus import load_splits, weights_digest


class LanguageModel(L.LightningModule):
    def __init__(self, vocab_size: int, ninp: int, nhead: int, nhid: int, nlayers: int, dropout: float,
                 lr: float) -> None:
        super().__init__()
        self.save_hyperparameters()
        self.model = Transformer(vocab_size=vocab_size, ninp=ninp, nhead=nhead, nhid=nhid, nlayers=nlayers,
                                 dropout=dropout)
        self.train_losses: list = []

    def _loss(self, batch: Any) -> torch.Tensor:
        inputs, target = batch
        output = self.model(inputs, target)
        return F.nll_loss(output, target.view(-1))

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        loss = self._loss(batch)
        self.log("train_loss", loss, sync_dist=False)
        self.train_losses.append(loss.item())
        return loss

    def validation_step(self, batch: Any, batch_idx: int) -> None:
        self.log("val_loss", self._loss(batch), sync_dist=True)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=self.hparams.lr)


class LanguageData(L.LightningDataModule):
    def __init__(self, data_dir: str, block_size: int, val_fraction: float, batch_size: int, seed: int) -> None:
        super().__init__()
        self.train_set, self.val_set, self.vocab_size = load_splits(data_dir, block_size, val_fraction, seed)
        self.batch_size = batch_size

    def train_dataloader(self) -> torch.utils.data.DataLoader:
        return torch.utils.data.DataLoader(self.train_set, batch_size=self.batch_size, shuffle=True)

    def val_dataloader(self) -> torch.utils.data.DataLoader:
        return torch.utils.data.DataLoader(self.val_set, batch_size=self.batch_size, shuffle=False)


class Throughput(L.Callback):
    """Samples per second over the training loop, the first step (warm-up) excluded."""

    def __init__(self, global_batch: int) -> None:
        self.global_batch, self.start, self.steps, self.end = global_batch, None, 0, None

    def on_train_batch_end(self, trainer: L.Trainer, *args: Any) -> None:
        now = time.perf_counter()
        if self.start is None:
            self.start = now
        else:
            self.steps, self.end = self.steps + 1, now

    @property
    def samples_per_s(self) -> Optional[float]:
        if not self.steps or self.end is None or self.start is None:
            return None
        return self.steps * self.global_batch / (self.end - self.start)


def _gather(value: Any, world_size: int) -> list:
    if not torch.distributed.is_available() or not torch.distributed.is_initialized():
        return [value]
    gathered: list = [None] * world_size
    torch.distributed.all_gather_object(gathered, value)
    return gathered


def train(
    seed: int,
    accelerator: str,
    data_dir: str,
    block_size: int,
    val_fraction: float,
    batch_size: int,
    accumulate_grad_batches: int,
    lr: float,
    model: Dict[str, Any],
    max_steps: int,
    val_check_interval: int,
    limit_val_batches: int,
    gradient_clip_val: float,
    precision: str,
    resume: bool = True,
    output_dir: Optional[str] = None,
) -> Dict[str, Any]:
    rank = RankInfo.from_env()
    out = Path(output_dir or rank.job_dir or os.getcwd())
    L.seed_everything(seed, workers=True, verbose=False)
    data = LanguageData(data_dir, block_size, val_fraction, batch_size, seed)
    module = LanguageModel(vocab_size=data.vocab_size, lr=lr, **model)
    throughput = Throughput(batch_size * accumulate_grad_batches * rank.world_size)
    checkpoints = L.pytorch.callbacks.ModelCheckpoint(dirpath=out / "checkpoints", save_last=True, save_top_k=0)
    trainer = L.Trainer(
        accelerator=accelerator,
        num_nodes=rank.num_nodes,
        devices=rank.local_world_size,
        strategy="ddp" if rank.world_size > 1 else "auto",
        max_steps=max_steps,
        val_check_interval=val_check_interval,
        check_val_every_n_epoch=None,
        limit_val_batches=limit_val_batches,
        num_sanity_val_steps=0,
        accumulate_grad_batches=accumulate_grad_batches,
        gradient_clip_val=gradient_clip_val,
        precision=precision,
        logger=L.pytorch.loggers.CSVLogger(save_dir=out, name="", version=""),
        log_every_n_steps=1,
        callbacks=[checkpoints, throughput],
        default_root_dir=out,
        enable_progress_bar=False,
        enable_model_summary=rank.is_main,
    )
    rank.check_world_size(trainer.world_size)
    last = out / "checkpoints" / "last.ckpt"
    resumed = resume and last.exists()
    trainer.fit(module, datamodule=data, ckpt_path=str(last) if resumed else None)

    digests = _gather(weights_digest(module), rank.world_size)
    losses = module.train_losses
    result = {
        "val_loss": float(trainer.callback_metrics["val_loss"]),
        "train_loss_first": losses[0] if losses else None,
        "train_loss_last": sum(losses[-5:]) / len(losses[-5:]) if losses else None,
        "steps": trainer.global_step,
        "world_size": trainer.world_size,
        "global_batch_size": batch_size * accumulate_grad_batches * rank.world_size,
        "samples_per_s": throughput.samples_per_s,
        "resumed_from_checkpoint": resumed,
        "weights_in_sync": len(set(digests)) == 1,
        "weight_digests": digests,
        "checkpoint": str(last),
    }
    if rank.is_main:
        print(f"lm: {trainer.global_step} steps on {rank.world_size} ranks, val_loss={result['val_loss']:.4f}, "
              f"weights identical on all ranks: {result['weights_in_sync']}", flush=True)
    return result
