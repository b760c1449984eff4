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

import csv
from pathlib import Path
from typing import Any, Dict, Optional

import lightning as L
import torch
import torch.nn.functional as F
from lightning.pytorch.demos import Transformer
from lightning.pytorch.loggers import Logger
from lightning.pytorch.strategies import DDPStrategy
from lightning.pytorch.utilities import rank_zero_only

from mmt.core.checkpoints import resume_from
from mmt.lightning import AtomicCheckpointIO, EpochEndCheckpoint, Heartbeat, RequeueOnSignal, cluster_environment
from recipes.corpus import load_splits, weights_digest
from recipes.lm_common import (
    RankPlan,
    StepClock,
    checkpoint_every,
    fault_drill,
    gather,
    keep_ddp_buckets,
    may_resume,
    report,
    summary,
)
from recipes.lm_config import LMConfig


class LanguageModel(L.LightningModule):
    def __init__(
        self, vocab_size: int, ninp: int, nhead: int, nhid: int, nlayers: int, dropout: float, lr: float
    ) -> None:
        super().__init__()
        self.save_hyperparameters()
        self.model = Transformer(
            vocab_size=vocab_size, ninp=ninp, nhead=nhead, nhid=nhid, nlayers=nlayers, dropout=dropout
        )
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

    def on_train_batch_end(
        self, trainer: L.Trainer, module: L.LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        self.clock.stop(self.batches, len(batch[0]))
        self.batches += 1


class AppendingCSV(Logger):
    """``metrics.csv`` as Lightning's CSVLogger writes it (epoch, step, train_loss, val_loss; empty cells where a
    row has no value), one row per logged step, appended at once: a run resumed after a requeue or a restart adds
    to what the earlier runs wrote (CSVLogger rewrites the file from its own rows when a new column appears, and
    so drops theirs), and the launcher's progress and the live page see every step as it is taken."""

    COLUMNS = ("epoch", "step", "train_loss", "val_loss")

    def __init__(self, path: Path) -> None:
        super().__init__()
        self.path = path

    @property
    def name(self) -> str:
        return "mmt"

    @property
    def version(self) -> str:
        return "0"

    @rank_zero_only
    def log_metrics(self, metrics: Dict[str, float], step: Optional[int] = None) -> None:
        row = {key: metrics[key] for key in self.COLUMNS if key in metrics}
        if not row.keys() - {"epoch", "step"}:
            return
        row["step"] = step if step is not None else row.get("step", "")
        new = not self.path.exists()
        if new:
            self.path.parent.mkdir(parents=True, exist_ok=True)  # an output_dir nothing has made yet
        with open(self.path, "a", newline="") as handle:
            writer = csv.DictWriter(handle, fieldnames=self.COLUMNS)
            if new:
                writer.writeheader()
            writer.writerow(row)

    @rank_zero_only
    def log_hyperparams(self, params: Any, *args: Any, **kwargs: Any) -> None:
        pass


class FaultDrill(L.Callback):
    """``recipe.fail_rank``/``recipe.fail_step`` (recipes.lm_common.fault_drill), after each optimizer step."""

    def __init__(self, config: LMConfig, plan: RankPlan) -> None:
        self.config, self.plan = config, plan

    def on_train_batch_end(self, trainer: L.Trainer, *args: Any) -> None:
        fault_drill(self.config, self.plan.rank, trainer.global_step)


def train(**recipe: Any) -> Dict[str, Any]:
    """Train; return rank 0's summary. ``recipe``: the keys under ``recipe:`` (``recipes.lm_config.LMConfig``)."""
    config = LMConfig.from_kwargs("lm", recipe)
    plan = RankPlan.from_env(config)
    L.seed_everything(config.seed, workers=True, verbose=False)
    data = LanguageData(config.data_dir, config.block_size, config.val_fraction, plan.micro, config.seed)
    module = LanguageModel(vocab_size=data.vocab_size, lr=config.lr, **config.model.kwargs())
    throughput = Throughput(StepClock(plan.rank.world_size, plan.accumulate))
    last = plan.out / "checkpoints" / "last.ckpt"
    trainer = _trainer(config, plan, throughput, last)
    plan.rank.check_world_size(trainer.world_size)
    resumed = resume_from(last, config.resume) is not None
    trainer.fit(module, datamodule=data, ckpt_path=str(last) if resumed else None)
    return _result(trainer, module, throughput, plan, resumed, last)


def _trainer(config: LMConfig, plan: RankPlan, throughput: Throughput, last: Path) -> L.Trainer:
    """The Trainer for the launcher's world: DDP over every rank, the plan's accumulation, mmt's checkpoint IO and
    requeue handling, metrics.csv written at every step."""
    checkpoints = L.pytorch.callbacks.ModelCheckpoint(
        dirpath=plan.out / "checkpoints",
        save_last=True,
        save_top_k=0,
        every_n_train_steps=checkpoint_every(config, plan.rank),
    )
    environment = cluster_environment()  # under SLURM: Lightning's SLURM environment, its auto-requeue off
    return L.Trainer(
        accelerator=config.accelerator,
        num_nodes=plan.rank.num_nodes,
        devices=plan.rank.local_world_size,
        strategy=DDPStrategy(find_unused_parameters=keep_ddp_buckets(config.fixed_buckets))
        if plan.rank.world_size > 1
        else "auto",
        max_steps=config.max_steps,
        val_check_interval=config.val_check_interval * plan.accumulate,  # Lightning counts micro-batches here
        check_val_every_n_epoch=None,
        limit_val_batches=config.limit_val_batches,
        num_sanity_val_steps=0,
        accumulate_grad_batches=plan.accumulate,
        gradient_clip_val=config.gradient_clip_val,
        precision=config.precision,
        # every step reaches metrics.csv at once: the launcher's progress and the live page read it
        logger=AppendingCSV(plan.out / "metrics.csv"),
        log_every_n_steps=1,
        # mmt owns the requeue signal; the heartbeat is what its hang detection watches; a job that may restart, or
        # that SLURM may requeue by itself (a lost node), also checkpoints where it resumes exactly
        callbacks=[
            checkpoints,
            throughput,
            RequeueOnSignal(str(last)),
            Heartbeat(),
            FaultDrill(config, plan),
            *([EpochEndCheckpoint(str(last))] if may_resume(plan.rank) else []),
        ],
        plugins=[AtomicCheckpointIO(), *([environment] if environment else [])],
        default_root_dir=plan.out,
        enable_progress_bar=False,
        enable_model_summary=plan.rank.is_main,
    )


def _result(
    trainer: L.Trainer, module: LanguageModel, throughput: Throughput, plan: RankPlan, resumed: bool, last: Path
) -> Dict[str, Any]:
    """The summary every LM recipe returns, plus the cluster environment Lightning ran under; rank 0 reports it."""
    result = summary(
        val_loss=float(trainer.callback_metrics.get("val_loss", float("nan"))),
        train_losses=module.train_losses,
        steps=trainer.global_step,
        world_size=trainer.world_size,
        micro=plan.micro,
        accumulate=plan.accumulate,
        samples_per_s=throughput.clock.samples_per_s,
        resumed=resumed,
        digests=gather(weights_digest(module), plan.rank.world_size),
        checkpoint=str(last),
    )
    environment = getattr(trainer.strategy, "cluster_environment", None)  # a single device has none
    result["cluster_environment"] = type(environment).__name__ if environment is not None else None
    if plan.rank.is_main:
        report("lm", result)
    return result
