"""Turn raw per-job values of a composed config into checked Python values, or raise ``ConfigError``.

Every message names the key, the bad value, what is allowed and a hint, and is raised before any process starts.
"""

import ipaddress
import math
import re
from typing import Any, Dict, List, Mapping, Optional, Sequence

from omegaconf import DictConfig, ListConfig, OmegaConf

from mmt.core.errors import ConfigError
from mmt.core.rank_env import FRAMEWORK_RESERVED, RESERVED, SCRUBBED_PREFIXES
from mmt.planning.redact import MASKED

_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_HOSTNAME = re.compile(
    r"^(?=.{1,253}$)[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?(\.[A-Za-z0-9]([A-Za-z0-9-]{0,61}"
    r"[A-Za-z0-9])?)*$"
)
COMMAND_MODES = ("per_node", "per_rank")
# what a user may not set through `env`: variables that make a framework detect another launcher or cluster. (The
# launcher also removes inherited LT_*/PL_TRAINER_*; set explicitly, those are Trainer/Fabric defaults and pass,
# except the topology ones the contract owns and a strategy that would start the ranks a second time.)
_REFUSED_PREFIXES = tuple(p for p in SCRUBBED_PREFIXES if p not in ("LT_", "PL_TRAINER_", "PL_FABRIC_"))
_SPAWNING = ("PL_TRAINER_STRATEGY", "LT_STRATEGY", "PL_TRAINER_NUM_PROCESSES")
# SLURM's own upper bound for --time is a year; anything larger is a typo (and 1e308 minutes overflows)
MAX_TIMEOUT_MIN = 366 * 24 * 60


def plain(value: Any) -> Any:
    """A config node as plain Python (dicts, lists, scalars), interpolations resolved."""
    if isinstance(value, (DictConfig, ListConfig)):
        return OmegaConf.to_container(value, resolve=True)
    return value


def settings_block(key: str, raw: Any, fields: Sequence[str], expected: str, hint: str) -> Dict[str, Any]:
    """A block of settings given as a mapping (``hydra.launcher.snapshot``, ``hydra.launcher.ssh``), as plain
    values; anything else, or a key it does not have, is one line naming the key."""
    if not OmegaConf.is_dict(raw):
        raise ConfigError(key, raw, expected, hint)
    given = OmegaConf.to_container(raw, resolve=True)
    assert isinstance(given, dict)
    unknown = sorted(str(k) for k in given if k not in fields)
    if unknown:
        raise ConfigError(f"{key}.{unknown[0]}", given[unknown[0]], f"expected one of {list(fields)}")
    return {str(k): v for k, v in given.items()}


def whole_number(key: str, value: Any, minimum: int, hint: str, maximum: Optional[int] = None) -> int:
    value = plain(value)
    # bool is an int in Python; `num_nodes=true` is still a mistake
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ConfigError(key, value, f"expected a whole number >= {minimum}", hint)
    if maximum is not None and value > maximum:
        raise ConfigError(key, value, f"expected a whole number <= {maximum:,}", hint)
    return value


def positive_number(key: str, value: Any, hint: str, maximum: Optional[float] = None) -> float:
    value = plain(value)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
        raise ConfigError(key, value, "expected a number > 0", hint)
    if maximum is not None and value > maximum:
        raise ConfigError(key, value, f"expected a number <= {maximum:,g}", hint)
    return float(value)


def optional_text(key: str, value: Any, what: str, hint: str) -> Optional[str]:
    """None stays None; anything else must be a non-blank string."""
    value = plain(value)
    if value is None:
        return None
    if not isinstance(value, str) or not value.strip():
        raise ConfigError(key, value, f"expected {what} (or null)", hint)
    return value


def one_line(key: str, value: Any, hint: str = "remove the newline") -> Any:
    """Paths and names end up in scripts, logs and file names: a newline or NUL in one is refused."""
    if isinstance(value, str) and ("\n" in value or "\r" in value or "\0" in value):
        raise ConfigError(key, value, "a value mmt writes into scripts and file names must fit on one line", hint)
    return value


def choice(key: str, value: Any, allowed: Sequence[str]) -> str:
    value = plain(value)
    if hasattr(value, "value"):  # an Enum-typed config field
        value = value.value
    if value not in allowed:
        raise ConfigError(key, value, f"expected one of {', '.join(allowed)}", f"e.g. {key}={allowed[0]}")
    return str(value)


