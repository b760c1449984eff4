"""Elastic jobs (``num_nodes=MIN:MAX``): the node range, and the batch plan of every world the job may have.

An elastic job starts with up to MAX nodes and keeps running while at least MIN are alive: when a node is lost, the
surviving nodes' agents stop their ranks and start them again in a smaller world (a new ``MASTER_PORT``, the next
``MMT_WORLD_GENERATION``), and the ranks resume from their last checkpoint. The global batch holds across a change:
every world from MIN to MAX nodes has its own split into micro-batch x accumulation, planned here, before anything
starts, so that a global batch that one of those worlds cannot divide is refused at once, not mid-run. Pure.
"""

import math
import re
from dataclasses import dataclass
from typing import Any, Callable, Optional, Tuple

from mmt.core.errors import ConfigError
from mmt.planning import validate as check
from mmt.planning.batch import BatchPlan

_RANGE = re.compile(r"^\s*(\d+)\s*:\s*(\d+)\s*$")
_HINT = "MIN:MAX nodes, e.g. num_nodes=2:3 (a fixed count: num_nodes=2)"


@dataclass(frozen=True)
class ElasticPlan:
    """The node range of an elastic job, and the batch plan of each of its node counts."""

    min_nodes: int
    max_nodes: int
    # batches[n - min_nodes]: the batch plan of a world of n nodes (the same global batch); None without one
    batches: Tuple[Optional[BatchPlan], ...]

    def batch_for(self, nodes: int) -> Optional[BatchPlan]:
        assert self.min_nodes <= nodes <= self.max_nodes, nodes
        return self.batches[nodes - self.min_nodes]

    @property
    def label(self) -> str:
        return f"{self.min_nodes}:{self.max_nodes}"


def node_range(value: Any) -> Optional[Tuple[int, int]]:
    """``num_nodes`` as (MIN, MAX) when it is a range (``"2:3"``); None when it is a count (checked elsewhere)."""
    value = check.plain(value)
    if not isinstance(value, str) or ":" not in value:
        return None
    found = _RANGE.match(value)
    if found is None:
        raise ConfigError("num_nodes", value, "expected a node count or a range MIN:MAX of whole numbers", _HINT)
    low, high = int(found.group(1)), int(found.group(2))
    if low < 1 or high <= low:
        raise ConfigError("num_nodes", value, "an elastic range needs 1 <= MIN < MAX", _HINT)
    return low, high


def plan_elastic(
    low: int, high: int, devices: int, batch_of: Callable[[int], Optional[BatchPlan]], global_size: Optional[int]
) -> ElasticPlan:
    """The elastic plan of ``low..high`` nodes: ``batch_of(nodes)`` plans each world's batch; a global batch one of
    them cannot divide is refused naming every world it must divide."""
    batches = []
    for nodes in range(low, high + 1):
        try:
            batches.append(batch_of(nodes))
        except ConfigError as error:
            if error.key != "batch.global_size" or global_size is None:
                raise
            worlds = [n * devices for n in range(low, high + 1)]
            step = math.lcm(*worlds)
            fits = step * max(1, round(global_size / step))
            raise ConfigError(
                "batch.global_size",
                global_size,
                f"an elastic job (num_nodes={low}:{high}, devices={devices}) keeps its global batch in every world "
                f"it may have, so it must be divisible by each world size ({', '.join(map(str, worlds))})",
                f"use a multiple of {step}, e.g. batch.global_size={fits}",
            ) from None
    return ElasticPlan(min_nodes=low, max_nodes=high, batches=tuple(batches))
