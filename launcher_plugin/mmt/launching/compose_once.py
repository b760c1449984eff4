"""Compose each job of a sweep once, not twice.

A sweeper checks each batch before launching it (``Sweeper.validate_batch_is_legal``): it composes every job's
config and drops it. The launcher then composes every job again, which costs as much as the first time (40-60 ms
a job here, so a 1,000-job grid pays close to a minute for nothing). Both calls go to the same config loader with
the same master config and overrides, and give the same config: Hydra copies the master's resolver cache (``now``
...) into each. So the loader keeps the last config it composed for each job, and the launcher takes it.

A job whose overrides differ from a sibling's in plain values only is not composed by Hydra at all: its config is
the sibling's, with those values set (``mmt.launching.sibling_compose``).

A kept config is taken once (the launcher changes the config it gets: the job's id and output dir); the launcher
composes a fresh one for a job nobody checked, or for a second job with the same overrides. What a batch left is
dropped when its launch ends.

The kept configs never travel: the loader is part of Hydra's singleton state, which every job's payload carries, and
a copy or a pickle of the wrapper holds none of them (or every payload would carry every job still waiting, and a
sweep's planning would grow with the square of its size).
"""

import copy
from typing import Any, Dict, Sequence, Tuple

from mmt.launching.sibling_compose import SiblingComposer

_Key = Tuple[int, Tuple[str, ...]]


class ComposeOnce:
    """Wraps a Hydra ``ConfigLoader``'s ``load_sweep_config`` in place, so that every caller's result is kept."""

    def __init__(self, loader: Any) -> None:
        self.hydra_compose = loader.load_sweep_config
        self.siblings = SiblingComposer(loader)
        self.kept: Dict[_Key, Any] = {}

    @classmethod
    def install(cls, loader: Any) -> "ComposeOnce":
        existing = getattr(loader, "_mmt_compose_once", None)
        if isinstance(existing, cls):
            return existing
        wrapper = cls(loader)
        loader.load_sweep_config = wrapper.load_sweep_config
        loader._mmt_compose_once = wrapper
        return wrapper

    @staticmethod
    def _key(master_config: Any, overrides: Sequence[str]) -> _Key:
        # the master config lives as long as the sweep, so its id names it while a batch is checked and launched
        return id(master_config), tuple(overrides)

    def __deepcopy__(self, memo: Dict[int, Any]) -> "ComposeOnce":
        twin = ComposeOnce.__new__(ComposeOnce)
        memo[id(self)] = twin
        twin.hydra_compose, twin.kept = copy.deepcopy(self.hydra_compose, memo), {}
        twin.siblings = SiblingComposer(copy.deepcopy(self.siblings.loader, memo))
        return twin

    def __getstate__(self) -> Dict[str, Any]:
        return {"hydra_compose": self.hydra_compose, "siblings": self.siblings, "kept": {}}

    def compose(self, master_config: Any, overrides: Sequence[str]) -> Any:
        """The job's config: derived from a sibling's where only plain values differ, else composed by Hydra."""
        return self.siblings.compose(master_config, overrides, self.hydra_compose)

    def load_sweep_config(self, master_config: Any, sweep_overrides: Sequence[str]) -> Any:
        config = self.compose(master_config, sweep_overrides)
        self.kept[self._key(master_config, sweep_overrides)] = config
        return config

    def take(self, master_config: Any, overrides: Sequence[str]) -> Any:
        config = self.kept.pop(self._key(master_config, overrides), None)
        if config is None:
            config = self.compose(master_config, overrides)
        self.siblings.taken(config)
        return config


def compose_job(loader: Any, master_config: Any, overrides: Sequence[str]) -> Any:
    """The job's config: the one the sweeper composed when it checked the batch, else a new one."""
    wrapper = getattr(loader, "_mmt_compose_once", None)
    if isinstance(wrapper, ComposeOnce):
        return wrapper.take(master_config, overrides)
    return loader.load_sweep_config(master_config, list(overrides))


def forget(loader: Any) -> None:
    """Drop what a launch did not take (jobs a sweeper checked but did not hand to the launcher)."""
    wrapper = getattr(loader, "_mmt_compose_once", None)
    if isinstance(wrapper, ComposeOnce):
        wrapper.kept.clear()
        wrapper.siblings.forget()
