"""Tuned micro-batch tables: per-device micro-batch limits measured by ``tune.py``, kept in the repo of the recipe.

A table is a YAML file next to the recipe's code (``recipes/tuned/lm.yaml``; a shared recipe package ships its
own), named in the recipe's config as ``batch.table: pkg://<package>/<file>`` (or an absolute path). Each entry is
keyed by (recipe, machine, precision, memory per device) and carries its provenance: when, with which library
versions, under which memory budget, and the samples/s of every candidate tried.

The launcher reads tables while planning (no torch import here); the tuner writes them.
"""

from __future__ import annotations

import importlib.util
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict, List, Optional

import yaml

PKG_PREFIX = "pkg://"
_PRECISION_ALIASES = {"32": "32-true", "16": "16-mixed", "bf16": "bf16-mixed", "64": "64-true"}
_HEADER = """\
# Tuned per-device micro-batch limits, written by `python tune.py recipe=<recipe> machine=<machine>`.
# Key: recipe, machine, precision, memory_per_device_gb (the budget the search ran under).
# micro_batch is the limit a job's batch plan uses: the fastest candidate that fits within the safety margin.
# Re-tune instead of editing by hand: every entry records how it was measured.
"""


def normalize_precision(value: Any) -> str:
    """Lightning's precision spellings, one name each: 32 / "32" / "32-true" are the same key."""
    text = str(value).strip()
    return _PRECISION_ALIASES.get(text, text)


def device_memory_gb(
    *, gpus: Optional[int], gpu_memory_gb: Optional[float], memory_gb: Optional[float], devices: int
) -> Optional[float]:
    """Memory one device may use, the key's last part: the GPU's memory, or on CPU machines the node's memory
    shared by its processes; None when the machine does not state it. The tuner keys what it writes with this and
    the launcher looks entries up with it, so the two always agree."""
    if gpus:
        return float(gpu_memory_gb) if gpu_memory_gb else None
    return float(memory_gb) / devices if memory_gb else None


class TableLocationError(ValueError):
    """``batch.table`` names no package or path that exists."""


def table_path(location: str) -> Path:
    """``pkg://dotted.package/file.yaml`` (a file inside an importable package) or a filesystem path."""
    if not location.startswith(PKG_PREFIX):
        return Path(os.path.expanduser(location)).resolve()
    package, _, relative = location[len(PKG_PREFIX) :].partition("/")
    if not package or not relative:
        raise TableLocationError(f"{location!r} is not pkg://<package>/<file>")
    try:
        spec = importlib.util.find_spec(package)  # imports the parent packages only, never the recipe code
    except (ImportError, ValueError):
        spec = None
    if spec is None or not spec.submodule_search_locations:
        raise TableLocationError(f"package {package!r} of {location!r} cannot be found (is it installed?)")
    return Path(list(spec.submodule_search_locations)[0]) / relative


@dataclass(frozen=True)
class TunedEntry:
    recipe: str
    machine: str
    precision: str
    memory_per_device_gb: float
    micro_batch: int
    raw: Dict[str, Any]

    @property
    def provenance(self) -> str:
        versions = self.raw.get("versions") or {}
        libs = ", ".join(f"{k} {v}" for k, v in versions.items() if k in ("torch", "lightning"))
        rate = self.raw.get("samples_per_s")
        rate_text = f", {rate:g} samples/s" if isinstance(rate, (int, float)) else ""
        return f"tuned {self.raw.get('tuned_at', '?')}{', ' + libs if libs else ''}{rate_text}"


def read_table(path: Path) -> List[TunedEntry]:
    """The entries of a table file; a missing file is an empty table (nothing tuned yet)."""
    if not path.exists():
        return []
    data = yaml.safe_load(path.read_text()) or {}
    entries = []
    for raw in data.get("entries") or []:
        entries.append(
            TunedEntry(
                recipe=str(raw["recipe"]),
                machine=str(raw["machine"]),
                precision=normalize_precision(raw["precision"]),
                memory_per_device_gb=float(raw["memory_per_device_gb"]),
                micro_batch=int(raw["micro_batch"]),
                raw=dict(raw),
            )
        )
    return entries


def lookup(
    entries: List[TunedEntry], recipe: str, machine: str, precision: str, memory_per_device_gb: Optional[float]
) -> Optional[TunedEntry]:
    """The entry for this key tuned under the largest budget that does not exceed the job's memory per device.

    An entry tuned with more memory than the job has per device would overcommit it, so it never applies.
    """
    precision = normalize_precision(precision)
    same = [e for e in entries if (e.recipe, e.machine, e.precision) == (recipe, machine, precision)]
    if memory_per_device_gb is not None:
        same = [e for e in same if e.memory_per_device_gb <= memory_per_device_gb + 1e-9]
    return max(same, key=lambda e: e.memory_per_device_gb, default=None)


def write_entry(path: Path, entry: Dict[str, Any]) -> None:
    """Add ``entry`` to the table at ``path``, replacing the one with the same key; atomic."""
    key = ("recipe", "machine", "precision", "memory_per_device_gb")
    data = yaml.safe_load(path.read_text()) if path.exists() else None
    entries = [
        e
        for e in ((data or {}).get("entries") or [])
        if tuple(e.get(k) for k in key) != tuple(entry.get(k) for k in key)
    ]
    entries.append(entry)
    entries.sort(
        key=lambda e: (str(e["recipe"]), str(e["machine"]), str(e["precision"]), float(e["memory_per_device_gb"]))
    )
    text = _HEADER + yaml.safe_dump({"entries": entries}, sort_keys=False, default_flow_style=None, width=110)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    with os.fdopen(fd, "w") as handle:
        handle.write(text)
    os.replace(tmp, path)
