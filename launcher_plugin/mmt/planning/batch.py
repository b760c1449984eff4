"""The batch plan of a job: a recipe's global batch size, split over the job's ranks for its machine.

global = world x micro x accumulate. The recipe states ``batch.global_size`` (the number the learning rate is
tuned for, kept constant across node counts); the per-device micro-batch is the largest divisor of
global / world that does not exceed the machine's limit, and accumulation makes up the rest. The limit comes from
the recipe's tuned table (``mmt.planning.tuned``), else from the recipe's own ``batch.default_micro``.

Recipe config (``@package _global_``)::

    batch:
      global_size: 64                       # samples per optimizer step, over all ranks
      recipe: lm                            # the recipe's key in its tuned table
      precision: ${recipe.precision}        # part of the key: memory depends on it
      default_micro: 16                     # the limit when the table has no entry for this machine
      micro: null                           # force a micro-batch (must divide global / world, <= the limit)
      table: pkg://recipes.tuned/lm.yaml    # where the tuned limits live (a package file or an absolute path)
"""

from dataclasses import dataclass
from typing import Any, Dict, List, Optional

from mmt.core.errors import ConfigError
from mmt.core.rank_env import batch_env
from mmt.planning import tuned
from mmt.planning import validate as check

_KEYS = ("global_size", "recipe", "precision", "default_micro", "micro", "table")


@dataclass(frozen=True)
class BatchPlan:
    global_size: int
    world_size: int
    micro: int
    accumulate: int
    # the largest micro-batch one device may take, and where that number came from
    limit: int
    limit_source: str

    def __post_init__(self) -> None:
        assert self.world_size * self.micro * self.accumulate == self.global_size, self

    def env(self) -> Dict[str, str]:
        return batch_env(self.global_size, self.micro, self.accumulate)

    def describe(self) -> str:
        ranks = "rank" if self.world_size == 1 else "ranks"
        return (
            f"global {self.global_size} = {self.world_size} {ranks} x micro {self.micro} x accumulate "
            f"{self.accumulate}; limit {self.limit} per device ({self.limit_source})"
        )


