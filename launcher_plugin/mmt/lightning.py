"""Lightning glue for mmt jobs: the cluster environment to use, atomic checkpoints, the requeue-on-signal callback,
the heartbeat that hang detection watches.

Imports Lightning; import this module only from training code.
"""

import time
from pathlib import Path
from typing import Any, Optional

import lightning as L
from lightning.fabric.plugins import TorchCheckpointIO
from lightning.fabric.plugins.environments import SLURMEnvironment

from mmt.core import preemption, stacks
from mmt.core.checkpoints import save_atomic


def cluster_environment() -> Optional[SLURMEnvironment]:
    """Under SLURM: Lightning's SLURMEnvironment with its auto-requeue off (mmt owns requeueing); else None (auto).

    Lightning then validates ``devices == --ntasks-per-node`` and ``num_nodes == --nodes`` itself.
    """
    return SLURMEnvironment(auto_requeue=False) if SLURMEnvironment.detect() else None


class AtomicCheckpointIO(TorchCheckpointIO):
    """Checkpoints written to a temp file in their own dir, then renamed into place (``plugins=[...]`` of a Trainer
    or of Fabric). Lightning's own save goes through fsspec's transaction, which writes the temp file in the
    system's temp dir and moves it: across filesystems (a tmpfs /tmp, a job dir on shared storage) that move is a
    copy, and a job killed during it leaves a truncated ``last.ckpt`` that every rerun would resume from."""

    def save_checkpoint(self, checkpoint: dict, path: Any, storage_options: Optional[Any] = None) -> None:
        if storage_options is not None or "://" in str(path):  # object stores: Lightning's own way
            super().save_checkpoint(checkpoint, path, storage_options)
            return
        save_atomic(checkpoint, Path(path))


class Heartbeat(L.Callback):
    """Tells mmt's hang detection (``hydra.launcher.hang_timeout_min``) that this rank makes progress: at every
    training and validation batch, and before each checkpoint is written. A rank stuck in a collective stops
    beating; one validating or saving goes on."""

    def on_train_batch_end(self, *args: Any) -> None:
        stacks.beat()

    def on_validation_batch_end(self, *args: Any) -> None:
        stacks.beat()

    def on_save_checkpoint(self, *args: Any) -> None:
        stacks.beat()


class EpochEndCheckpoint(L.Callback):
    """A checkpoint at the last batch of every epoch, where a job that may be restarted after a failure
    (``hydra.launcher.max_restarts``) resumes exactly: the state Lightning's loops resume from without a stateful
    data loader (see RequeueOnSignal), with the RNG states that RequeueOnSignal stores. A checkpoint taken mid-epoch
    would restart that epoch's data order."""

    def __init__(self, checkpoint_path: str) -> None:
        self.checkpoint_path = checkpoint_path

    def on_train_batch_end(self, trainer: L.Trainer, *args: Any) -> None:
        if not trainer.fit_loop.epoch_loop.batch_progress.is_last_batch:
            return
        if trainer.max_steps > 0 and trainer.global_step >= trainer.max_steps:
            return  # the end: nothing left to resume
        trainer.save_checkpoint(self.checkpoint_path)


class RequeueOnSignal(L.Callback):
    """On the requeue signal: checkpoint at the end of the epoch, requeue the job, stop every rank.

    The ranks agree at every step (one tiny all-reduce, only inside an mmt SLURM task), so all of them save the
    same step. The checkpoint also stores the RNG states, so dropout and shuffling continue as if nothing
    happened: a requeued run ends with the weights of an uninterrupted one. If the signal comes in the last
    epoch, training finishes instead.

    Why the end of the last batch of an epoch, and not ``on_train_epoch_end`` or mid-epoch: mid-epoch, Lightning
    restarts the epoch's data order; and a max_steps fit saved in ``on_train_epoch_end`` (or at the next epoch's
    start) resumes in 2.6 with one extra batch from a fresh iterator, so the data order diverges. A checkpoint
    from ``on_train_batch_end`` of the epoch's last batch is the state Lightning's loops resume exactly.
    """

    def __init__(self, checkpoint_path: str) -> None:
        self.checkpoint_path = checkpoint_path
        self.pending = False

    def on_train_batch_end(self, trainer: L.Trainer, *args: Any) -> None:
        if not preemption.installed():
            return
        if not self.pending:
            self.pending = trainer.strategy.reduce_boolean_decision(preemption.requested(), all=False)
        if self.pending and trainer.fit_loop.epoch_loop.batch_progress.is_last_batch:
            self._checkpoint_and_requeue(trainer)

    def _checkpoint_and_requeue(self, trainer: L.Trainer) -> None:
        if trainer.max_steps > 0 and trainer.global_step >= trainer.max_steps:
            return  # the last epoch: finishing is better than requeueing
        if not preemption.requeue_allowed():
            print("mmt: requeue limit reached; training on until SLURM stops the job", flush=True)
            self.pending = False
            return
        trainer.save_checkpoint(self.checkpoint_path)
        trainer.strategy.barrier("mmt-requeue")
        if trainer.is_global_zero:
            preemption.requeue()
            print(
                f"mmt: checkpoint {self.checkpoint_path} written at step {trainer.global_step}; job requeued",
                flush=True,
            )
        time.sleep(1.0)  # let the controller register the requeue before any task exits
        raise preemption.Requeued(f"requeued at step {trainer.global_step}")

    def state_dict(self) -> dict:
        return {"rng": _rng_state()}

    def load_state_dict(self, state_dict: dict) -> None:
        _set_rng_state(state_dict["rng"])


def _rng_state() -> dict:
    import random

    import numpy
    import torch

    # plain lists and tensors only: Lightning loads checkpoints with torch.load(weights_only=True)
    kind, keys, position, has_gauss, cached = numpy.random.get_state()
    return {
        "torch": torch.get_rng_state(),
        "python": random.getstate(),
        "numpy": [kind, numpy.asarray(keys).tolist(), position, has_gauss, cached],
    }


def _set_rng_state(state: dict) -> None:
    import random

    import numpy
    import torch

    torch.set_rng_state(state["torch"])
    random.setstate(state["python"])
    kind, keys, position, has_gauss, cached = state["numpy"]
    numpy.random.set_state((kind, numpy.array(keys, dtype=numpy.uint32), position, has_gauss, cached))
