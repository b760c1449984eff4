"""Composing a command job's config for the ``mmt`` CLI and the SDK, without touching the caller's Hydra.

The job's config is composed with Hydra's compose API from the config shipped with mmt (``mmt/conf/run.yaml``: the
machine catalogue, the cluster settings, and the project's own ``conf/`` when there is one, for site clusters).
That API works on Hydra's global state, and the SDK may be called inside a running ``@hydra.main`` app, whose state
it is: ``GlobalHydra`` (its config loader), ``HydraConfig`` (the app's ``HydraConfig.get()``, and what its
``${hydra:...}`` values resolve to), ``JobRuntime`` (the job name its next ``compose`` gets), ``VersionBase``, and
OmegaConf's resolvers. So the job is composed, planned and handed over in a state of its own (``kept_hydra_state``),
and the caller's state is put back as it was, the very same objects, whether that returned or raised.
"""

import copy
import difflib
import os
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator, List, Optional, Sequence, Tuple

from mmt.core.errors import ConfigError


@contextmanager
def kept_hydra_state() -> Iterator[None]:
    """Inside the block, Hydra's global state is the block's own: a copy of the caller's (as Hydra's launchers hand
    each job a copy of it, ``Singleton.get_state``), except ``GlobalHydra``, which starts cleared; the registries are
    shared. After it, whether it returned or raised, the caller's again: every singleton and resolver the caller had
    is the same object, never changed (``HydraConfig.get()``, ``GlobalHydra``'s config loader ...), and one the caller
    did not have is gone (a plain script's ``GlobalHydra`` stays uninitialized), but for the registries' and the
    resolvers that an import added (``Singleton.set_state`` would drop them, and the import is not done again).

    Not for threads: Hydra's state is the process's, and the block's replaces it until the block ends."""
    from hydra._internal.sources_registry import SourcesRegistry
    from hydra.core.config_store import ConfigStore
    from hydra.core.global_hydra import GlobalHydra
    from hydra.core.plugins import Plugins
    from hydra.core.singleton import Singleton
    from omegaconf.basecontainer import BaseContainer

    # the singletons that say what is installed, not what an app is doing: the plugins found, the configs stored
    # (a plugin stores its own when first imported), the config source types. Shared: composing only adds to them,
    # as importing does, and what it added stays (a module is imported once)
    registries = (Plugins, ConfigStore, SourcesRegistry)
    instances, resolvers = Singleton._instances, BaseContainer._resolvers
    held, held_resolvers = dict(instances), dict(resolvers)
    Singleton._instances = {
        cls: obj if cls in registries else copy.deepcopy(obj) for cls, obj in held.items() if cls is not GlobalHydra
    }
    BaseContainer._resolvers = dict(held_resolvers)
    try:
        yield
    finally:
        used, used_resolvers = Singleton._instances, BaseContainer._resolvers
        instances.clear()
        instances.update(held)
        instances.update({cls: obj for cls, obj in used.items() if cls in registries and cls not in held})
        resolvers.clear()
        resolvers.update(held_resolvers)
        resolvers.update({name: f for name, f in used_resolvers.items() if name not in held_resolvers})
        Singleton._instances, BaseContainer._resolvers = instances, resolvers


def _missing_config(exc: Any) -> Optional[ConfigError]:
    """A config group option that does not exist (``--machine A100X8``, ``cluster=mysite``) in one line: what
    exists, and the closest names; None for what is not that."""
    group, _, wanted = str(getattr(exc, "missing_cfg_file", None) or "").partition("/")
    options = list(getattr(exc, "options", None) or [])
    if not group or not wanted or not options:
        return None
    close = difflib.get_close_matches(wanted, options, n=3, cutoff=0.6)
    hint = f"did you mean {' or '.join(close)}? " if close else ""
    if group == "machine":
        hint += "Lightning's names work in any case (A100_X_8, t4); a site's own: conf/machine/<name>.yaml here"
    elif group == "cluster":
        hint += "a site's own cluster: conf/cluster/<name>.yaml in this directory"
    return ConfigError(group, wanted, f"there is no such {group}; there are: {', '.join(options)}", hint or None)


def _compose(overrides: List[str]) -> Tuple[Any, Any]:
    """(hydra context, master config) for the job, composed like Hydra's multirun does, in Hydra's global state
    (GlobalHydra initialized with mmt's configs, HydraConfig the composed config's)."""
    from hydra import compose, initialize_config_module
    from hydra._internal.callbacks import Callbacks
    from hydra.core.global_hydra import GlobalHydra
    from hydra.core.hydra_config import HydraConfig
    from hydra.errors import MissingConfigException
    from hydra.types import HydraContext
    from omegaconf import open_dict

    GlobalHydra.instance().clear()
    initialize_config_module(config_module="mmt.conf", version_base="1.3", job_name="mmt")
    project = Path.cwd() / "conf"
    if (project / "cluster").is_dir() or (project / "machine").is_dir():
        overrides.append(f"hydra.searchpath=[file://{project}]")  # the project's site clusters and machines
    try:
        master = compose(config_name="run", overrides=overrides, return_hydra_config=True)
    except MissingConfigException as exc:
        missing = _missing_config(exc)
        if missing is None:
            raise
        raise missing from None
    with open_dict(master):
        master.hydra.runtime.cwd = os.getcwd()
    HydraConfig.instance().set_config(master)
    context = HydraContext(config_loader=GlobalHydra.instance().config_loader(), callbacks=Callbacks(master))
    return context, master


@contextmanager
def composed(overrides: Sequence[str]) -> Iterator[Tuple[Any, Any]]:
    """The job's (hydra context, master config), composed from ``mmt/conf/run.yaml`` with ``overrides``. Inside the
    block Hydra's global state is the job's, as planning and packing it need (its payload carries a copy of it to the
    job's processes; a ``${hydra:...}`` value resolves to the job's); after it, the caller's as it was, whether
    composing or the block raised (``kept_hydra_state``)."""
    with kept_hydra_state():
        yield _compose(list(overrides))
