"""Whether a job can ever be placed on a Ray cluster, and if not, the one line that says why (pure).

A job is one placement group of ``num_nodes`` bundles with strategy STRICT_SPREAD: every bundle on a Ray node of its
own. Ray keeps a group it cannot place pending for ever, so mmt checks first, against what each alive node has in
all (not what is free now: a busy cluster frees its nodes, a small one never grows): the launcher before it submits,
and the job's driver before each run (a node may have been lost since).
"""

from dataclasses import dataclass
from typing import Dict, List, Mapping, Optional, Sequence

from mmt.backends.ray.api import ClusterNode
from mmt.planning.plan import JobPlan

STRATEGY = "STRICT_SPREAD"
# the key a refusal names for a resource nobody has enough of (a custom one: resources_per_node.<name>)
RESOURCE_KEYS = {"CPU": "hydra.launcher.cpus_per_node", "GPU": "hydra.launcher.gpus_per_node"}


def describe(resources: Mapping[str, float], keys: Optional[Sequence[str]] = None) -> str:
    """``{CPU: 4, GPU: 1}``: the given keys (default: all) with whole numbers written whole."""
    shown = [(k, resources.get(k, 0.0)) for k in keys] if keys is not None else list(resources.items())
    return "{" + ", ".join(f"{k}: {v:g}" for k, v in shown) + "}"


def fits(bundle: Mapping[str, float], node: ClusterNode) -> bool:
    """Whether ``node`` has, in all, what one bundle asks."""
    return all(node.resources.get(name, 0.0) >= amount for name, amount in bundle.items() if amount > 0)


@dataclass(frozen=True)
class Refusal:
    """Why a job can never be placed: the key to name (num_nodes, or the resource nobody has enough of), its
    value, and the line that says what the job asks and what the cluster has."""

    key: str
    value: object
    line: str


def refusal(
    plan: JobPlan, bundle: Mapping[str, float], nodes: Sequence[ClusterNode], cluster: str
) -> Optional[Refusal]:
    """None when ``plan.num_nodes`` alive nodes can each hold ``bundle``; else why not. ``cluster``: how to name the
    cluster ("the cluster at http://head:8265")."""
    alive = [node for node in nodes if node.alive]
    holding = [node for node in alive if fits(bundle, node)]
    if len(holding) >= plan.num_nodes:
        return None
    names = list(bundle)
    asks = (
        f"{plan.label} asks {plan.num_nodes} Ray nodes with {describe(bundle)} each ({STRATEGY}: one node per mmt "
        f"node, {plan.num_nodes} x {plan.devices} ranks)"
    )
    has = f"{cluster} has {len(holding)} that can hold one" + (
        ": " + ", ".join(f"{node.ip} {describe(node.resources, names)}" for node in holding) if holding else ""
    )
    others = [node for node in alive if node not in holding]
    if others:
        has += "; too small: " + ", ".join(f"{node.ip} {describe(node.resources, names)}" for node in others)
    if holding:  # a node can hold one: there are too few of them
        return Refusal("num_nodes", plan.num_nodes, f"{asks}; {has}")
    short = _short_resource(bundle, alive, plan.num_nodes)
    key = RESOURCE_KEYS.get(short, f"hydra.launcher.resources_per_node.{short}")
    return Refusal(key, bundle[short], f"{asks}; {has}")


def _short_resource(bundle: Mapping[str, float], alive: Sequence[ClusterNode], needed: int) -> str:
    """The resource that fewest alive nodes have enough of (what to ask less of)."""
    counts: Dict[str, int] = {
        name: sum(1 for node in alive if node.resources.get(name, 0.0) >= amount)
        for name, amount in bundle.items()
        if amount > 0
    }
    short: List[str] = [name for name, count in counts.items() if count < needed] or list(counts)
    return min(short, key=lambda name: counts[name])


def roles_refusal(
    plan: JobPlan, bundles: Mapping[str, Mapping[str, float]], nodes: Sequence[ClusterNode], cluster: str
) -> Optional[Refusal]:
    """A job with roles: None when each role's nodes fit (``bundles``: each role's, by name) and the cluster has a
    node for every node of the job (STRICT_SPREAD over all of them); else why not, naming the role."""
    for role in plan.roles:
        found = refusal(plan.for_role(role), bundles[role.name], nodes, cluster)
        if found is not None:
            key = found.key if found.key != "num_nodes" else f"roles.{role.name}.num_nodes"
            return Refusal(key, found.value, f"role {role.name}: {found.line}")
    alive = [node for node in nodes if node.alive]
    if len(alive) < plan.num_nodes:
        return Refusal(
            "roles",
            ", ".join(role.name for role in plan.roles),
            f"{plan.label} asks {plan.num_nodes} Ray nodes in all ({STRATEGY}: a Ray node for each node of every "
            f"role); {cluster} has {len(alive)}",
        )
    return None
