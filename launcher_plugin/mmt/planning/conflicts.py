"""Settings of the app's own config that cannot work in a process mmt started, found when the job is planned.

mmt starts every rank itself. A Lightning ``Trainer`` or ``Fabric`` whose strategy starts processes of its own
(``ddp_spawn``, ``ddp_fork``, ``ddp_notebook``, a strategy ``_target_`` with ``start_method: spawn``;
lightning-hydra-template's ``trainer=ddp_sim``) would start ``devices`` more processes inside each of mmt's ranks;
they all try to take the job's rendezvous port, and the job dies after tens of seconds with
``ProcessRaisedException: -- Process 0 terminated`` from inside them. Such a job is refused before anything starts,
in one line naming the key, the strategy and what to use instead, as a topology mismatch is at rendezvous
(``mmt.worker.guards``).

Only the job's composed config is read (its ``hydra`` node aside); nothing of Lightning is imported.
"""

from typing import Any, Iterator, Optional, Tuple

from omegaconf import DictConfig, ListConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from mmt.core.errors import ConfigError

# the nodes whose ``strategy`` a Lightning Trainer or Fabric receives: by their key, or by their _target_'s class
_OWNERS = ("trainer", "fabric")
# the start methods of Lightning's DDP launchers that start processes (``popen`` is a script launcher, which does
# nothing in a process that already has its rank, as mmt's do)
_SPAWNING_METHODS = ("spawn", "fork", "forkserver")
# the words of Lightning's registered strategy names that start processes: ddp_spawn, ddp_fork, ddp_notebook and
# their _find_unused_parameters_* variants; Lightning 1.x's ddp_sharded_spawn, tpu_spawn
_SPAWNING_WORDS = ("spawn", "fork", "notebook")
_DEPTH = 32  # an interpolation that points back at an ancestor must not walk forever
# the keys whose interpolations are resolved (trainer: ${...}, strategy: ${...}, _target_: ${...})
_RESOLVED = ("strategy", "_target_") + _OWNERS


def _children(node: Any) -> Iterator[Tuple[str, Any]]:
    """(key, value) of a config node's children. An interpolation is resolved only where it may hold what is looked
    for (a strategy, a _target_, a trainer node): a value that does not resolve here is left out (the rank resolves
    it, and names it, if it is used), and no other resolver runs."""
    keys = range(len(node)) if isinstance(node, ListConfig) else list(node.keys())
    for key in keys:
        if OmegaConf.is_interpolation(node, key) and str(key).lower() not in _RESOLVED:
            continue
        try:
            yield str(key), node[key]
        except OmegaConfBaseException:  # an interpolation that does not resolve here (its resolver's error wrapped)
            continue


def _strategies(node: Any, path: str, owner: bool, depth: int = 0) -> Iterator[Tuple[str, Any]]:
    """(key, value) of every ``strategy`` of a Trainer- or Fabric-like node under ``node``."""
    if depth > _DEPTH or not isinstance(node, (DictConfig, ListConfig)):
        return
    for key, value in _children(node):
        where = f"{path}.{key}" if path else key
        if where == "hydra":
            continue
        if owner and key == "strategy":
            yield where, value
            continue
        yield from _strategies(value, where, _is_owner(key, value), depth + 1)


def _is_owner(key: str, value: Any) -> bool:
    if not isinstance(value, DictConfig):
        return False
    if key.lower() in _OWNERS:
        return True
    target = _target(value)
    return target is not None and target.rsplit(".", 1)[-1].lower() in _OWNERS


def _target(node: DictConfig) -> Optional[str]:
    try:
        target = node.get("_target_")
    except OmegaConfBaseException:  # an interpolation that does not resolve here
        return None
    return target if isinstance(target, str) else None


def _spawning(key: str, value: Any) -> Optional[Tuple[str, Any, str]]:
    """(key, value, how) when the strategy at ``key`` starts processes of its own."""
    if isinstance(value, str):
        words = value.strip().lower().split("_")
        if any(word in words for word in _SPAWNING_WORDS):
            return key, value, f"Lightning's {value!r} strategy starts its own processes"
        return None
    if isinstance(value, DictConfig):
        target = _target(value) or ""
        try:
            method = value.get("start_method")
        except OmegaConfBaseException:  # an interpolation that does not resolve here
            method = None
        if isinstance(method, str) and method.lower() in _SPAWNING_METHODS:
            return (
                f"{key}.start_method",
                method,
                (f"{target or 'the strategy'} with start_method={method!r} starts its own processes"),
            )
        if "spawn" in target.rsplit(".", 1)[-1].lower():
            return f"{key}._target_", target, f"{target} starts its own processes"
    return None


def check_strategies(config: Any) -> None:
    """Refuse a job whose Trainer or Fabric would start processes of its own inside mmt's ranks (ConfigError)."""
    if not isinstance(config, DictConfig):
        return
    for key, value in _strategies(config, "", owner=False):
        found = _spawning(key, value)
        if found is None:
            continue
        where, what, how = found
        raise ConfigError(
            where,
            what,
            f"{how} inside each process mmt starts, where they fight over the job's "
            "rendezvous port and fail after tens of seconds",
            f"{key}=ddp (mmt starts the processes; the Trainer or Fabric joins them)",
        )
