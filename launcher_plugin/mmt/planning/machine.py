"""The hardware of one node: a machine catalogue entry (``mmt/conf/machine/<name>.yaml``, shipped with mmt).

Names are Lightning's machine names in lower case (``a100_x_8`` for Lightning's ``A100_X_8``); Hydra, the CLI and the
SDK accept Lightning's spelling in any case (see ``hydra_plugins.mmt_launcher.mmt_searchpath``).
"""

from dataclasses import dataclass
from importlib import resources
from typing import Any, List, Optional

from omegaconf import DictConfig, OmegaConf

from mmt.core.errors import ConfigError
from mmt.planning import validate as check

_REQUIRED = ("name", "accelerator", "gpus", "cpus")
CATALOGUE_PACKAGE = "mmt.conf"


@dataclass(frozen=True)
class Machine:
    """Hardware of one node, from the machine catalogue."""

    name: str
    accelerator: str
    gpus: int
    cpus: Optional[int] = None
    memory_gb: Optional[float] = None
    gpu_type: Optional[str] = None
    gpu_memory_gb: Optional[float] = None
    instance_type: Optional[str] = None
    price_per_hour: Optional[float] = None
    price_source: Optional[str] = None
    # Lightning retired the machine type; the entry stays for configs that name it
    legacy: bool = False

    @property
    def default_devices(self) -> int:
        return self.gpus if self.gpus > 0 else 1


#: the machine of an app that names none: this host, one process per node, no price
UNSPECIFIED_MACHINE = Machine(name="unspecified", accelerator="cpu", gpus=0)


def canonical_name(name: str) -> str:
    """Lightning's spelling (``A100_X_8``, ``a100-x-8``) to the catalogue's file name (``a100_x_8``)."""
    return name.strip().lower().replace("-", "_")


def catalogue_names() -> List[str]:
    """The machine names the installed catalogue ships, sorted."""
    folder = resources.files(CATALOGUE_PACKAGE).joinpath("machine")
    return sorted(entry.name[:-5] for entry in folder.iterdir() if entry.name.endswith(".yaml"))


def machine_from_config(value: Any) -> Machine:
    if value is None:
        return UNSPECIFIED_MACHINE
    raw = OmegaConf.to_container(value, resolve=True) if isinstance(value, DictConfig) else value
    if not isinstance(raw, dict):
        raise ConfigError(
            "machine",
            raw,
            "expected a machine catalogue entry (conf/machine/<name>.yaml)",
            "pick one with machine=<name>; `python train.py --info defaults` lists the groups",
        )
    missing = [k for k in _REQUIRED if raw.get(k) is None]
    if missing:
        raise ConfigError(
            "machine",
            raw.get("name", raw),
            f"the catalogue entry lacks {', '.join(missing)}",
            "every conf/machine/*.yaml needs name, accelerator, gpus and cpus",
        )
    name = str(raw["name"])
    accelerator = check.choice(f"machine[{name}].accelerator", raw["accelerator"], ("cpu", "gpu"))
    gpus = check.whole_number(f"machine[{name}].gpus", raw["gpus"], 0, "GPUs per node, 0 on CPU machines")
    if (accelerator == "gpu") != (gpus > 0):
        raise ConfigError(
            f"machine[{name}].gpus",
            gpus,
            f"a {accelerator} machine has {'at least one GPU' if accelerator == 'gpu' else 'no GPUs'}",
            "fix the catalogue entry",
        )
    price = raw.get("price_per_hour")
    if price is not None:
        price = check.positive_number(f"machine[{name}].price_per_hour", price, "USD per node-hour, or null")
    return Machine(
        name=name,
        accelerator=accelerator,
        gpus=gpus,
        cpus=check.whole_number(f"machine[{name}].cpus", raw["cpus"], 1, "vCPUs per node"),
        memory_gb=raw.get("memory_gb"),
        gpu_type=raw.get("gpu_type"),
        gpu_memory_gb=raw.get("gpu_memory_gb"),
        instance_type=raw.get("instance_type"),
        price_per_hour=price,
        price_source=raw.get("price_source"),
        legacy=bool(raw.get("legacy", False)),
    )
