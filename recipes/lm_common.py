"""What the three LM recipes (Trainer ``lm``, Fabric ``lm_fabric``, raw PyTorch ``lm_torch``) share, so that their
results and speed compare: the same data, the same model, the same batch plan and the same way of measuring.
"""

import csv
import os
import signal
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Dict, List, Optional

from recipes.lm_config import LMConfig

if TYPE_CHECKING:
    from mmt import RankInfo


@dataclass(frozen=True)
class RankPlan:
    """This rank's place (the launcher's rank contract), where it writes, and its share of the batch plan."""

    rank: "RankInfo"
    out: Path
    micro: int  # micro-batch: the DataLoader's batch_size
    accumulate: int  # micro-batches per optimizer step

    @classmethod
    def from_env(cls, config: LMConfig) -> "RankPlan":
        """``config.batch_size``/``accumulate_grad_batches`` where set (they must agree with the launcher's plan),
        else the plan's; output in ``config.output_dir``, else the job dir, else the working directory."""
        from mmt import RankInfo

        rank = RankInfo.from_env()
        out = Path(config.output_dir or rank.job_dir or os.getcwd())
        micro, accumulate = rank.batch_sizes(config.batch_size, config.accumulate_grad_batches)
        return cls(rank, out, micro, accumulate)


# an elastic job's checkpoint interval when the recipe sets none: a lost node costs at most these optimizer steps
ELASTIC_CHECKPOINT_EVERY = 10


def may_resume(rank: "RankInfo") -> bool:
    """Whether this run may be resumed from a checkpoint by a later one: a job that may restart after a failure, a
    SLURM task that may be requeued, an elastic job whose world may form again."""
    from mmt.core import preemption

    return bool(rank.max_restarts) or preemption.may_be_requeued() or rank.elastic_nodes is not None


def checkpoint_every(config: LMConfig, rank: "RankInfo") -> Optional[int]:
    """Optimizer steps between checkpoints: the recipe's ``checkpoint_every``, else an elastic job's default."""
    if config.checkpoint_every is not None:
        return config.checkpoint_every
    return ELASTIC_CHECKPOINT_EVERY if rank.elastic_nodes is not None else None


def keep_ddp_buckets(fixed_buckets: Optional[bool]) -> bool:
    """Whether DDP keeps its gradient buckets in their first layout (``recipe.fixed_buckets``; None = only where
    the job may resume from a checkpoint: inside an mmt SLURM task, which may be requeued, or in a job that may be
    restarted after a failure, ``hydra.launcher.max_restarts``).

    DDP re-lays its buckets out after each process's first step, and a ring all-reduce sums each element in an
    order set by its place in the bucket, so a requeued run's first step would differ from the uninterrupted run
    in the last bits. DDP keeps the layout when it looks for unused parameters (``find_unused_parameters``), at a
    cost within noise on the 2 x 2 CPU job (~199 samples/s either way), but it then logs a one-time warning that
    none were unused: hence only where a requeue needs it.
    """
    from mmt.core import preemption

    if fixed_buckets is not None:
        return fixed_buckets
    from mmt import RankInfo

    rank = RankInfo.from_env()
    return preemption.installed() or rank.max_restarts > 0 or rank.elastic_nodes is not None


def fault_drill(config: LMConfig, rank: "RankInfo", step: int) -> None:
    """``recipe.fail_rank``/``recipe.fail_step``: that rank dies by SIGKILL after that step of the first run."""
    if config.fail_rank == rank.rank and config.fail_step == step and rank.restart_count == 0:
        print(f"fault drill: rank {rank.rank} kills itself after step {step}", flush=True)
        os.kill(os.getpid(), signal.SIGKILL)


