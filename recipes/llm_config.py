"""The typed config of ``recipe=llm``: the keys under ``recipe:`` in ``conf/recipe/llm.yaml``, the model picked by
``model=<name>`` (``conf/model/``) and the data step's settings (``recipe.data``).

Kept free of torch, Lightning, litgpt and LitData, like ``recipes.lm_config``: the config, the dataset's cache key
and the peak-FLOPs lookup can be built and checked without them (tests/unit/test_llm_config.py).
"""

import hashlib
import json
from dataclasses import asdict, dataclass, field, fields
from typing import Any, Dict, Mapping, Optional

from recipes.lm_config import _check_keys

# Bump when what the data step writes changes (tokenizer training, block layout, chunk format): every cached dataset
# is then rebuilt under a new key instead of being read in the old layout.
DATA_FORMAT = 1

# The machine catalogue's gpu_type -> the chip name in Lightning's peak-FLOPs table
# (``lightning.fabric.utilities.throughput._CUDA_FLOPS``), which has the datasheet figure per dtype. SXM parts:
# the catalogue's 8-GPU machines are SXM boards. None: the table has no entry (its peak must be given).
CHIPS: Dict[str, Optional[str]] = {
    "A100": "a100",
    "A10G": "a10g",
    "H100": "h100 sxm",
    "H200": "h200 sxm1",
    "L4": "l4",
    "L40S": "l40",
    "T4": "t4",
    "B200": None,
    "RTX PRO 6000": None,
}


def _mapping(cls: type, value: Any, where: str) -> Dict[str, Any]:
    if not isinstance(value, Mapping):
        raise TypeError(f"{where}: expected a mapping, got {type(value).__name__} {value!r:.100}")
    _check_keys(cls, value, where)
    return {str(key): item for key, item in value.items()}


@dataclass(frozen=True)
class ModelSpec:
    """``model=<name>``: a litgpt config by its litgpt name, with fields overridden (``overrides``, empty for
    ``tiny-llama-1.1b``: litgpt's definition as it is)."""

    name: str  # how mmt names it (the tuned table's key: llm-<name>)
    litgpt_name: str  # litgpt.Config.from_name(litgpt_name, **overrides)
    overrides: Dict[str, Any] = field(default_factory=dict)

    @classmethod
    def of(cls, value: Any, where: str = "recipe.model") -> "ModelSpec":
        if isinstance(value, cls):
            return value
        values = _mapping(cls, value, where)
        values["overrides"] = dict(values.get("overrides") or {})
        return cls(**values)


@dataclass(frozen=True)
class DataSpec:
    """``recipe.data``: what the data step builds (all of it is in the cache key) and where it keeps it."""

    cache_dir: str  # datasets live in <cache_dir>/<key>/ ; on a shared filesystem for prepare_on=job
    vocab_size: int  # BPE vocabulary trained by the data step (<= the model's padded vocabulary)
    block_size: int  # tokens per sample = the model's sequence length + 1 (inputs and shifted targets)
    docstrings: bool = False  # add the standard library's docstrings to the bundled docs (a larger corpus)
    val_fraction: float = 0.05
    blocks_multiple: int = 64  # the train split is cut to a multiple of this many samples: see recipes/llm_data.py
    chunk_blocks: int = 64  # samples per LitData chunk
    prepare_on: str = "job"  # job: global rank 0 prepares, the others wait; node: local rank 0 of every node

    @classmethod
    def of(cls, value: Any, where: str = "recipe.data") -> "DataSpec":
        return value if isinstance(value, cls) else cls(**_mapping(cls, value, where))

    def key(self, corpus_digest: str, versions: Mapping[str, str]) -> str:
        """The dataset's name in the cache: everything that changes its bytes, and nothing else (not where it is
        kept, not who prepares it): the corpus's own content, the settings and the versions that write it."""
        what = {
            "format": DATA_FORMAT,
            "corpus": corpus_digest,
            "vocab_size": self.vocab_size,
            "block_size": self.block_size,
            "val_fraction": self.val_fraction,
            "blocks_multiple": self.blocks_multiple,
            "chunk_blocks": self.chunk_blocks,
            "versions": dict(sorted(versions.items())),
        }
        digest = hashlib.sha256(json.dumps(what, sort_keys=True).encode()).hexdigest()[:16]
        return f"bpe{self.vocab_size}-b{self.block_size}-{digest}"


