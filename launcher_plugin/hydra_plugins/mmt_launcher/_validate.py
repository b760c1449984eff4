"""Turn the raw per-job values of a composed config into checked Python values, or raise ``ConfigError``.

Every message names the key, the bad value, what is allowed and a hint, and is raised before any process starts.
"""

import math
import re
from typing import Any, Dict, Mapping, Optional

from omegaconf import DictConfig, ListConfig, OmegaConf

from mmt.rank_env import RESERVED

from .errors import ConfigError

_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
COMMAND_MODES = ("per_node", "per_rank")


def plain(value: Any) -> Any:
    """A config node as plain Python (dicts, lists, scalars), interpolations resolved."""
    if isinstance(value, (DictConfig, ListConfig)):
        return OmegaConf.to_container(value, resolve=True)
    return value


def whole_number(key: str, value: Any, minimum: int, hint: str) -> int:
    value = plain(value)
    # bool is an int in Python; `num_nodes=true` is still a mistake
    if isinstance(value, bool) or not isinstance(value, int):
        raise ConfigError(key, value, f"expected a whole number >= {minimum}", hint)
    if value < minimum:
        raise ConfigError(key, value, f"expected a whole number >= {minimum}", hint)
    return value


def positive_number(key: str, value: Any, hint: str) -> float:
    value = plain(value)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
        raise ConfigError(key, value, "expected a number > 0", hint)
    return float(value)


def optional_text(key: str, value: Any, what: str, hint: str) -> Optional[str]:
    """None stays None; anything else must be a non-blank string."""
    value = plain(value)
    if value is None:
        return None
    if not isinstance(value, str) or not value.strip():
        raise ConfigError(key, value, f"expected {what} (or null)", hint)
    return value


def choice(key: str, value: Any, allowed: tuple[str, ...]) -> str:
    value = plain(value)
    if value not in allowed:
        raise ConfigError(key, value, f"expected one of {', '.join(allowed)}", f"e.g. {key}={allowed[0]}")
    return str(value)


def env_vars(key: str, value: Any) -> Dict[str, str]:
    value = plain(value)
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise ConfigError(key, value, "expected a mapping of variable names to values", f"e.g. +{key}.MY_FLAG=1")
    result: Dict[str, str] = {}
    for name, item in value.items():
        if not isinstance(name, str) or not _ENV_NAME.match(name):
            raise ConfigError(
                f"{key}.{name}", item, "environment variable names are letters, digits and _, not starting "
                "with a digit", f"rename it, e.g. {key}.{_suggest_name(str(name))}={item!r}"
            )
        if name in RESERVED:
            raise ConfigError(
                f"{key}.{name}", item, f"{name} belongs to the rank contract the launcher sets "
                f"({', '.join(sorted(RESERVED))})", "drop it; use num_nodes/devices to change the topology"
            )
        if item is None or isinstance(item, (dict, list)):
            raise ConfigError(f"{key}.{name}", item, "expected a string, number or boolean",
                              f"e.g. {key}.{name}=1")
        result[name] = str(item).lower() if isinstance(item, bool) else str(item)
    return result


def _suggest_name(name: str) -> str:
    cleaned = re.sub(r"[^A-Za-z0-9_]", "_", name)
    return cleaned if _ENV_NAME.match(cleaned) else f"_{cleaned}"
