"""recipe=lm_torch: the ``lm`` recipe's model, data and batch plan, in raw PyTorch DDP (no Lightning loop).

What the seed's "few lines" amount to, done properly: the process group from the rank contract (RankInfo), a
``DistributedSampler`` with ``set_epoch`` every epoch, ``DistributedDataParallel`` with ``no_sync`` on
accumulating micro-batches, and only rank 0 printing, writing ``metrics.csv`` and saving
``checkpoints/last.pt`` (a rerun in the same dir resumes from it). Only the dataset and model classes come from
``lightning.pytorch.demos``, so that the three LM recipes train the very same thing.

    python train.py -m recipe=lm_torch num_nodes=2 devices=2
"""

import contextlib
import random
from datetime import timedelta
from pathlib import Path
from typing import Any, Dict, Iterator, NamedTuple, Tuple

import torch
import torch.distributed as dist
import torch.nn.functional as F
from lightning.pytorch.demos import Transformer
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader
from torch.utils.data.distributed import DistributedSampler

from mmt import RankInfo
from mmt.core.checkpoints import resume_from, save_atomic
from mmt.core.stacks import beat
from recipes.corpus import load_splits, weights_digest
from recipes.lm_common import Progress, RankPlan, append_metrics, fault_drill, gather, keep_ddp_buckets, report, summary
from recipes.lm_config import TorchLMConfig

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


class _Data(NamedTuple):
    sampler: DistributedSampler  # the training sampler: its epoch is set on every pass
    train_loader: DataLoader
    val_loader: DataLoader
    vocab_size: int


class _Model(NamedTuple):
    network: torch.nn.Module  # the Transformer itself: what is saved and digested
    ddp: torch.nn.Module  # what trains: the network in DistributedDataParallel, or the network itself on one rank
    optimizer: torch.optim.Optimizer


def train(**recipe: Any) -> Dict[str, Any]:
    """Train; return rank 0's summary. ``recipe``: the keys under ``recipe:`` (``recipes.lm_config.TorchLMConfig``:
    ``LMConfig`` and ``init_timeout_s``)."""
    config = TorchLMConfig.from_kwargs("lm_torch", recipe)
    plan = RankPlan.from_env(config)
    run = _Run(plan.rank, config.accelerator, config.precision)
    with _process_group(plan.rank, run.device, config.init_timeout_s):
        return _train(config, plan, run)


@contextlib.contextmanager
def _process_group(rank: RankInfo, device: torch.device, timeout_s: float) -> Iterator[None]:
    """The process group of every rank (none on a single rank), from the rank contract; destroyed at the end."""
    distributed = rank.world_size > 1
    if distributed:
        dist.init_process_group(
            "nccl" if device.type == "cuda" else "gloo",
            init_method=f"tcp://{rank.master_addr}:{rank.master_port}",
            rank=rank.rank,
            world_size=rank.world_size,
            timeout=timedelta(seconds=timeout_s),
        )
    try:
        yield
    finally:
        if distributed:
            dist.destroy_process_group()


def _train(config: TorchLMConfig, plan: RankPlan, run: _Run) -> Dict[str, Any]:
    _seed_everything(config.seed)
    data = _data(config, plan)
    model = _model(config, plan.rank, run, data.vocab_size)
    last = plan.out / "checkpoints" / "last.pt"
    resumed = resume_from(last, config.resume) is not None
    step = _resume(last, run, model) if resumed else 0
    progress, step = _fit(config, plan, run, model, data, last, step)
    result = summary(
        val_loss=progress.val_loss,
        train_losses=progress.losses,
        steps=step,
        world_size=plan.rank.world_size,
        micro=plan.micro,
        accumulate=plan.accumulate,
        samples_per_s=progress.clock.samples_per_s,
        resumed=resumed,
        digests=gather(weights_digest(model.network), plan.rank.world_size),
        checkpoint=str(last),
    )
    if plan.rank.is_main:
        report("lm_torch", result)
    return result


