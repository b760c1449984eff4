"""Every backend by its ``cluster=`` name. Adding a backend is one folder under ``mmt.backends`` and one line here.

The classes are imported on first use: the SLURM backend imports submitit, which a local launch never needs.
"""

import importlib
from typing import Any, Dict, List, Type

from mmt.backends.base import Backend

# name -> "module:Class"; the name is what records and the registry store (``JobRecord.backend``)
BACKENDS: Dict[str, str] = {
    "local": "mmt.backends.local.backend:LocalBackend",
    "slurm": "mmt.backends.slurm.backend:SlurmBackend",
    "ray": "mmt.backends.ray.backend:RayBackend",
}


class UnknownBackendError(KeyError):
    def __str__(self) -> str:
        return f"no backend named {self.args[0]!r}; known: {', '.join(names())}"


def register(name: str, target: str) -> None:
    """Add a backend (``"package.module:Class"``) under ``name``: how a backend outside mmt plugs in."""
    BACKENDS[name] = target


def names() -> List[str]:
    return sorted(BACKENDS)


def backend_class(name: str) -> Type[Backend[Any]]:
    try:
        module, _, attr = BACKENDS[name].partition(":")
    except KeyError:
        raise UnknownBackendError(name) from None
    cls: Type[Backend[Any]] = getattr(importlib.import_module(module), attr)
    return cls
