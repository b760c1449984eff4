"""A backend's ``hydra.launcher.*`` settings, read from a table: each backend names its keys and how each is
validated (``key -> check``); this reads them from the launcher config as plain values (OmegaConf's containers
resolved into dicts and lists) and checks them in the table's order, so that the first bad key is the one said.

The checks of the settings every backend with node agents has (``poll_interval_s``, ``kill_grace_s``,
``start_method``) are here too; the rest are each backend's own.
"""

from typing import Any, Callable, Dict, Iterable, Mapping, Optional

from omegaconf import DictConfig, OmegaConf

from mmt.core.states import StartMethod, values
from mmt.planning import validate as check

# one setting's check: its plain value -> the validated one (a ConfigError naming its key when it is bad)
Check = Callable[[Any], Any]


def key(name: str) -> str:
    """The key a user sets: ``hydra.launcher.<name>``."""
    return f"hydra.launcher.{name}"


def plain_values(cfg: DictConfig, names: Iterable[str], optional: Optional[Mapping[str, Any]] = None) -> Dict[str, Any]:
    """The named keys of a launcher config as plain values; ``optional``: keys an older config may lack, with the
    value each takes then."""
    raw = {name: _plain(cfg[name]) for name in names}
    raw.update({name: OmegaConf.select(cfg, name, default=default) for name, default in (optional or {}).items()})
    return raw


def validated(raw: Mapping[str, Any], table: Mapping[str, Check]) -> Dict[str, Any]:
    """Every key of ``table`` checked, in the table's order: its validated value."""
    return {name: checked(raw[name]) for name, checked in table.items()}


def unless_none(checked: Check) -> Check:
    """A check for a setting whose null means "not set" (None stays None)."""
    return lambda value: None if value is None else checked(value)


def poll_interval_s(value: Any) -> float:
    """Seconds between the watcher's looks at the scheduler."""
    return check.positive_number(key("poll_interval_s"), value, "seconds, e.g. 1", maximum=3600)


def kill_grace_s(value: Any) -> float:
    """Seconds between SIGTERM and SIGKILL when a node agent stops its ranks."""
    return check.positive_number(
        key("kill_grace_s"), value, "seconds between SIGTERM and SIGKILL, e.g. 1", maximum=3600
    )


def start_method(value: Any) -> str:
    """How node agents start ranks."""
    return check.choice(key("start_method"), value, values(StartMethod))


def _plain(value: Any) -> Any:
    return OmegaConf.to_container(value, resolve=True) if OmegaConf.is_config(value) else value
