"""Render a job plan as text: what ``hydra.launcher.dry_run=true`` prints instead of starting anything."""

import json
from pathlib import Path
from typing import Dict, List, Optional

from mmt.core.jobdir import JobDir
from mmt.planning.environment import Rendezvous, RoleSite, process_env, role_env
from mmt.planning.plan import JobPlan
from mmt.planning.redact import MASK, masked_overrides

PORT_PLACEHOLDER = "<set at start: a port held for the job (how: the backend line below)>"
# a dry run lists every process of a small job; of a large one, the first and the last few
SHOWN_HEAD, SHOWN_TAIL = 16, 2


def _machine_line(plan: JobPlan) -> str:
    m = plan.machine
    parts = [m.name]
    if m.gpus:
        parts.append(f"{m.gpus}x {m.gpu_type or 'GPU'}" + (f" {m.gpu_memory_gb:g} GiB" if m.gpu_memory_gb else ""))
    if m.cpus:
        parts.append(f"{m.cpus} vCPU")
    if m.memory_gb:
        parts.append(f"{m.memory_gb:g} GiB RAM")
    if m.instance_type:
        parts.append(f"({m.instance_type})")
    line = " ".join(parts[:1]) + (": " + ", ".join(parts[1:]) if parts[1:] else "")
    return line + (" [legacy: Lightning no longer offers it]" if m.legacy else "")


def _cost_lines(plan: JobPlan) -> List[str]:
    if plan.roles:
        return _roles_cost_lines(plan)
    hours = plan.timeout_s / 3600.0
    price = plan.machine.price_per_hour
    if price is None:
        return [f"  cost       unknown: no price for machine {plan.machine.name!r}"]
    return [
        f"  cost       ${price:.2f}/h per node x {plan.num_nodes:,} nodes x {hours:g} h time limit "
        f"= ${plan.cost_estimate():,.2f} (upper bound, on-demand list price estimate)",
        f"  price      {plan.machine.price_source or 'source not recorded'}",
    ]


def _roles_cost_lines(plan: JobPlan) -> List[str]:
    """Each role's nodes at its machine's price; unknown when one role's machine has none."""
    unpriced = [role.machine.name for role in plan.roles if role.machine.price_per_hour is None]
    if unpriced:
        return [f"  cost       unknown: no price for machine {unpriced[0]!r}"]
    terms = " + ".join(f"{role.name} {role.num_nodes:,} x ${role.machine.price_per_hour:.2f}/h" for role in plan.roles)
    sources = {role.machine.name: role.machine.price_source for role in plan.roles}
    return [
        f"  cost       ({terms}) x {plan.timeout_s / 3600.0:g} h time limit = ${plan.cost_estimate():,.2f} "
        "(upper bound, on-demand list price estimate)",
        *(f"  price      {name}: {source or 'source not recorded'}" for name, source in sources.items()),
    ]


def _shown_indices(count: int) -> List[int]:
    if count <= SHOWN_HEAD + SHOWN_TAIL:
        return list(range(count))
    return list(range(SHOWN_HEAD)) + list(range(count - SHOWN_TAIL, count))


def _short_list(items: List[str]) -> List[str]:
    if len(items) <= SHOWN_HEAD + SHOWN_TAIL:
        return items
    return [*items[:2], f"...{len(items) - 3:,} more...", items[-1]]


def _shortened(name: str, value: str) -> str:
    """Every node's address, every worker's: a job of thousands of nodes shows the first two and the last."""
    if name == "MMT_NODE_ADDRS":
        return ",".join(_short_list(value.split(",")))
    if name == "TF_CONFIG":
        config = json.loads(value)
        config["cluster"]["worker"] = _short_list(config["cluster"]["worker"])
        return json.dumps(config, separators=(",", ":"))
    return value


def _env_lines(plan: JobPlan, extra: Optional[Dict[str, str]] = None, node: str = "node") -> List[str]:
    """The contract every process gets: shared values once, then each process's own values (``extra``: what every
    process gets on top, a role's variables)."""
    # where the nodes are and which ports their frameworks get are known only at start: placeholders
    addrs = tuple(f"<{node}{n}>" for n in range(plan.num_nodes))
    rendezvous = Rendezvous(
        master_addr="$MASTER_ADDR",
        master_port=0,
        node_addrs=addrs,
        framework_ports=tuple(f"<port{i}>" for i in range(plan.framework_port_count)),
    )
    copied = {name: MASK for name in plan.env_from}
    shown = _shown_indices(plan.process_count)

    def env_of(index: int) -> Dict[str, str]:
        env = process_env(
            plan, plan.place(index), rendezvous=rendezvous, inherited={}, copied=copied, cores_per_node=0, python=None
        )
        env.update(extra or {})
        for name in ("OMP_NUM_THREADS", "TF_NUM_INTRAOP_THREADS", "TF_NUM_INTEROP_THREADS", *plan.secret_names):
            env.pop(name, None)
        return {name: _shortened(name, value) for name, value in env.items()}

    envs = {index: env_of(index) for index in shown}
    first = envs[shown[0]]
    shared = {k: v for k, v in first.items() if all(e.get(k) == v for e in envs.values())}
    shared.pop("MASTER_ADDR", None)
    shared["MASTER_PORT"] = PORT_PLACEHOLDER
    lines = ["  env (all)  " + " ".join(f"{k}={v}" for k, v in sorted(shared.items()))]
    if plan.framework_port_count:
        lines.append(
            f"  framework  {plan.framework}: <nodeN> is node N's address, <portI> the port held for "
            f"{'worker I' if plan.framework == 'tensorflow' else 'the coordinator'} "
            "(set at start: ports held for the job, as its backend holds them)"
        )
    if plan.secret_names:
        lines.append(
            "  env (user) " + " ".join(f"{k}={MASK}" for k in sorted(plan.secret_names)) + "   (values are never shown)"
        )
    who = "node" if plan.per_node else "rank"
    for position, index in enumerate(shown):
        if position and shown[position - 1] != index - 1:
            lines.append(f"  ...        {index - shown[position - 1] - 1:,} more {who}s")
        own = " ".join(f"{k}={v}" for k, v in sorted(envs[index].items()) if k not in shared and k != "MASTER_ADDR")
        lines.append(f"  {who} {index:<5}{own}")
    return lines


