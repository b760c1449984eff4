"""recipe=lm: the seed's Transformer language model, trained with the Lightning Trainer under DDP.

The launcher starts every rank (LOCAL_RANK is set, so Lightning spawns nothing) and hands over the topology
through the rank contract; the Trainer gets ``num_nodes``/``devices`` from it and refuses to train if its world
differs from the launcher's. The batch plan (``batch.global_size`` split into micro-batch x accumulation for this
job's world and machine) arrives the same way: micro-batch = DataLoader batch_size, accumulation =
``accumulate_grad_batches``. Rank 0 writes metrics (``metrics.csv``) and ``checkpoints/last.ckpt``; a rerun or a
requeued job in the same dir resumes from that checkpoint. ``lm_fabric`` and ``lm_torch`` train the same model on
the same data with Lightning Fabric and with raw PyTorch DDP.

    python train.py -m num_nodes=1,2 devices=2
    python train.py -m recipe.lr=0.5,1.0 num_nodes=2 devices=2
"""

import os
from pathlib import Path
from typing import Any, Dict, Optional

import lightning as L
import torch
import torch.nn.functional as F
from lightning.pytorch.demos import Transformer
from lightning.pytorch.strategies import DDPStrategy

from mmt import RankInfo
from mmt.checkpoints import resume_from
from mmt.lightning import AtomicCheckpointIO, RequeueOnSignal, cluster_environment
from recipes.corpus import load_splits, weights_digest
from recipes.lm_common import StepClock, gather, keep_ddp_buckets, summary


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
    """Times the training steps with the shared ``StepClock`` (what ``lm_fabric``/``lm_torch`` time too)."""

    def __init__(self, clock: StepClock) -> None:
        self.clock, self.batches = clock, 0

    def on_train_batch_start(self, *args: Any) -> None:
        self.clock.start()

    def on_train_batch_end(self, trainer: L.Trainer, module: L.LightningModule, outputs: Any, batch: Any,
                           batch_idx: int) -> None:
        self.clock.stop(self.batches, len(batch[0]))
        self.batches += 1


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
    ``fixed_buckets``: DDP keeps one gradient-bucket layout, so a requeued run resumes bit for bit
    (``recipes.lm_common.keep_ddp_buckets``).
    """
    rank = RankInfo.from_env()
    out = Path(output_dir or rank.job_dir or os.getcwd())
    batch_size, accumulate_grad_batches = rank.batch_sizes(batch_size, accumulate_grad_batches)
    L.seed_everything(seed, workers=True, verbose=False)
    data = LanguageData(data_dir, block_size, val_fraction, batch_size, seed)
    module = LanguageModel(vocab_size=data.vocab_size, lr=lr, **model)
    throughput = Throughput(StepClock(rank.world_size, accumulate_grad_batches))
    checkpoints = L.pytorch.callbacks.ModelCheckpoint(dirpath=out / "checkpoints", save_last=True, save_top_k=0)
    last = out / "checkpoints" / "last.ckpt"
    environment = cluster_environment()  # under SLURM: Lightning's SLURM environment, its auto-requeue off
    trainer = L.Trainer(
        accelerator=accelerator,
        num_nodes=rank.num_nodes,
        devices=rank.local_world_size,
        strategy=DDPStrategy(find_unused_parameters=keep_ddp_buckets(fixed_buckets)) if rank.world_size > 1
        else "auto",
        max_steps=max_steps,
        val_check_interval=val_check_interval * accumulate_grad_batches,  # Lightning counts micro-batches here
        check_val_every_n_epoch=None,
        limit_val_batches=limit_val_batches,
        num_sanity_val_steps=0,
        accumulate_grad_batches=accumulate_grad_batches,
        gradient_clip_val=gradient_clip_val,
        precision=precision,
        # every step reaches metrics.csv at once: the launcher's progress and the live page read it
        logger=L.pytorch.loggers.CSVLogger(save_dir=out, name="", version="", flush_logs_every_n_steps=1),
        log_every_n_steps=1,
        callbacks=[checkpoints, throughput, RequeueOnSignal(str(last))],  # mmt owns the requeue signal
        plugins=[AtomicCheckpointIO(), *([environment] if environment else [])],
        default_root_dir=out,
        enable_progress_bar=False,
        enable_model_summary=rank.is_main,
    )
    rank.check_world_size(trainer.world_size)
    resumed = resume_from(last, resume) is not None
    trainer.fit(module, datamodule=data, ckpt_path=str(last) if resumed else None)

    result = summary(val_loss=float(trainer.callback_metrics.get("val_loss", float("nan"))),
                     train_losses=module.train_losses,
                     steps=trainer.global_step, world_size=trainer.world_size, micro=batch_size,
                     accumulate=accumulate_grad_batches, samples_per_s=throughput.clock.samples_per_s,
                     resumed=resumed, digests=gather(weights_digest(module), rank.world_size), checkpoint=str(last))
    environment = getattr(trainer.strategy, "cluster_environment", None)  # a single device has none
    result["cluster_environment"] = type(environment).__name__ if environment is not None else None
    if rank.is_main:
        print(f"lm: {trainer.global_step} steps on {rank.world_size} ranks (micro-batch {batch_size} x "
              f"{accumulate_grad_batches}), val_loss={result['val_loss']:.4f}, weights identical on all ranks: "
              f"{result['weights_in_sync']}", flush=True)
    return result
