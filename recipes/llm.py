"""recipe=llm: Llama-style decoder pretraining on litgpt's own ``GPT`` and ``Config``, with Lightning Fabric.

    python train.py -m recipe=llm model=micro num_nodes=2 devices=2             # CPU, seconds
    python train.py -m recipe=llm model=tiny-llama-1.1b machine=a100_x_8 num_nodes=8

The launcher starts every rank; Fabric gets ``num_nodes``/``devices`` from the rank contract and spawns nothing.
The model is ``litgpt.GPT(Config.from_name(...))`` initialised as ``litgpt pretrain`` does it, with its learning-rate
schedule; DDP (or FSDP, one unit per transformer block as litgpt wraps it); bf16 on GPU machines. The micro-batch
and accumulation are the launcher's batch plan (``MMT_MICRO_BATCH_SIZE``, tuned per model in
``recipes/tuned/llm.yaml``).

Data: ``recipes.llm_data`` prepares the dataset once (rank 0, or each node's local rank 0, in a child process,
while the other ranks wait at a barrier), then every rank streams its share with LitData's ``StreamingDataset`` /
``StreamingDataLoader``: each sample once per epoch over the world. The loader's state is in the checkpoint, so a
resume continues mid-epoch with the next sample, not at the epoch's start: on the requeue signal
(``mmt.core.preemption``, inside an mmt SLURM task) the ranks agree at a step boundary, checkpoint at once and
requeue; a rerun in the same dir resumes too.

Rank 0 writes ``metrics.csv`` every optimizer step: train_loss, tokens/s per device and for the job, MFU (FLOPs from
litgpt's ``estimate_flops``, the device's peak from Lightning's datasheet table for the catalogue's ``gpu_type``),
and the time the step waited for the data loader.
"""

import csv
import json
import math
import os
import time
from datetime import timedelta
from pathlib import Path
from typing import Any, Dict, Iterator, List, Optional

import lightning as L
import torch
from lightning.fabric.strategies import DDPStrategy, FSDPStrategy

from mmt import RankInfo
from mmt.core import preemption
from mmt.core.checkpoints import resume_from
from mmt.core.stacks import beat
from mmt.lightning import AtomicCheckpointIO, cluster_environment
from recipes.corpus import weights_digest
from recipes.llm_config import LLMConfig, chip
from recipes.lm_common import gather, keep_ddp_buckets

METRICS = ["step", "epoch", "train_loss", "lr", "tokens_per_s", "tokens_per_s_device", "mfu", "data_wait_s", "step_s"]


def train(**recipe: Any) -> Dict[str, Any]:
    """Train; return rank 0's summary. ``recipe``: the keys under ``recipe:`` (``recipes.llm_config.LLMConfig``)."""
    config = LLMConfig.from_kwargs(recipe)
    rank = RankInfo.from_env()
    out = Path(config.output_dir or rank.job_dir or os.getcwd())
    micro, accumulate = rank.batch_sizes(config.batch_size, config.accumulate_grad_batches)
    fabric = _fabric(config, rank)
    data_dir = _data(fabric, config, rank)
    model, optimizer, gpt_config = _model(fabric, config, json.loads((data_dir / "meta.json").read_text()))
    loader = _loader(data_dir / "train", config, micro, shuffle=True)
    state: Dict[str, Any] = {"model": model, "optimizer": optimizer, "loader": loader, "step": 0, "epoch": 0}
    last = out / "checkpoints" / "last.ckpt"
    resumed = resume_from(last, config.resume) is not None
    if resumed:
        fabric.load(last, state)
    run = _Run(fabric, config, out, micro, accumulate, gpt_config, rank.world_generation)
    run.fit(state, last)
    val_loss = _validate(fabric, model, _loader(data_dir / "val", config, micro, shuffle=False))
    result = run.result(state, val_loss, resumed, gather(weights_digest(model), rank.world_size), str(last))
    if fabric.global_rank == 0:
        print(f"llm: {_line(result, micro, accumulate)}", flush=True)
    return result


def _line(result: Dict[str, Any], micro: int, accumulate: int) -> str:
    """Rank 0's last line (the launcher shows it); a run resumed at its end trained no step here."""

    def number(key: str, spec: str) -> str:
        return "-" if result[key] is None else format(result[key], spec)

    return (
        f"{result['steps']} steps on {result['world_size']} ranks (micro-batch {micro} x {accumulate}), "
        f"train_loss {number('train_loss_first', '.3f')} -> {number('train_loss_last', '.3f')}, "
        f"val_loss={result['val_loss']:.4f}, {number('tokens_per_s', '.0f')} tokens/s, "
        f"weights identical on all ranks: {result['weights_in_sync']}"
    )


