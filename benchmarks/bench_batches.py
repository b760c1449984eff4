"""What a sweep costs when its jobs come in batches, and what mmt costs an app that never imports torch.

(a) six 1 x 1 probe jobs, one per batch:  train.py -m recipe=probe +x=1..6 hydra.sweeper.max_batch_size=1
(b) the same six jobs in one batch:       train.py -m recipe=probe +x=1..6
    a/b: what a batch pays again: one agent serves every batch, nothing waits for the plot (goal <= 1.3)
(c) a torch-free Hydra app, six jobs through mmt in one batch:  torch_free_app.py -m hydra/launcher=mmt_local
(d) the same app with Hydra's basic launcher, in-process:       torch_free_app.py -m
    c/d: what mmt's agent and processes add to an app that needs no torch (goal <= 1.5)

python benchmarks/bench_batches.py --rounds 5
"""

import os
import sys
from pathlib import Path
from typing import Callable, Dict, List

import _timing as timing

REPO = Path(__file__).resolve().parents[1]
PY = sys.executable
SIX = "+x=1,2,3,4,5,6"


def _run(args: List[str], scratch: Path, name: str) -> None:
    timing.run([PY, *args, f"hydra.sweep.dir={scratch}/{name}"], cwd=REPO, env=dict(os.environ, PYTHONPATH=str(REPO)))


VARIANTS: Dict[str, Callable[[Path], None]] = {
    "a_probe_one_per_batch": lambda s: _run(
        ["train.py", "-m", "recipe=probe", SIX, "hydra.sweeper.max_batch_size=1"], s, "a"
    ),
    "b_probe_one_batch": lambda s: _run(["train.py", "-m", "recipe=probe", SIX], s, "b"),
    "c_torch_free_mmt": lambda s: _run(["benchmarks/torch_free_app.py", "-m", "hydra/launcher=mmt_local", SIX], s, "c"),
    "d_torch_free_basic": lambda s: _run(["benchmarks/torch_free_app.py", "-m", SIX], s, "d"),
}


def main() -> None:
    timing.main(
        __doc__.split("\n\n")[0],
        VARIANTS,
        {"a/b": ("a_probe_one_per_batch", "b_probe_one_batch"), "c/d": ("c_torch_free_mmt", "d_torch_free_basic")},
        "mmt-bench-batches-",
    )


if __name__ == "__main__":
    main()
