"""Every backend by its ``cluster=`` name. Adding one of mmt's is one package under ``mmt.backends`` and one line in
``BUILT_IN``; a backend of another package registers itself (:func:`register`), see :mod:`mmt.backends.spec`.

Light: imported by Hydra's plugin scan. A backend's class is imported on first use (the SLURM backend imports
submitit, which a local launch never needs), and the packages of other backends are looked for only when a name is
not known yet.
"""

import importlib
from typing import TYPE_CHECKING, Any, Dict, List, Optional, Type, Union

from mmt.backends.spec import BackendSpec

if TYPE_CHECKING:
    from mmt.backends.base import Backend

# mmt's own backends: each package's ``SPEC``
BUILT_IN = ("mmt.backends.local", "mmt.backends.slurm", "mmt.backends.ray")

# every backend known in this process, by name
BACKENDS: Dict[str, BackendSpec] = {}
_LOADED: List[bool] = []


class UnknownBackendError(KeyError):
    def __str__(self) -> str:
        return f"no backend named {self.args[0]!r}; known: {', '.join(names())}"


def _built_in() -> Dict[str, BackendSpec]:
    """BACKENDS, with mmt's own in it (read from their packages once)."""
    if not _LOADED:
        for package in BUILT_IN:
            spec: BackendSpec = importlib.import_module(package).SPEC
            BACKENDS.setdefault(spec.name, spec)
        _LOADED.append(True)
    return BACKENDS


def register(spec: Union[BackendSpec, str], target: Optional[str] = None) -> None:
    """Add a backend: how a package outside mmt plugs one in (from a module of Hydra's plugin namespace, so that
    every Hydra app and mmt's CLI find it). Its launcher config is stored in Hydra's ConfigStore at once.
    ``register(name, "package.module:Class")``: a backend that engine code drives directly (no Hydra config)."""
    if isinstance(spec, str):
        assert target is not None, "register(name, target) names the backend's class"
        spec = BackendSpec(name=spec, target=target)
    _built_in()[spec.name] = spec
    if spec.config is not None:
        from mmt.backends.launchers import store  # lazy: only a registration needs Hydra's ConfigStore

        store(spec)


def _discover() -> None:
    """Import the modules of Hydra's plugin namespace (Hydra's own plugin scan, once per process): where packages
    outside mmt register their backends."""
    from hydra.core.plugins import Plugins

    Plugins.instance()


def spec(name: str) -> BackendSpec:
    specs = _built_in()
    if name not in specs:
        _discover()
    try:
        return specs[name]
    except KeyError:
        raise UnknownBackendError(name) from None


def specs() -> List[BackendSpec]:
    """Every backend known in this process (mmt's own first)."""
    return list(_built_in().values())


def names() -> List[str]:
    return sorted(one.name for one in specs())


def job_noun(name: str) -> str:
    """What one job of backend ``name`` is called (``SLURM job``); ``<name> job`` for one that does not say."""
    try:
        found = spec(name)
    except UnknownBackendError:
        return f"{name} job"
    return found.noun or f"{name} job"


def scheduler_job(name: str, scheduler_id: object) -> str:
    """``SLURM job 123``: a job of backend ``name``, by its scheduler's id, named as a user knows it."""
    return f"{job_noun(name)} {scheduler_id}"


def backend_class(name: str) -> Type["Backend[Any]"]:
    module, _, attr = spec(name).target.partition(":")
    cls: Type["Backend[Any]"] = getattr(importlib.import_module(module), attr)
    return cls
