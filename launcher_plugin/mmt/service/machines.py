"""``Machine``: Lightning's machine types (``lightning_sdk.Machine``) over mmt's catalogue, for the SDK and for the
handle's ``job.machine``.

A member per catalogue entry (``Machine.T4``, ``Machine.A100_X_8``): a ``str`` whose value is the catalogue's name
(``"a100_x_8"``, what ``machine=`` and ``--machine`` take), whose ``name`` is Lightning's (``"A100_X_8"``).
``Machine.from_str`` matches as Lightning's does: a name in any spelling, a slug (``lit-a100-8``, ``cpu-4``) or an
instance type (``p4d.24xlarge``); any other string becomes an ad-hoc machine of that name (a site's own machine in
the project's ``conf/machine/``; the planner refuses a name no config has).
"""

import enum
import functools
from importlib import resources
from typing import Dict, List, Optional

from omegaconf import OmegaConf

from mmt.planning.machine import CATALOGUE_PACKAGE, canonical_name, catalogue_names, machine_from_config
from mmt.planning.machine import Machine as CatalogueEntry

# Lightning's slug families where they are not the catalogue name's (lightning_sdk/machine.py)
_SLUG_FAMILY = {"rtxp_6000": "rtx-6000-pro"}
# slugs Lightning used before (lightning_sdk 2025.8.1: lit-h200x-<n>)
_OLD_SLUG_FAMILY = {"h200": "h200x"}


@functools.lru_cache(maxsize=None)
def _entry(name: str) -> Optional[CatalogueEntry]:
    """The catalogue entry of a machine name, None when the catalogue has none (an ad-hoc or site machine)."""
    if name not in catalogue_names():
        return None
    text = resources.files(CATALOGUE_PACKAGE).joinpath("machine", f"{name}.yaml").read_text()
    return machine_from_config(OmegaConf.create(text))


def _slugs(name: str) -> List[str]:
    """Lightning's slugs for a catalogue machine: ``cpu-<vCPUs>``, ``lit-<family>-<GPUs>[-small]``."""
    entry = _entry(name)
    if entry is None or entry.legacy:
        return []
    if entry.accelerator == "cpu":
        return [f"cpu-{entry.cpus}"]
    family = name.split("_x_")[0].replace("_small", "")
    suffix = "-small" if name.endswith("_small") else ""
    slugs = [f"lit-{_SLUG_FAMILY.get(family, family)}-{entry.gpus}{suffix}"]
    if family in _OLD_SLUG_FAMILY:
        slugs.append(f"lit-{_OLD_SLUG_FAMILY[family]}-{entry.gpus}{suffix}")
    return slugs


class MachineType(str, enum.Enum):
    """Lightning's ``Machine``, as a ``str`` enum of catalogue names."""

    def __str__(self) -> str:  # print(job.machine): the name --machine takes
        return str(self.value)

    def __format__(self, spec: str) -> str:  # f"{job.machine}" too
        return format(str(self.value), spec)

    @property
    def slug(self) -> Optional[str]:
        slugs = _slugs(self.value)
        return slugs[0] if slugs else None

    @property
    def instance_type(self) -> Optional[str]:
        entry = _entry(self.value)
        return entry.instance_type if entry else None

    @property
    def accelerator_count(self) -> Optional[int]:
        """GPUs per machine; vCPUs for a CPU machine (Lightning's convention)."""
        entry = _entry(self.value)
        if entry is None:
            return None
        return entry.gpus if entry.gpus else entry.cpus

    def is_cpu(self) -> bool:
        entry = _entry(self.value)
        return entry is not None and entry.accelerator == "cpu"

    @classmethod
    def from_str(cls, machine: str) -> "MachineType":
        """Lightning's ``Machine.from_str``: a name (any case, ``-`` or ``_``), a slug, or an instance type; any
        other string is an ad-hoc machine of that name."""
        text = str(machine.value if isinstance(machine, enum.Enum) else machine).strip()
        name = canonical_name(text)
        members: Dict[str, MachineType] = dict(cls.__members__)
        for member in members.values():
            if member.value == name:
                return member
        for member in members.values():  # catalogue order: cpu before cpu_x_4, which share cpu-4
            if text.lower() in _slugs(member.value):
                return member
        for member in members.values():
            if member.instance_type and member.instance_type == text.lower():
                return member
        adhoc = str.__new__(cls, name)
        adhoc._name_, adhoc._value_ = name.upper(), name
        return adhoc


#: ``Machine.T4``, ``Machine.A100_X_8`` ...: every machine of the installed catalogue
Machine = MachineType(
    "Machine",
    {name.upper(): name for name in catalogue_names()},  # type: ignore[call-overload]
    module=__name__,
    qualname="Machine",
)
