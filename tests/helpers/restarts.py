"""What the restart tests share on both backends: a small LM job that may restart, and its epoch's length."""

from pathlib import Path
from typing import Tuple

# recipe=lm, small enough for 2 x 2 on two cores, allowed one restart (DDP's buckets fixed with it)
SMALL_LM: Tuple[str, ...] = (
    "recipe=lm",
    "num_nodes=2",
    "devices=2",
    "recipe.model.ninp=32",
    "recipe.model.nhid=32",
    "recipe.model.nlayers=1",
    "recipe.limit_val_batches=2",
    "hydra.launcher.max_restarts=1",
)


def epoch_length(metrics: Path) -> int:
    """Optimizer steps in one epoch of a run's metrics.csv: the step of the first row of epoch 1."""
    rows = [line.split(",") for line in metrics.read_text().splitlines()[1:]]
    return min(int(step) for epoch, step, *_ in rows if epoch == "1")
