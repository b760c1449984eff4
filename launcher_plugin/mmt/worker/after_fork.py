"""State that libraries compute at import time, recomputed in a rank forked from the agent.

The agent imported the recipe's ``preload`` before any rank existed, so whatever a library derived from the
environment or from entropy at import time is the agent's, identical in every forked rank. A fresh interpreter
(what the user's code was written for) would have computed it from the rank's own environment:

* Lightning's ``rank_zero_only.rank``, read from RANK/LOCAL_RANK when Lightning is imported: without a reset every
  rank believes it is rank 0 until a Trainer or Fabric sets it, so ``@rank_zero_only`` code that runs before them
  (a config printed or written to a file) runs on every rank;
* NumPy's legacy global RandomState, seeded from OS entropy at import: every rank would draw the same numbers.

(Python's ``random`` reseeds itself after a fork; torch's default generator has a fixed seed in every process.)
"""

import os
import sys

_RANK_ZERO_MODULES = (
    "lightning_utilities.core.rank_zero",
    "lightning.fabric.utilities.rank_zero",
    "lightning.pytorch.utilities.rank_zero",
    "lightning_fabric.utilities.rank_zero",
    "pytorch_lightning.utilities.rank_zero",
)
# Lightning's own order (lightning.fabric.utilities.rank_zero._get_rank)
_RANK_KEYS = ("RANK", "LOCAL_RANK", "SLURM_PROCID", "JSM_NAMESPACE_RANK")


def _rank_from_env() -> int:
    for key in _RANK_KEYS:
        value = os.environ.get(key)
        if value is not None and value.strip().lstrip("-").isdigit():
            return int(value)
    return 0


def reset() -> None:
    rank = _rank_from_env()
    seen = set()
    for name in _RANK_ZERO_MODULES:
        function = getattr(sys.modules.get(name), "rank_zero_only", None)
        if function is not None and id(function) not in seen and hasattr(function, "rank"):
            seen.add(id(function))
            function.rank = rank
    # only where numpy.random was imported before the fork: NumPy imports it lazily (``numpy.random`` looked up on a
    # numpy that lacks it costs a rank 7 ms), and imported after the fork it seeds itself from the rank's entropy
    random = sys.modules.get("numpy.random")
    if random is not None:
        random.seed()
