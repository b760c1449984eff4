"""The roles file of a job with roles (``<job dir>/roles.json``, ``MMT_ROLES_FILE``), as the views read it: each
role's shape, the primary first. Written by the backend before any rank starts (``mmt.planning.environment``)."""

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Optional, Tuple

from mmt.core.jobdir import JobDir


@dataclass(frozen=True)
class RoleShape:
    name: str
    primary: bool
    num_nodes: int
    devices: int
    per_node: bool

    @property
    def log_count(self) -> int:
        """How many logs (and processes) the role has: one per node for a per-node command, else one per rank."""
        return self.num_nodes if self.per_node else self.num_nodes * self.devices


def node_indices(roles: Tuple[RoleShape, ...], node: int) -> range:
    """The job's process indices on its node ``node`` (the roles' nodes and processes in order, the primary's first)."""
    first_node = first_index = 0
    for role in roles:
        if node < first_node + role.num_nodes:
            per_node = 1 if role.per_node else role.devices
            start = first_index + (node - first_node) * per_node
            return range(start, start + per_node)
        first_node, first_index = first_node + role.num_nodes, first_index + role.log_count
    return range(0)


def read_roles(job_dir: Path) -> Optional[Tuple[RoleShape, ...]]:
    """The job's roles, primary first; None for a job without roles (no roles file, or one that cannot be read)."""
    try:
        with open(JobDir(job_dir).roles_file, encoding="utf-8") as handle:
            document = json.load(handle)
        shapes = tuple(
            RoleShape(
                name=str(name),
                primary=bool(role.get("primary")),
                num_nodes=int(role["num_nodes"]),
                devices=int(role["devices"]),
                per_node=bool(role.get("per_node", False)),
            )
            for name, role in document["roles"].items()
        )
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None
    return tuple(sorted(shapes, key=lambda shape: not shape.primary)) or None


def role_node(roles: Tuple[RoleShape, ...], node: int) -> Optional[Tuple[RoleShape, int]]:
    """The role of the job's node ``node`` and that node's number in its role; None past the last."""
    first = 0
    for role in roles:
        if node < first + role.num_nodes:
            return role, node - first
        first += role.num_nodes
    return None


def job_node(roles: Tuple[RoleShape, ...], role: str, node: int) -> Optional[int]:
    """The job's node of node ``node`` of ``role`` (a failure names its node in its role's numbering)."""
    first = 0
    for shape in roles:
        if shape.name == role:
            return first + node
        first += shape.num_nodes
    return None


def topology(roles: Tuple[RoleShape, ...]) -> str:
    """``trainer 2 x 2 + scorer 1 x 1``."""
    return " + ".join(f"{role.name} {role.num_nodes} x {role.devices}" for role in roles)