def _fabric(config: LLMConfig, rank: RankInfo) -> L.Fabric:
    """Fabric for the launcher's world, launched (the ranks exist: it spawns nothing). The process group's timeout
    also bounds the wait at the data step's barrier."""
    timeout = timedelta(seconds=config.init_timeout_s)
    strategy: Any = "auto"
    if config.strategy == "fsdp":
        from litgpt.model import Block

        strategy = FSDPStrategy(auto_wrap_policy={Block}, state_dict_type="full", timeout=timeout)
    elif rank.world_size > 1:
        strategy = DDPStrategy(find_unused_parameters=keep_ddp_buckets(config.fixed_buckets), timeout=timeout)
    environment = cluster_environment()  # under SLURM: Lightning's SLURM environment, its auto-requeue off
    fabric = L.Fabric(
        accelerator=config.accelerator,
        num_nodes=rank.num_nodes,
        devices=rank.local_world_size,
        strategy=strategy,
        precision=config.precision,  # type: ignore[arg-type]
        plugins=[AtomicCheckpointIO(), *([environment] if environment else [])],
    )
    fabric.launch()
    rank.check_world_size(fabric.world_size, "fabric")
    return fabric


def _data(fabric: L.Fabric, config: LLMConfig, rank: RankInfo) -> Path:
    """The dataset's dir: prepared (if the cache lacks it) by one process per job or per node, the rest waiting."""
    from recipes.llm_data import damage, dataset_dir, is_ready, prepare_in_child

    preparer = rank.rank == 0 if config.data.prepare_on == "job" else rank.local_rank == 0
    if preparer:
        prepare_in_child(config.data, config.init_timeout_s)
    fabric.barrier("mmt-llm-data")
    path = dataset_dir(config.data)
    if not is_ready(path):
        raise FileNotFoundError(
            f"rank {rank.rank}: the data step finished but {path} is not there. HINT: with "
            f"recipe.data.prepare_on=job, recipe.data.cache_dir must be on a filesystem every node shares; set "
            f"recipe.data.prepare_on=node for node-local disk"
        )
    damaged = damage(path)  # the preparer rebuilt what it found damaged: this rank reads another copy, or a later one
    if damaged is not None:
        raise DamagedDataError(
            f"rank {rank.rank}: the prepared data is damaged: {damaged}. HINT: run the job again (its data step "
            f"rebuilds a damaged dataset), or delete {path} and let the next job build it"
        )
    return path


class DamagedDataError(RuntimeError):
    """A rank found the prepared dataset damaged (a chunk missing or cut short) after its data step."""


def _model(fabric: L.Fabric, config: LLMConfig, meta: Dict[str, Any]) -> Any:
    """litgpt's GPT from its Config (``model=``), initialised as ``litgpt pretrain`` does, and AdamW, set up."""
    from litgpt.model import GPT
    from litgpt.pretrain import initialize_weights

    gpt_config = gpt_config_of(config)
    if meta["vocab_size"] > gpt_config.padded_vocab_size:
        raise ValueError(f"the tokenizer has {meta['vocab_size']} tokens; model={config.model.name} only {gpt_config}")
    fabric.seed_everything(config.seed, verbose=False)
    with fabric.init_module(empty_init=config.strategy == "fsdp"):
        model = GPT(gpt_config)
    model.max_seq_length = config.seq_len
    initialize_weights(fabric, model, n_layer=gpt_config.n_layer, n_embd=gpt_config.n_embd)
    if config.compile:  # as litgpt pretrain does: before Fabric wraps it
        model = torch.compile(model)
    model = fabric.setup(model)
    optimizer = torch.optim.AdamW(
        model.parameters(), lr=config.lr, weight_decay=config.weight_decay, betas=(0.9, 0.95), foreach=False
    )
    return model, fabric.setup_optimizers(optimizer), gpt_config


def gpt_config_of(config: LLMConfig) -> Any:
    """litgpt's ``Config`` of ``model=``: litgpt's definition of ``litgpt_name`` with ``overrides`` (its ``name``
    too, which ``Config.from_name`` would refuse)."""
    from litgpt.config import Config, name_to_config

    return Config(**{**name_to_config[config.model.litgpt_name], **config.model.overrides})


def _loader(path: Path, config: LLMConfig, micro: int, shuffle: bool) -> Any:
    from litdata import StreamingDataLoader, StreamingDataset, TokensLoader

    dataset = StreamingDataset(
        str(path), item_loader=TokensLoader(block_size=config.data.block_size), shuffle=shuffle, seed=config.seed
    )
    return StreamingDataLoader(dataset, batch_size=micro, num_workers=config.num_workers)