def _divisors(n: int) -> List[int]:
    small = [d for d in range(1, int(n**0.5) + 1) if n % d == 0]
    return sorted(set(small + [n // d for d in small]))


def _valid_node_counts(global_size: int, devices: int, limit: int = 64) -> List[int]:
    return [n for n in range(1, min(limit, global_size // devices) + 1) if global_size % (n * devices) == 0]


def _indivisible(global_size: int, num_nodes: int, devices: int) -> ConfigError:
    world = num_nodes * devices
    nodes = _valid_node_counts(global_size, devices)
    lower, upper = (global_size // world) * world, (global_size // world + 1) * world
    sizes = " or ".join(str(s) for s in (lower, upper) if s > 0)
    hint = (
        f"with devices={devices}, num_nodes={','.join(map(str, nodes))} divide it"
        if nodes
        else f"no node count divides it with devices={devices}"
    )
    return ConfigError(
        "batch.global_size",
        global_size,
        f"must be divisible by the world size {world} ({num_nodes} nodes x {devices} devices) so "
        "that every rank takes the same share of each optimizer step",
        f"{hint}; or keep num_nodes={num_nodes} and set batch.global_size={sizes}",
    )


def _limit(spec: Dict[str, Any], machine: Any, devices: int) -> tuple:
    """(limit, where it came from) for this recipe on this machine."""
    default = check.whole_number(
        "batch.default_micro",
        spec.get("default_micro", 1),
        1,
        "the recipe's micro-batch per device when nothing is tuned, e.g. 16",
    )
    location = spec.get("table")
    if location is None:
        return default, "batch.default_micro: the recipe names no tuned table (batch.table)"
    location = check.optional_text(
        "batch.table", location, "pkg://<package>/<file>.yaml or a path", "e.g. batch.table=pkg://recipes.tuned/lm.yaml"
    )
    assert location is not None  # checked above: None returned early
    try:
        path = tuned.table_path(location)
        entries = tuned.read_table(path)
    except tuned.TableLocationError as exc:
        raise ConfigError("batch.table", location, str(exc), "install the recipe's package, or fix the name") from None
    except (OSError, ValueError, KeyError, TypeError) as exc:  # yaml errors are ValueErrors
        raise ConfigError(
            "batch.table", location, f"unreadable tuned table: {exc}", "re-run the tuner or restore the file"
        ) from None
    recipe = (
        check.optional_text(
            "batch.recipe", spec.get("recipe"), "the recipe's name in its tuned table", "e.g. batch.recipe=lm"
        )
        or "?"
    )
    precision = tuned.normalize_precision(spec.get("precision", "32-true"))
    memory = tuned.device_memory_gb(
        gpus=machine.gpus, gpu_memory_gb=machine.gpu_memory_gb, memory_gb=machine.memory_gb, devices=devices
    )
    entry = tuned.lookup(entries, recipe, machine.name, precision, memory)
    key = f"{recipe}/{machine.name}/{precision}"
    if entry is not None:
        return entry.micro_batch, (
            f"tuned for {key} with {entry.memory_per_device_gb:g} GiB per device, {entry.provenance}; {location}"
        )
    bigger = [e for e in entries if (e.recipe, e.machine, e.precision) == (recipe, machine.name, precision)]
    why = (
        f"the entries for {key} were tuned with more than this job's {memory:g} GiB per device"
        if bigger and memory is not None
        else f"no tuned entry for {key} in {location}"
    )
    return default, f"batch.default_micro: {why}"


def plan_batch(value: Any, *, machine: Any, num_nodes: int, devices: int) -> Optional[BatchPlan]:
    """The job's batch plan, or None when the recipe states no ``batch.global_size``."""
    spec = check.plain(value)
    if spec is None:
        return None
    if not isinstance(spec, dict):
        raise ConfigError("batch", spec, "expected a mapping with global_size (or null)", "e.g. batch.global_size=64")
    unknown = sorted(set(spec) - set(_KEYS))
    if unknown:
        raise ConfigError(
            f"batch.{unknown[0]}",
            spec[unknown[0]],
            f"not a batch key; expected {', '.join(_KEYS)}",
            "fix the recipe config",
        )
    if spec.get("global_size") is None:
        return None
    global_size = check.whole_number(
        "batch.global_size",
        spec["global_size"],
        1,
        "samples per optimizer step over all ranks, e.g. batch.global_size=64",
    )
    world = num_nodes * devices
    if global_size % world:
        raise _indivisible(global_size, num_nodes, devices)
    per_rank = global_size // world
    limit, source = _limit(spec, machine, devices)
    if limit < 1:
        raise ConfigError(
            "batch",
            f"limit {limit}",
            f"not even one sample fits a device ({source})",
            "use a machine with more memory per device, or fewer devices per node",
        )
    forced = spec.get("micro")
    if forced is not None:
        forced = check.whole_number("batch.micro", forced, 1, "a micro-batch per device, or null to choose it")
        if per_rank % forced or forced > limit:
            fits = [d for d in _divisors(per_rank) if d <= limit]
            raise ConfigError(
                "batch.micro",
                forced,
                f"must divide global_size / world = {global_size} / {world} = "
                f"{per_rank} and be <= the limit {limit} ({source})",
                f"use one of {', '.join(map(str, fits))}, or batch.micro=null to choose it",
            )
        micro = forced
        limit_source = f"{source}; batch.micro forced {forced}"
    else:
        micro = max(d for d in _divisors(per_rank) if d <= limit)
        limit_source = source
    return BatchPlan(
        global_size=global_size,
        world_size=world,
        micro=micro,
        accumulate=per_rank // micro,
        limit=limit,
        limit_source=limit_source,
    )
