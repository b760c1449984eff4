"""The project's SLURM test cluster (scripts/slurm_cluster.sh) and its queue."""

import os
import subprocess
from typing import Dict, Optional

from helpers.paths import REPO

CLUSTER_SCRIPT = REPO / "scripts" / "slurm_cluster.sh"


def cluster_env() -> Dict[str, str]:
    """What ``slurm_cluster.sh env`` exports (SLURM_CONF), as a dict."""
    out = subprocess.run([str(CLUSTER_SCRIPT), "env"], capture_output=True, text=True, check=True).stdout
    name, value = out.strip().removeprefix("export ").split("=", 1)
    return {name: value}


def why_no_cluster() -> Optional[str]:
    """Why the test cluster cannot run on this host (not root, no unshare), or None."""
    if os.geteuid() != 0:
        return "the test cluster needs root (it starts slurmd in their own namespaces)"
    if subprocess.run(["unshare", "--mount", "--uts", "true"], capture_output=True).returncode != 0:
        return "unshare --mount --uts is not permitted here (the nodes need their own hostname)"
    return None


def queued() -> str:
    """Every job SLURM queues or runs, one ``id name state`` line each ("" when none)."""
    return subprocess.run(["squeue", "-h", "-o", "%i %j %T"], capture_output=True, text=True).stdout.strip()


def cluster_nodes() -> int:
    """The nodes of the default partition (sinfo marks it with *)."""
    out = subprocess.run(["sinfo", "-h", "-o", "%P %D"], capture_output=True, text=True, check=True).stdout
    return sum(int(count) for name, count in (line.split() for line in out.splitlines()) if name.endswith("*"))


def lose_node(name: str) -> None:
    """Lose ``name`` as a machine is lost: its slurmd and every process on it SIGKILLed (slurm_cluster.sh)."""
    subprocess.run([str(CLUSTER_SCRIPT), "fail-node", name], capture_output=True, text=True, check=True, timeout=60)


def revive_node(*names: str) -> None:
    """Start each node's slurmd again and wait until the nodes are idle."""
    subprocess.run(
        [str(CLUSTER_SCRIPT), "revive-node", *names], capture_output=True, text=True, check=True, timeout=120
    )
