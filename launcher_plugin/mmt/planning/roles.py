"""A job's roles (``roles.<name>.*``): named parts of one job, each with its own node count, devices, command and
environment, validated into ``RolePlan``s before anything starts.

A role has the keys a job has (``num_nodes``, ``devices``, ``machine``, ``image``, ``command``, ``command_mode``,
``env``), each defaulting to the job's own (a role's machine is a catalogue entry composed into it, as the job's
is: ``- /machine@scorer.machine: cpu`` in a roles config; ``image: null`` runs the role in this environment whatever
the job's image), plus ``primary`` (the job ends when this role's processes have all ended; the others are stopped
then) and ``early_exit`` (what a non-primary role's clean exit before the primary's end means: ``ok``, or ``fail``,
the default: a server role that goes away early is a failure). A role without a command runs the app's task
function, which tells its role by ``MMT_ROLE``.

The job's processes are the roles' in order, the primary role first (so process 0, whose result is the job's, is
the primary's rank 0); each role's nodes and processes are contiguous. Pure: nothing here starts anything.
"""

import re
from dataclasses import dataclass
from typing import Any, Dict, List, Mapping, Optional, Tuple

from mmt.core.errors import ConfigError
from mmt.planning import validate as check
from mmt.planning.machine import Machine

# a role's name is part of variable names (MMT_ROLE_<NAME>_ADDRS) and of file names (logs/<role>/)
_ROLE_NAME = re.compile(r"^[a-z][a-z0-9_]{0,30}$")
ROLE_KEYS = ("num_nodes", "devices", "machine", "image", "command", "command_mode", "env", "primary", "early_exit")
EARLY_EXIT = ("fail", "ok")
# the role that is primary when none says so
DEFAULT_PRIMARY = "trainer"


@dataclass(frozen=True)
class RolePlan:
    """One role of a job: its own topology and command, and where its nodes and processes sit in the job."""

    name: str
    num_nodes: int
    devices: int
    # its nodes' machine: the job's, or one of its own
    machine: Machine
    # its nodes' container image: the job's, or one of its own; None: this environment
    image: Optional[str]
    command: Optional[str]
    command_mode: str
    # the role's own variables, on top of the job's env (values never printed)
    env: Mapping[str, str]
    primary: bool
    # a clean exit of this (non-primary) role before the primary role ended: "ok", or "fail" (the job fails)
    early_exit: str
    # the job's node index of this role's node 0, and the job's process index of its process 0
    first_node: int
    first_index: int

    @property
    def per_node(self) -> bool:
        return self.command is not None and self.command_mode == "per_node"

    @property
    def processes_per_node(self) -> int:
        return 1 if self.per_node else self.devices

    @property
    def process_count(self) -> int:
        return self.num_nodes * self.processes_per_node

    @property
    def world_size(self) -> int:
        return self.num_nodes * self.devices

    @property
    def indices(self) -> range:
        """The job's process indices of this role's processes."""
        return range(self.first_index, self.first_index + self.process_count)

    @property
    def nodes(self) -> range:
        """The job's node indices of this role's nodes."""
        return range(self.first_node, self.first_node + self.num_nodes)


@dataclass(frozen=True)
class JobDefaults:
    """The job's own values, which a role's absent keys take."""

    num_nodes: int
    devices: int
    machine: Machine
    command: Optional[str]
    command_mode: str
    image: Optional[str] = None


def plan_roles(
    raw: Any,
    defaults: JobDefaults,
    *,
    devices_of: Any,
    command_of: Any,
    env_of: Any,
    machine_of: Any,
    image_of: Any,
) -> Tuple[RolePlan, ...]:
    """The job's roles from ``roles`` (a mapping of role name to its keys), primary first; () without roles.

    ``devices_of(key, value, machine)``, ``command_of(key, value)``, ``env_of(key, value)``, ``machine_of(key,
    value)`` and ``image_of(key, value)`` validate those keys as the job's own are validated (the machine's GPU
    count, a non-blank command, reserved variable names, a catalogue entry, an image name on one line).
    """
    roles = check.plain(raw)
    if roles is None or roles == {}:
        return ()
    if not isinstance(roles, dict):
        raise ConfigError(
            "roles", roles, "expected a mapping of role name to its keys", "e.g. +roles.scorer.num_nodes=1"
        )
    checks = (devices_of, command_of, env_of, machine_of, image_of)
    parsed = [_role(str(name), keys, defaults, *checks) for name, keys in roles.items()]
    primary = _primary(parsed)
    ordered = [primary] + [role for role in parsed if role["name"] != primary["name"]]
    plans: List[RolePlan] = []
    node = index = 0
    for role in ordered:
        plan = RolePlan(first_node=node, first_index=index, **{**role, "primary": role["name"] == primary["name"]})
        plans.append(plan)
        node, index = node + plan.num_nodes, index + plan.process_count
    return tuple(plans)


