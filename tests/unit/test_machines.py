"""The machine catalogue (``mmt/conf/machine/*.yaml``, shipped with mmt), as files.

Every current Lightning machine name has an entry with sane facts and a sourced price (no network: the files are
read as they are), and the retired A10G entries say they are legacy. (Hydra finding the entries in any case, and an
app's own ``conf/machine/<name>.yaml`` overriding the shipped one: tests/e2e/test_machines.py.)
"""

import math
import re

import pytest
import yaml
from omegaconf import OmegaConf

from helpers.paths import CATALOGUE
from mmt.planning.machine import catalogue_names, machine_from_config

# lightning_sdk 2026.10.13 `Machine` names that the catalogue covers (see conf/machine/SOURCES.md)
LIGHTNING_MACHINES = [
    "CPU_SMALL",
    "CPU",
    "CPU_X_2",
    "CPU_X_4",
    "CPU_X_8",
    "CPU_X_16",
    "T4_SMALL",
    "T4",
    "T4_X_2",
    "T4_X_4",
    "T4_X_8",
    "L4",
    "L4_X_2",
    "L4_X_4",
    "L4_X_8",
    "L40S",
    "L40S_X_2",
    "L40S_X_4",
    "L40S_X_8",
    "RTXP_6000",
    "RTXP_6000_X_2",
    "RTXP_6000_X_4",
    "RTXP_6000_X_8",
    "A100",
    "A100_X_2",
    "A100_X_4",
    "A100_X_8",
    "H100",
    "H100_X_2",
    "H100_X_4",
    "H100_X_8",
    "H200",
    "H200_X_2",
    "H200_X_4",
    "H200_X_8",
    "B200",
    "B200_X_8",
]
# Lightning names left out on purpose (no public host memory, disk or instance: see SOURCES.md)
NOT_COVERED = ["DATA_PREP", "DATA_PREP_MAX", "DATA_PREP_ULTRA"]
# kept for configs that still name them; Lightning no longer offers A10G
LEGACY = ["a10g", "a10g_x_4"]

KEYS = (
    "name",
    "accelerator",
    "gpu_type",
    "gpus",
    "cpus",
    "memory_gb",
    "gpu_memory_gb",
    "instance_type",
    "price_per_hour",
    "price_source",
)


def _entries():
    return sorted(p.stem for p in CATALOGUE.glob("*.yaml"))


def _load(name: str) -> dict:
    return yaml.safe_load((CATALOGUE / f"{name}.yaml").read_text())


def _is_number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


# --------------------------------------------------------------------------------------------- the files


def test_every_lightning_machine_has_an_entry():
    missing = [m for m in LIGHTNING_MACHINES if not (CATALOGUE / f"{m.lower()}.yaml").is_file()]
    assert not missing, f"no catalogue file for {missing}"
    assert not set(LIGHTNING_MACHINES) & set(NOT_COVERED)


def test_no_entry_outside_the_lists():
    """Each file is a current Lightning machine or a listed legacy one, and the planner sees the same set."""
    expected = sorted({m.lower() for m in LIGHTNING_MACHINES} | set(LEGACY))
    assert _entries() == expected
    assert catalogue_names() == expected


@pytest.mark.parametrize("name", _entries())
def test_entry_is_well_formed(name):
    text = (CATALOGUE / f"{name}.yaml").read_text()
    raw = _load(name)
    legacy = name in LEGACY

    # the first line names the Lightning machine, as the other files do
    first = text.splitlines()[0]
    assert first.startswith(f"# Lightning machine {name.upper()} ("), first
    # the same keys in the same order everywhere; `legacy` is the last key of the legacy entries only
    assert tuple(raw) == KEYS + (("legacy",) if legacy else ())

    assert raw["name"] == name
    assert raw["accelerator"] in ("cpu", "gpu")
    gpus = raw["gpus"]
    assert isinstance(gpus, int) and not isinstance(gpus, bool) and gpus >= 0
    assert (raw["accelerator"] == "gpu") == (gpus > 0)
    if gpus:
        assert isinstance(raw["gpu_type"], str) and raw["gpu_type"]
        assert _is_number(raw["gpu_memory_gb"]) and raw["gpu_memory_gb"] > 0
    else:
        assert raw["gpu_type"] is None and raw["gpu_memory_gb"] is None
    assert isinstance(raw["cpus"], int) and raw["cpus"] > 0
    assert _is_number(raw["memory_gb"]) and raw["memory_gb"] > 0
    assert isinstance(raw["instance_type"], str) and raw["instance_type"].strip()

    source = raw["price_source"]
    assert isinstance(source, str) and len(source.strip()) > 20
    price = raw["price_per_hour"]
    if price is None:
        assert re.search(r"no (on-demand )?price|not sourced|could not", source, re.IGNORECASE), (
            f"{name}: price_per_hour is null but price_source gives no reason: {source!r}"
        )
    else:
        assert _is_number(price) and price > 0
        assert "read 2026-" in source, f"{name}: price_source does not say when the price was read"

    # the planner accepts the entry as it is
    machine = machine_from_config(OmegaConf.create(raw))
    assert machine.name == name and machine.gpus == gpus and machine.legacy == legacy


@pytest.mark.parametrize("name", LEGACY)
def test_a10g_entries_are_legacy(name):
    raw = _load(name)
    assert raw["legacy"] is True
    assert list(raw)[-1] == "legacy"
    assert "legacy: Lightning no longer offers A10G" in (CATALOGUE / f"{name}.yaml").read_text().splitlines()[0]