def host_address(key: str, value: Any) -> str:
    """An IP address or a host name (what MASTER_ADDR may hold)."""
    value = plain(value)
    if isinstance(value, str):
        try:
            ipaddress.ip_address(value)
            return value
        except ValueError:
            if _HOSTNAME.match(value):
                return value
    raise ConfigError(key, value, "expected an IP address or a host name", f"e.g. {key}=127.0.0.1")


def _check_env_name(key: str, name: Any, item: Any) -> None:
    if not isinstance(name, str) or not _ENV_NAME.match(name):
        raise ConfigError(
            f"{key}.{name}",
            item,
            "environment variable names are letters, digits and _, not starting with a digit",
            f"rename it, e.g. {key}.{_suggest_name(str(name))}=...",
        )
    if name in FRAMEWORK_RESERVED:
        raise ConfigError(
            f"{key}.{name}",
            item,
            f"{name} is written by mmt for every process, each its own",
            "drop it; set hydra.launcher.framework=tensorflow (TF_CONFIG) or jax (JAX_*) instead",
        )
    if name in RESERVED:
        raise ConfigError(
            f"{key}.{name}",
            item,
            f"{name} belongs to the rank contract the launcher sets ({', '.join(sorted(RESERVED))})",
            "drop it; use num_nodes/devices to change the topology",
        )
    if name in _SPAWNING:
        raise ConfigError(
            f"{key}.{name}",
            item,
            "mmt starts every rank itself; a strategy set here could spawn "
            "them a second time (ddp_spawn, ddp_fork) or disagree with the plan",
            "set the strategy in the script or config (strategy=ddp), not through env",
        )
    prefix = next((p for p in _REFUSED_PREFIXES if name.startswith(p)), None)
    if prefix == "MMT_":
        raise ConfigError(
            f"{key}.{name}",
            item,
            "MMT_* variables belong to mmt, which sets them for every rank",
            "use the hydra.launcher.* setting of that name, or rename your own variable",
        )
    if prefix is not None:
        raise ConfigError(
            f"{key}.{name}",
            item,
            f"{prefix}* variables are removed from every rank's environment: "
            "they make Lightning or torch believe they run under another launcher (a stray SLURM_NTASKS "
            "selects Lightning's SLURM environment and fails on --ntasks)",
            "use num_nodes/devices/hydra.launcher.* for the topology, or rename your own variable",
        )


def env_vars(key: str, value: Any) -> Dict[str, str]:
    value = plain(value)
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise ConfigError(key, value, "expected a mapping of variable names to values", f"e.g. +{key}.MY_FLAG=1")
    result: Dict[str, str] = {}
    for name, item in value.items():
        _check_env_name(key, name, MASKED)
        if item is None or isinstance(item, (dict, list)):
            raise ConfigError(
                f"{key}.{name}",
                MASKED if item is not None else None,
                "expected a string, number or boolean",
                f"e.g. {key}.{name}=1",
            )
        result[name] = str(item).lower() if isinstance(item, bool) else str(item)
    return result


def env_names(key: str, value: Any, available: Mapping[str, str]) -> List[str]:
    """Names of variables to copy from the launcher's own environment (secrets stay off the command line)."""
    value = plain(value)
    if value is None:
        return []
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, list):
        raise ConfigError(key, value, "expected a list of environment variable names", f"e.g. {key}=[HF_TOKEN]")
    for name in value:
        _check_env_name(key, name, name)
    missing = [name for name in value if name not in available]
    if missing:
        raise ConfigError(
            key,
            missing,
            "not set in the launcher's environment, so there is nothing to copy",
            f"export {missing[0]}=... before launching, or drop it from {key}",
        )
    return list(dict.fromkeys(value))


def _suggest_name(name: str) -> str:
    cleaned = re.sub(r"[^A-Za-z0-9_]", "_", name)
    return cleaned if _ENV_NAME.match(cleaned) else f"_{cleaned}"


# a job's or a launch's name, as the registry holds it (mmt.launching.prepare.check_name's rule)
_JOB_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,120}$")


def names_list(key: str, value: Any, hint: str) -> List[str]:
    """A list of job or launch names (a single name is a list of one), each as the registry spells names."""
    value = plain(value)
    if value is None:
        return []
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, list):
        raise ConfigError(key, value, "expected a list of names", hint)
    for name in value:
        if not isinstance(name, str) or not _JOB_NAME.match(name):
            raise ConfigError(
                key, name, "expected a name: letters, digits, '.', '-' and '_', starting with a letter or digit", hint
            )
    return list(dict.fromkeys(value))