def _role(
    name: str,
    keys: Any,
    defaults: JobDefaults,
    devices_of: Any,
    command_of: Any,
    env_of: Any,
    machine_of: Any,
    image_of: Any,
) -> Dict[str, Any]:
    if not _ROLE_NAME.match(name):
        raise ConfigError(
            f"roles.{name}",
            name,
            "a role's name is lower-case letters, digits and '_', starting with a letter (at most 31)",
            "e.g. roles.scorer",
        )
    if keys is None:
        keys = {}
    if not isinstance(keys, dict):
        raise ConfigError(f"roles.{name}", keys, "expected the role's keys", f"e.g. roles.{name}.num_nodes=1")
    unknown = [key for key in keys if key not in ROLE_KEYS]
    if unknown:
        raise ConfigError(
            f"roles.{name}.{unknown[0]}",
            keys[unknown[0]],
            f"not a key of a role; a role has {', '.join(ROLE_KEYS)}",
            "set the job-wide keys (hydra.launcher.*, timeout_min, recipe) on the job itself",
        )
    prefix = f"roles.{name}"
    given = keys.get("num_nodes", defaults.num_nodes)
    if isinstance(given, str) and ":" in given:  # num_nodes=MIN:MAX, an elastic job's range
        raise ConfigError(
            f"{prefix}.num_nodes",
            given,
            "a role's node count is fixed: a job with roles is not elastic (num_nodes=MIN:MAX is for a job whose "
            "nodes are all alike)",
            f"give the role a whole number, e.g. {prefix}.num_nodes=2",
        )
    num_nodes = check.whole_number(f"{prefix}.num_nodes", given, 1, f"nodes of the role, e.g. {prefix}.num_nodes=1")
    machine = defaults.machine if keys.get("machine") is None else machine_of(f"{prefix}.machine", keys["machine"])
    if keys.get("devices") is not None:
        devices = devices_of(f"{prefix}.devices", keys["devices"], machine)
    else:  # its own machine's GPU count, as a job's devices=null is
        devices = defaults.devices if machine is defaults.machine else machine.default_devices
    command = command_of(f"{prefix}.command", keys["command"]) if "command" in keys else defaults.command
    primary = keys.get("primary", None)
    if primary is not None and not isinstance(primary, bool):
        raise ConfigError(f"{prefix}.primary", primary, "expected true or false", f"e.g. {prefix}.primary=true")
    return {
        "name": name,
        "num_nodes": num_nodes,
        "devices": devices,
        "machine": machine,
        "image": image_of(f"{prefix}.image", keys["image"]) if "image" in keys else defaults.image,
        "command": command,
        "command_mode": check.choice(
            f"{prefix}.command_mode", keys.get("command_mode", defaults.command_mode), check.COMMAND_MODES
        ),
        "env": env_of(f"{prefix}.env", keys.get("env")),
        "primary": primary,
        "early_exit": check.choice(f"{prefix}.early_exit", keys.get("early_exit", EARLY_EXIT[0]), EARLY_EXIT),
    }


def _primary(roles: List[Dict[str, Any]]) -> Dict[str, Any]:
    """The one primary role: the one that says so, else the one named ``trainer``."""
    marked = [role for role in roles if role["primary"]]
    if len(marked) > 1:
        raise ConfigError(
            f"roles.{marked[1]['name']}.primary",
            True,
            f"role {marked[0]['name']!r} is primary already; a job has one primary role (it ends the job)",
            f"set primary=true on one role only, e.g. roles.{marked[1]['name']}.primary=false",
        )
    if marked:
        return marked[0]
    named = [role for role in roles if role["name"] == DEFAULT_PRIMARY]
    if named:
        return named[0]
    if len(roles) == 1:
        return roles[0]
    names = ", ".join(role["name"] for role in roles)
    raise ConfigError(
        "roles",
        names,
        f"no role is primary (the one whose end ends the job) and none is named {DEFAULT_PRIMARY!r}",
        f"mark one, e.g. roles.{roles[0]['name']}.primary=true",
    )


def env_name(role: str) -> str:
    """The part of a variable's name that names the role: ``MMT_ROLE_<NAME>_ADDRS``."""
    return role.upper()
