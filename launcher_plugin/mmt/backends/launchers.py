"""Each backend's launcher config in Hydra's ConfigStore (``hydra/launcher=mmt_<name>``), and the packages holding
their ``cluster/<name>.yaml`` for Hydra's search path. Light: imported at Hydra's plugin scan."""

import importlib
from typing import Any, List

from hydra.core.config_store import ConfigStore

from mmt.backends import registry
from mmt.backends.spec import BackendSpec


def config_class(spec: BackendSpec) -> Any:
    """The backend's ``hydra.launcher`` dataclass (``spec.config``)."""
    assert spec.config is not None, f"backend {spec.name} has no launcher config"
    module, _, attr = spec.config.partition(":")
    return getattr(importlib.import_module(module), attr)


def store(spec: BackendSpec) -> None:
    """``hydra/launcher=mmt_<name>`` in Hydra's ConfigStore."""
    if spec.config is not None:
        ConfigStore.instance().store(
            group="hydra/launcher", name=spec.launcher, node=config_class(spec), provider="mmt_launcher"
        )


def conf_packages() -> List[str]:
    """The packages holding the backends' ``cluster/<name>.yaml``, each once, mmt's own first."""
    found: List[str] = []
    for spec in registry.specs():
        if spec.conf is not None and spec.conf not in found:
            found.append(spec.conf)
    return found
