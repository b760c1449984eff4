"""Secrets never leave the job's private files: the values of ``env`` variables are masked in everything mmt
prints or writes for people to read (dry run, console, summary, result.json, ``.hydra/``, ``multirun.yaml``)."""

import re
from typing import Any, Iterable, List, Sequence

MASK = "***"


class _Masked:
    """Stands for a secret value in an error message: ``Invalid env.TOKEN=***``."""

    def __repr__(self) -> str:
        return MASK


MASKED = _Masked()


def _key_pattern(names: Iterable[str]) -> "re.Pattern[str]":
    # an override that sets one of these variables, however the app spells its env section:
    # env.X=..., +env.X=..., ++hydra.launcher.env.X=..., myapp.env.X=...
    alternatives = "|".join(re.escape(n) for n in sorted(set(names), key=len, reverse=True))
    return re.compile(rf"^(?P<key>[~+]{{0,2}}(?:[\w.]*\.)?env\.(?:{alternatives}))=(?P<value>.*)$", re.S)


def masked_overrides(overrides: Sequence[str], names: Iterable[str]) -> List[str]:
    """The overrides with the value of every env variable in ``names`` replaced by ``***``."""
    names = list(names)
    if not names:
        return list(overrides)
    pattern = _key_pattern(names)
    return [pattern.sub(lambda m: f"{m.group('key')}={MASK}", item) for item in overrides]


def masked_config(config: Any, names: Iterable[str]) -> Any:
    """A plain (to_container'd) config with the values of these env variables masked, wherever a mapping named
    ``env`` holds them, and in override lists."""
    names = set(names)
    if not names:
        return config
    pattern = _key_pattern(names)

    def walk(node: Any, key: Any = None) -> Any:
        if isinstance(node, dict):
            return {k: (MASK if key == "env" and k in names and v is not None else walk(v, k))
                    for k, v in node.items()}
        if isinstance(node, list):
            return [walk(item) for item in node]
        if isinstance(node, str):
            return pattern.sub(lambda m: f"{m.group('key')}={MASK}", node)
        return node

    return walk(config)
