"""The typed config the three LM recipes read: the keys under ``recipe:`` in ``conf/recipe/lm*.yaml``.

Hydra calls ``recipes.<name>.train(**keys)``; each recipe first turns those keys into one frozen ``LMConfig``
(``lm_torch``: ``TorchLMConfig``, which adds the key only it uses) and reads nothing else. A key the recipe does
not take, or a required key left out, is a ``TypeError`` that names it, as the old keyword arguments were.
Values pass through as given: what a bad value raises is up to the framework that uses it, as before.

Kept free of torch and Lightning, so that the config can be built and checked without them.
"""

from dataclasses import MISSING, asdict, dataclass, fields
from typing import Any, Dict, Mapping, Optional, Type, TypeVar

C = TypeVar("C", bound="LMConfig")


def _check_keys(cls: type, keys: Any, where: str) -> None:
    """Refuse a key that is not a field of dataclass ``cls`` and a missing field without a default."""
    known = [item.name for item in fields(cls)]
    unknown = [key for key in keys if key not in known]
    if unknown:
        raise TypeError(
            f"{where}: unknown key{'s' if len(unknown) > 1 else ''} "
            f"{', '.join(repr(str(key)) for key in unknown)}; expected one of: {', '.join(known)}"
        )
    missing = [
        item.name
        for item in fields(cls)
        if item.name not in keys and item.default is MISSING and item.default_factory is MISSING
    ]
    if missing:
        raise TypeError(
            f"{where}: missing required key{'s' if len(missing) > 1 else ''} "
            f"{', '.join(repr(name) for name in missing)}"
        )


@dataclass(frozen=True)
class ModelConfig:
    """``recipe.model``: the size of ``lightning.pytorch.demos.Transformer`` (left out: the Transformer's default)."""

    ninp: int = 200
    nhead: int = 2
    nhid: int = 200
    nlayers: int = 2
    dropout: float = 0.2

    @classmethod
    def of(cls, value: Any, where: str = "recipe.model") -> "ModelConfig":
        """From a mapping (what Hydra passes) or a ``ModelConfig``."""
        if isinstance(value, cls):
            return value
        if not isinstance(value, Mapping):
            raise TypeError(
                f"{where}: expected a mapping of {', '.join(item.name for item in fields(cls))}, "
                f"got {type(value).__name__} {value!r:.100}"
            )
        _check_keys(cls, value, where)
        return cls(**{str(key): item for key, item in value.items()})

    def kwargs(self) -> Dict[str, Any]:
        """The Transformer's keyword arguments (``vocab_size`` comes from the data)."""
        return asdict(self)


@dataclass(frozen=True)
class LMConfig:
    """What ``lm``, ``lm_fabric`` and ``lm_torch`` take: the same model, data and hyper-parameters."""

    seed: int
    accelerator: str  # cpu | gpu
    data_dir: str  # the corpus file is written here once (recipes/corpus.py)
    block_size: int  # tokens per sample
    val_fraction: float
    lr: float
    model: ModelConfig
    max_steps: int  # optimizer steps, in all three recipes
    val_check_interval: int  # validate (and checkpoint) every N optimizer steps
    limit_val_batches: int  # validation batches per rank
    gradient_clip_val: float
    precision: str  # Lightning's names: 32-true, bf16-mixed, 16-mixed
    resume: bool = True  # resume from <job dir>/checkpoints/last.* when it exists
    # optimizer steps between checkpoints (last.*) besides the end's; None = only where a run may be resumed from
    # one: an elastic job (num_nodes=MIN:MAX) every ELASTIC_CHECKPOINT_EVERY steps
    checkpoint_every: Optional[int] = None
    # DDP keeps one gradient-bucket layout, so that a requeued run resumes bit for bit; None = only where SLURM
    # may requeue (``recipes.lm_common.keep_ddp_buckets``)
    fixed_buckets: Optional[bool] = None
    output_dir: Optional[str] = None  # None = the job dir (MMT_JOB_DIR), else the working directory
    batch_size: Optional[int] = None  # the micro-batch; None = the launcher's batch plan
    accumulate_grad_batches: Optional[int] = None  # micro-batches per optimizer step; None = the plan's
    # a failure drill (what hydra.launcher.max_restarts is for): rank ``fail_rank`` is SIGKILLed, as the OOM killer
    # would, right after optimizer step ``fail_step`` of the job's first run (MMT_RESTART_COUNT=0); None = never
    fail_rank: Optional[int] = None
    fail_step: Optional[int] = None

    @classmethod
    def from_kwargs(cls: Type[C], recipe: str, kwargs: Mapping[str, Any]) -> C:
        """The config of ``recipe`` (its name, for messages) from the keyword arguments Hydra passed."""
        _check_keys(cls, kwargs, f"recipes.{recipe}.train (recipe.*)")
        values = {str(key): value for key, value in kwargs.items()}
        values["model"] = ModelConfig.of(values["model"], f"recipes.{recipe}.train (recipe.model)")
        return cls(**values)


@dataclass(frozen=True)
class TorchLMConfig(LMConfig):
    """``lm_torch``'s config: it forms the process group itself, so it also says how long to wait for it."""

    init_timeout_s: float = 300  # how long ranks wait for each other in init_process_group