def _data(config: TorchLMConfig, plan: RankPlan) -> _Data:
    """The corpus split, each rank's share of it (DistributedSampler) and the micro-batch loaders."""
    train_set, val_set, vocab_size = load_splits(config.data_dir, config.block_size, config.val_fraction, config.seed)
    rank = plan.rank
    # the seed Lightning's samplers use (PL_GLOBAL_SEED): the same shuffle as lm and lm_fabric
    sampler = DistributedSampler(
        train_set, num_replicas=rank.world_size, rank=rank.rank, shuffle=True, seed=config.seed
    )
    val_sampler = DistributedSampler(val_set, num_replicas=rank.world_size, rank=rank.rank, shuffle=False)
    train_loader = DataLoader(train_set, batch_size=plan.micro, sampler=sampler)
    val_loader = DataLoader(val_set, batch_size=plan.micro, sampler=val_sampler)
    return _Data(sampler, train_loader, val_loader, vocab_size)


def _model(config: TorchLMConfig, rank: RankInfo, run: _Run, vocab_size: int) -> _Model:
    """The Transformer on this rank's device, in DDP where there are several ranks, and its optimizer."""
    network = Transformer(vocab_size=vocab_size, **config.model.kwargs()).to(run.device)
    ddp = (
        DistributedDataParallel(
            network,
            device_ids=[run.device.index] if run.device.type == "cuda" else None,
            find_unused_parameters=keep_ddp_buckets(config.fixed_buckets),
        )
        if rank.world_size > 1
        else network
    )
    optimizer = torch.optim.SGD(ddp.parameters(), lr=config.lr)
    return _Model(network, ddp, optimizer)


def _resume(last: Path, run: _Run, model: _Model) -> int:
    """Every rank reads rank 0's checkpoint into the network and the optimizer; returns its step."""
    state = torch.load(last, map_location=run.device, weights_only=True)
    model.network.load_state_dict(state["model"])
    model.optimizer.load_state_dict(state["optimizer"])
    return int(state["step"])


def _fit(
    config: TorchLMConfig, plan: RankPlan, run: _Run, model: _Model, data: _Data, last: Path, step: int
) -> Tuple[Progress, int]:
    """Optimizer steps from ``step`` up to ``config.max_steps``; validate and checkpoint every
    ``val_check_interval``. Returns the progress and the last step."""
    progress, batches = Progress(plan.rank.world_size, plan.accumulate), _batches(data.train_loader, data.sampler)
    while step < config.max_steps:
        _optimizer_step(run, model, batches, config.gradient_clip_val, plan.accumulate, progress)
        beat()  # progress, for mmt's hang detection
        step += 1
        fault_drill(config, plan.rank, step)
        row = progress.row(step)
        if step % config.val_check_interval == 0:
            progress.val_loss = run.validate(model.ddp, data.val_loader, config.limit_val_batches)
            row["val_loss"] = progress.val_loss
            if plan.rank.is_main:
                print(
                    f"lm_torch: step {step} train_loss {progress.losses[-1]:.4f} val_loss {progress.val_loss:.4f}",
                    flush=True,
                )
                _save(
                    last, {"model": model.network.state_dict(), "optimizer": model.optimizer.state_dict(), "step": step}
                )
            if plan.rank.world_size > 1:
                dist.barrier()  # nobody resumes from a half-written checkpoint
        if plan.rank.is_main:  # every step, as it happens: the launcher's progress reads it
            append_metrics(plan.out / "metrics.csv", [row])
    return progress, step


def _optimizer_step(
    run: _Run, model: _Model, batches: Iterator[Any], clip: float, accumulate: int, progress: Progress
) -> None:
    """One optimizer step over ``accumulate`` micro-batches; the gradient all-reduce only on the last."""
    ddp, optimizer = model.ddp, model.optimizer
    for micro_index in range(accumulate):
        batch = next(batches)
        progress.clock.start()
        last_micro = micro_index == accumulate - 1
        # skip the gradient all-reduce until the last micro-batch of the step
        sync = contextlib.nullcontext() if last_micro or ddp is model.network else ddp.no_sync()
        with sync:
            loss = run.loss(ddp, batch)
            (loss / accumulate).backward()
        if last_micro:
            torch.nn.utils.clip_grad_norm_(ddp.parameters(), clip)
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
        progress.micro_batch_done(len(batch[0]), loss)


def _save(path: Path, state: Dict[str, Any]) -> None:
    save_atomic(state, path)  # a kill mid-save leaves the previous checkpoint intact
