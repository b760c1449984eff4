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
        """How many logs the role has: one per node for a per-node command, else one per rank."""
        return self.num_nodes if self.per_node else self.num_nodes * self.devices


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