class StepClock:
    """Samples per second inside the training steps (forward, backward, optimizer step), over all ranks.

    Data loading, validation and checkpointing are left out, and so is everything up to the end of the first
    optimizer step (warm-up: allocator, DDP buckets), the same way in all three recipes. Samples are counted as
    they come: the last batch of an epoch is smaller (DistributedSampler gives every rank the same number).
    """

    def __init__(self, world_size: int, accumulate: int) -> None:
        self.world_size, self.accumulate = world_size, accumulate
        self.samples, self.seconds, self._started = 0, 0.0, None

    def start(self) -> None:
        self._started = time.perf_counter()

    def stop(self, batch_index: int, batch_samples: int) -> None:
        """End of micro-batch ``batch_index`` (counted from 0 over the run) of ``batch_samples`` on this rank."""
        assert self._started is not None, "stop() without start()"
        if batch_index >= self.accumulate:  # past the first optimizer step
            self.seconds += time.perf_counter() - self._started
            self.samples += batch_samples * self.world_size
        self._started = None

    @property
    def samples_per_s(self) -> Optional[float]:
        return self.samples / self.seconds if self.seconds > 0 else None


class Progress:
    """What a hand-written training loop (``lm_fabric``, ``lm_torch``) keeps: the step clock, the loss of every
    micro-batch, the latest validation loss and the count of micro-batches run."""

    def __init__(self, world_size: int, accumulate: int) -> None:
        self.clock = StepClock(world_size, accumulate)
        self.losses: List[float] = []
        self.val_loss = float("nan")
        self.batches = 0

    def micro_batch_done(self, samples: int, loss: Any) -> None:
        """After a micro-batch (and its optimizer step, if it was the last of one): stop the clock, keep the loss."""
        self.clock.stop(self.batches, samples)
        self.batches += 1
        self.losses.append(loss.item())

    def row(self, step: int) -> Dict[str, Any]:
        """``metrics.csv``'s row for optimizer step ``step`` (its val_loss filled in where it validates)."""
        return {"step": step, "train_loss": self.losses[-1], "val_loss": ""}


def gather(value: Any, world_size: int) -> List[Any]:
    """``value`` from every rank, in rank order (just ``[value]`` outside a process group)."""
    import torch.distributed as dist

    if world_size == 1 or not dist.is_available() or not dist.is_initialized():
        return [value]
    gathered: List[Any] = [None] * world_size
    dist.all_gather_object(gathered, value)
    return gathered


def summary(
    *,
    val_loss: float,
    train_losses: List[float],
    steps: int,
    world_size: int,
    micro: int,
    accumulate: int,
    samples_per_s: Optional[float],
    resumed: bool,
    digests: List[str],
    checkpoint: str,
) -> Dict[str, Any]:
    """The result every LM recipe returns (rank 0's is the job's result)."""
    return {
        "val_loss": float(val_loss),
        "train_loss_first": train_losses[0] if train_losses else None,
        "train_loss_last": sum(train_losses[-5:]) / len(train_losses[-5:]) if train_losses else None,
        "steps": steps,
        "world_size": world_size,
        "global_batch_size": micro * accumulate * world_size,
        "micro_batch_size": micro,
        "grad_accum": accumulate,
        "samples_per_s": samples_per_s,
        "resumed_from_checkpoint": resumed,
        "weights_in_sync": len(set(digests)) == 1,
        "weight_digests": digests,
        "checkpoint": checkpoint,
    }


def report(recipe: str, result: Dict[str, Any]) -> None:
    """The line rank 0 prints at the end (the launcher shows it; tests look for it)."""
    print(
        f"{recipe}: {result['steps']} steps on {result['world_size']} ranks (micro-batch "
        f"{result['micro_batch_size']} x {result['grad_accum']}), val_loss={result['val_loss']:.4f}, "
        f"weights identical on all ranks: {result['weights_in_sync']}",
        flush=True,
    )


def append_metrics(path: Path, rows: List[Dict[str, Any]]) -> None:
    """Rank 0's ``metrics.csv``: one row per optimizer step (step, train_loss, and val_loss where it validated);
    appended on resume."""
    new = not path.exists()
    with open(path, "a", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=["step", "train_loss", "val_loss"])
        if new:
            writer.writeheader()
        writer.writerows(rows)