def _no_batch(plan: JobPlan) -> str:
    if plan.command is not None:
        return "(none: a command chooses its own batch size)"
    return "(none: the recipe states no batch.global_size)"


def _roles_lines(plan: JobPlan) -> List[str]:
    """A job with roles: each role's nodes, what it runs and its processes' environment."""
    sites = {
        role.name: RoleSite(
            Rendezvous("$MASTER_ADDR", 0, node_addrs=tuple(f"<{role.name}{n}>" for n in range(role.num_nodes))),
            f"<{role.name}-port>",
        )
        for role in plan.roles
    }
    roles_file = str(JobDir(Path(plan.job_dir)).roles_file)
    lines = [
        "  roles      each its own world (its own MASTER_ADDR/PORT, RANK, WORLD_SIZE); <roleN> is node N of the role, "
        "<role-port> the port held for it (set at start); the roles file says the same"
    ]
    for role in plan.roles:
        own = plan.for_role(role)
        lines += [
            f"  role {role.name}"
            + (" (primary: the job ends when it ends)" if role.primary else f" (early_exit={role.early_exit})")
            + f": {role.num_nodes:,} nodes x {role.devices:,} devices = {role.world_size:,} ranks on "
            f"{_machine_line(own)}, runs {_runs(own)}",
            f"    image {role.image or '(none: this environment)'}",
            *("  " + line for line in _env_lines(own, role_env(plan, role, sites, roles_file), role.name)),
        ]
    return lines


def _runs(plan: JobPlan) -> str:
    if plan.command is None:
        return "the task function on every rank"
    return f"{plan.command!r} " + ("once per node (it starts the node's ranks)" if plan.per_node else "once per rank")


def code_line(plan: JobPlan) -> str:
    """Which code the job runs: the launch's snapshot (where, how big, of which commit), or the live tree."""
    snapshot = plan.snapshot
    if snapshot is None:
        return "the live tree, as it is on disk when each process starts (no snapshot)"
    commit = f"commit {snapshot.commit[:12]}" if snapshot.commit else "no git"
    dirty = " + uncommitted changes" if snapshot.dirty else ""
    size = f"{snapshot.files:,} files, {snapshot.size_bytes / 1e6:.1f} MB"
    return f"snapshot {snapshot.id} of {snapshot.source} ({commit}{dirty}; {size}) in {snapshot.root}"


def render(plan: JobPlan, backend_lines: List[str]) -> str:
    if plan.roles:
        return _render_roles(plan, backend_lines)
    if plan.command is None:
        runs = "the task function on every rank"
    else:
        runs = f"{plan.command!r} " + (
            "once per node (it starts the node's ranks)" if plan.per_node else "once per rank"
        )
    lines = [
        f"{plan.label} ({plan.name}): "
        f"{' '.join(masked_overrides(plan.overrides, plan.secret_names)) or '(no overrides)'}",
        f"  topology   {plan.num_nodes:,} nodes x {plan.devices:,} devices = {plan.world_size:,} ranks"
        + _elastic_note(plan),
        f"  machine    {_machine_line(plan)}",
        f"  image      {plan.image or '(none: this environment)'}",
        f"  runs       {runs}",
        f"  batch      {plan.batch.describe() if plan.batch else _no_batch(plan)}",
        *_elastic_batches(plan),
        f"  time limit {plan.timeout_s / 60:g} min",
        f"  job dir    {plan.job_dir}",
        f"  code       {code_line(plan)}",
        *backend_lines,
        *_cost_lines(plan),
        *_env_lines(plan),
    ]
    return "\n".join(lines)


def _elastic_note(plan: JobPlan) -> str:
    if plan.elastic is None:
        return ""
    return (
        f" at the start; elastic (num_nodes={plan.elastic.label}): it runs on while {plan.elastic.min_nodes} or more "
        "are alive, its world formed again when one is lost"
    )


def _elastic_batches(plan: JobPlan) -> List[str]:
    """An elastic job's batch split in each smaller world it may have (the same global batch)."""
    if plan.elastic is None or plan.batch is None:
        return []
    return [
        f"             on {nodes} nodes: {batch.describe().split(';')[0]}"
        for nodes in range(plan.elastic.max_nodes - 1, plan.elastic.min_nodes - 1, -1)
        for batch in [plan.elastic.batch_for(nodes)]
        if batch is not None
    ]


def _render_roles(plan: JobPlan, backend_lines: List[str]) -> str:
    shapes = " + ".join(f"{role.name} {role.num_nodes:,} x {role.devices:,}" for role in plan.roles)
    lines = [
        f"{plan.label} ({plan.name}): "
        f"{' '.join(masked_overrides(plan.overrides, plan.secret_names)) or '(no overrides)'}",
        f"  topology   {shapes} = {plan.num_nodes:,} nodes, {plan.world_size:,} ranks",
        f"  batch      {plan.batch.describe() if plan.batch else _no_batch(plan)} (the primary role's)",
        f"  time limit {plan.timeout_s / 60:g} min",
        f"  job dir    {plan.job_dir}",
        f"  code       {code_line(plan)}",
        *backend_lines,
        *_cost_lines(plan),
        *_roles_lines(plan),
    ]
    return "\n".join(lines)