@dataclass(frozen=True)
class LLMConfig:
    """What ``recipes.llm.train`` takes."""

    seed: int
    accelerator: str  # cpu | gpu
    precision: str  # Lightning's names; conf/recipe/llm.yaml picks it from ``precisions`` by the accelerator
    strategy: str  # ddp | fsdp
    model: ModelSpec
    data: DataSpec
    max_steps: int  # optimizer steps (the run also ends after ``epochs`` passes over the data)
    lr: float
    weight_decay: float
    warmup_steps: int
    gradient_clip_val: float
    checkpoint_every: int  # optimizer steps between checkpoints (0: only the last)
    precisions: Optional[Dict[str, str]] = None  # accelerator -> precision (only the YAML reads it)
    compile: bool = False  # torch.compile the model (litgpt pretrain does; on CPU the first run compiles for minutes)
    epochs: Optional[int] = None  # passes over the train split; None: until max_steps
    num_workers: int = 0  # StreamingDataLoader workers per rank
    gpu_type: Optional[str] = None  # the machine catalogue's gpu_type (the peak FLOPs come from it)
    peak_tflops: Optional[float] = None  # per device; None: from gpu_type and precision (no MFU on CPU machines)
    resume: bool = True  # resume from <job dir>/checkpoints/last.ckpt when it exists
    fixed_buckets: Optional[bool] = None  # as recipes.lm_config.LMConfig: None = only where SLURM may requeue
    trace_reads: bool = False  # write every sample each rank read to <out>/reads/rank<r>.jsonl (the tests read it)
    init_timeout_s: float = 1800  # how long ranks wait for each other (and for the data step) at the barrier
    output_dir: Optional[str] = None  # None = the job dir (MMT_JOB_DIR), else the working directory
    batch_size: Optional[int] = None  # the micro-batch; None = the launcher's batch plan
    accumulate_grad_batches: Optional[int] = None

    @classmethod
    def from_kwargs(cls, kwargs: Mapping[str, Any]) -> "LLMConfig":
        where = "recipes.llm.train (recipe.*)"
        _check_keys(cls, kwargs, where)
        values = {str(key): value for key, value in kwargs.items()}
        values["model"] = ModelSpec.of(values["model"], "recipes.llm.train (recipe.model)")
        values["data"] = DataSpec.of(values["data"], "recipes.llm.train (recipe.data)")
        config = cls(**values)
        if config.strategy not in ("ddp", "fsdp"):
            raise ValueError(f"{where}: strategy={config.strategy!r}; expected ddp or fsdp")
        if config.strategy == "fsdp" and config.accelerator != "gpu":
            # Lightning's FSDP strategies refuse CPUs: say so before any rank starts work
            raise ValueError(f"{where}: strategy=fsdp needs GPUs (Lightning runs FSDP only on CUDA); use ddp on CPU")
        if config.data.prepare_on not in ("job", "node"):
            raise ValueError(f"{where}: data.prepare_on={config.data.prepare_on!r}; expected job or node")
        return config

    @property
    def seq_len(self) -> int:
        return self.data.block_size - 1

    def as_dict(self) -> Dict[str, Any]:
        return {item.name: getattr(self, item.name) for item in fields(self)} | {
            "model": asdict(self.model),
            "data": asdict(self.data),
        }


def chip(gpu_type: Optional[str]) -> Optional[str]:
    """Lightning's chip name for the catalogue's ``gpu_type``; None for CPU machines and chips it lacks."""
    return CHIPS.get(gpu_type) if gpu_type else None