def _peak_flops(config: LLMConfig) -> Optional[float]:
    """A device's peak FLOP/s for ``config.precision``: ``recipe.peak_tflops``, else Lightning's datasheet figure
    for the catalogue's ``gpu_type`` (None for CPU machines: no MFU is reported)."""
    if config.peak_tflops:
        return config.peak_tflops * 1e12
    name = chip(config.gpu_type)
    if name is None:
        return None
    from lightning.fabric.utilities.throughput import _CUDA_FLOPS

    dtype = torch.bfloat16 if config.precision.startswith("bf16") else torch.float32
    dtype = torch.float16 if config.precision.startswith("16") else dtype
    return _CUDA_FLOPS.get(name, {}).get(dtype)


class _Run:
    """The training loop's state that is not checkpointed: figures, losses, the reads trace."""

    def __init__(
        self,
        fabric: L.Fabric,
        config: LLMConfig,
        out: Path,
        micro: int,
        accumulate: int,
        gpt_config: Any,
        world: int,
    ) -> None:
        from litgpt.model import GPT
        from litgpt.utils import estimate_flops

        self.fabric, self.config, self.out = fabric, config, out
        self.micro, self.accumulate = micro, accumulate
        with torch.device("meta"):  # litgpt's own estimate, per sequence, forward and backward
            meta_model = GPT(gpt_config)
            meta_model.max_seq_length = config.seq_len
            self.flops_per_sequence = estimate_flops(meta_model, training=True)
        self.peak = _peak_flops(config)
        self.losses: List[float] = []
        self.tokens, self.seconds, self.wait = 0, 0.0, 0.0
        self.reads = None
        self.world = world  # an elastic job's world (MMT_WORLD_GENERATION): in the reads trace
        if config.trace_reads:
            (out / "reads").mkdir(parents=True, exist_ok=True)
            self.reads = open(out / "reads" / f"rank{fabric.global_rank}.jsonl", "a")

    def batches(self, state: Dict[str, Any]) -> Iterator[torch.Tensor]:
        """Micro-batches, epoch after epoch, up to ``config.epochs``; ``state['epoch']`` counts finished passes."""
        while self.config.epochs is None or state["epoch"] < self.config.epochs:
            yield from state["loader"]
            state["epoch"] += 1

    def fit(self, state: Dict[str, Any], last: Path) -> None:
        from litgpt.pretrain import get_lr

        fabric, config, model, optimizer = self.fabric, self.config, state["model"], state["optimizer"]
        batches = self.batches(state)
        pending = False
        while state["step"] < config.max_steps:
            lr = get_lr(config.lr, state["step"], config.warmup_steps, config.max_steps, config.lr / 10)
            for group in optimizer.param_groups:
                group["lr"] = lr
            started, wait, losses = time.perf_counter(), 0.0, []
            for index in range(self.accumulate):
                asked = time.perf_counter()
                batch = next(batches, None)
                wait += time.perf_counter() - asked
                if batch is None:
                    return  # config.epochs done
                self._trace(state, batch)
                batch = batch.to(fabric.device, non_blocking=True).long()
                with fabric.no_backward_sync(model, enabled=index < self.accumulate - 1):
                    loss = _loss(model, batch)
                    fabric.backward(loss / self.accumulate)
                losses.append(loss.item())
            fabric.clip_gradients(model, optimizer, max_norm=config.gradient_clip_val)
            optimizer.step()
            optimizer.zero_grad()
            state["step"] += 1
            beat()  # progress, for mmt's hang detection (and an elastic world's first step)
            self._record(state, lr, sum(losses) / len(losses), time.perf_counter() - started, wait)
            if config.checkpoint_every and state["step"] % config.checkpoint_every == 0:
                fabric.save(last, state)
            if preemption.installed() and not pending:
                pending = bool(fabric.strategy.reduce_boolean_decision(preemption.requested(), all=False))
            if pending and state["step"] < config.max_steps:
                self._requeue(state, last)
        fabric.save(last, state)

    def _requeue(self, state: Dict[str, Any], last: Path) -> None:
        """Checkpoint now, mid-epoch (the loader's state says where), requeue the job, stop every rank."""
        if not preemption.requeue_allowed():
            if self.fabric.global_rank == 0:
                print("mmt: requeue limit reached; training on until SLURM stops the job", flush=True)
            return
        self.fabric.save(last, state)
        self.fabric.barrier("mmt-requeue")
        if self.fabric.global_rank == 0:
            preemption.requeue()
            print(f"mmt: checkpoint {last} written at step {state['step']}; job requeued", flush=True)
        time.sleep(1.0)  # let the controller register the requeue before any task exits
        raise preemption.Requeued(f"requeued at step {state['step']}")

    def _trace(self, state: Dict[str, Any], batch: torch.Tensor) -> None:
        if self.reads is not None:
            from recipes.llm_data import digest

            record = {"epoch": state["epoch"], "step": state["step"], "samples": [digest(row) for row in batch]}
            if self.world:  # an elastic job's later world (MMT_WORLD_GENERATION): its reads told apart
                record["world"] = self.world
            self.reads.write(json.dumps(record) + "\n")
            self.reads.flush()

    def _record(self, state: Dict[str, Any], lr: float, loss: float, seconds: float, wait: float) -> None:
        """The step's figures; rank 0 appends them to metrics.csv at once (the progress view and the page read it).
        Rank 0's step time is the job's: DDP's all-reduce makes every rank wait for the slowest."""
        sequences = self.micro * self.accumulate
        device_tokens = sequences * self.config.seq_len / seconds
        mfu = self.flops_per_sequence * sequences / seconds / self.peak if self.peak else None
        self.losses.append(loss)
        if len(self.losses) > 1:  # this process's first step warms up (allocator, DDP buckets): left out
            self.tokens += sequences * self.config.seq_len * self.fabric.world_size
            self.seconds += seconds
        self.wait += wait
        if self.fabric.global_rank != 0:
            return
        path = self.out / "metrics.csv"
        new = not path.exists()
        with open(path, "a", newline="") as handle:
            writer = csv.DictWriter(handle, fieldnames=METRICS)
            if new:
                writer.writeheader()
            writer.writerow(
                {
                    "step": state["step"],
                    "epoch": state["epoch"],
                    "train_loss": round(loss, 5),
                    "lr": f"{lr:.3g}",
                    "tokens_per_s": round(device_tokens * self.fabric.world_size, 1),
                    "tokens_per_s_device": round(device_tokens, 1),
                    "mfu": "" if mfu is None else round(mfu, 5),
                    "data_wait_s": round(wait, 5),
                    "step_s": round(seconds, 5),
                }
            )

    def result(
        self, state: Dict[str, Any], val_loss: float, resumed: bool, digests: List[str], checkpoint: str
    ) -> Dict[str, Any]:
        tokens_per_s = self.tokens / self.seconds if self.seconds else None
        steps_run = max(1, len(self.losses))
        return {
            "val_loss": val_loss,
            "train_loss_first": self.losses[0] if self.losses else None,
            "train_loss_last": sum(self.losses[-5:]) / len(self.losses[-5:]) if self.losses else None,
            "steps": state["step"],
            "epochs_done": state["epoch"],
            "world_size": self.fabric.world_size,
            "global_batch_size": self.micro * self.accumulate * self.fabric.world_size,
            "micro_batch_size": self.micro,
            "grad_accum": self.accumulate,
            "samples_per_s": tokens_per_s / self.config.seq_len if tokens_per_s else None,
            "tokens_per_s": tokens_per_s,
            "tokens_per_s_device": tokens_per_s / self.fabric.world_size if tokens_per_s else None,
            "flops_per_sequence": self.flops_per_sequence,
            "peak_flops": self.peak,
            "mfu": self.flops_per_sequence * tokens_per_s / self.config.seq_len / self.fabric.world_size / self.peak
            if tokens_per_s and self.peak
            else None,
            "data_wait_s_per_step": self.wait / steps_run,
            "resumed_from_checkpoint": resumed,
            "weights_in_sync": len(set(digests)) == 1,
            "weight_digests": digests,
            "checkpoint": checkpoint,
        }


def _loss(model: Any, batch: torch.Tensor) -> torch.Tensor:
    """Next-token cross-entropy over a batch of ``seq_len + 1`` tokens (litgpt's loss)."""
    from litgpt.utils import chunked_cross_entropy

    return chunked_cross_entropy(model(batch[:, :-1].contiguous()), batch[:, 1:].contiguous(), chunk_size=0)


def _validate(fabric: L.Fabric, model: Any, loader: Any) -> float:
    """Mean loss over the validation split, every rank reading its share, weighted by samples."""
    model.eval()
    total = torch.zeros(2, device=fabric.device)
    with torch.no_grad():
        for batch in loader:
            batch = batch.to(fabric.device).long()
            total[0] += _loss(model, batch) * len(batch)
            total[1] += len(batch)
    model.train()
    summed = fabric.all_reduce(total, reduce_op="sum")
    assert isinstance(summed, torch.Tensor)
    return float(summed[0] / summed[1]) if summed[1] > 0 else math.nan
