"""Render a job plan as text: what ``hydra.launcher.dry_run=true`` prints instead of starting anything."""

from typing import List

from mmt.rank_env import contract_env, node_contract_env

from ._plan import JobPlan

PORT_PLACEHOLDER = "<set at start: a free port here, derived from the job id on SLURM>"


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
    return " ".join(parts[:1]) + (": " + ", ".join(parts[1:]) if parts[1:] else "")


def _cost_lines(plan: JobPlan) -> List[str]:
    hours = plan.timeout_s / 3600.0
    price = plan.machine.price_per_hour
    if price is None:
        return [f"  cost       unknown: no price for machine {plan.machine.name!r}"]
    return [
        f"  cost       ${price:.2f}/h per node x {plan.num_nodes} nodes x {hours:g} h time limit "
        f"= ${plan.cost_estimate():,.2f} (upper bound, on-demand list price estimate)",
        f"  price      {plan.machine.price_source or 'source not recorded'}",
    ]


def _env_lines(plan: JobPlan) -> List[str]:
    """The contract every process gets: shared values once, then each process's own values."""
    per_node = plan.per_node
    ident = dict(master_addr="$MASTER_ADDR", master_port=0, job_dir=plan.job_dir, job_id=plan.job_id,
                 extra=plan.extra_env())
    envs = []
    for place in plan.places():
        if per_node:
            env = node_contract_env(place.node_rank, num_nodes=plan.num_nodes, local_world_size=plan.devices, **ident)
        else:
            env = contract_env(place, **ident)
        envs.append(env)
    shared = {k: v for k, v in envs[0].items() if all(e.get(k) == v for e in envs)}
    shared.pop("MASTER_ADDR", None)
    shared["MASTER_PORT"] = PORT_PLACEHOLDER
    lines = ["  env (all)  " + " ".join(f"{k}={v}" for k, v in sorted(shared.items()))]
    if plan.env:
        lines.append("  env (user) " + " ".join(f"{k}={v}" for k, v in sorted(plan.env.items())))
    who = "node" if per_node else "rank"
    for index, env in enumerate(envs):
        own = " ".join(f"{k}={v}" for k, v in sorted(env.items()) if k not in shared and k != "MASTER_ADDR")
        lines.append(f"  {who} {index:<5}{own}")
    return lines


def _no_batch(plan: JobPlan) -> str:
    if plan.command is not None:
        return "(none: a command chooses its own batch size)"
    return "(none: the recipe states no batch.global_size)"


def render(plan: JobPlan, backend_lines: List[str]) -> str:
    per_node = plan.per_node
    if plan.command is None:
        runs = "the task function on every rank"
    else:
        runs = f"{plan.command!r} " + ("once per node (it starts the node's ranks)" if per_node else "once per rank")
    lines = [
        f"{plan.name}: {' '.join(plan.overrides) or '(no overrides)'}",
        f"  topology   {plan.num_nodes} nodes x {plan.devices} devices = {plan.world_size} ranks",
        f"  machine    {_machine_line(plan)}",
        f"  image      {plan.image or '(none: this environment)'}",
        f"  runs       {runs}",
        f"  batch      {plan.batch.describe() if plan.batch else _no_batch(plan)}",
        f"  time limit {plan.timeout_s / 60:g} min",
        f"  job dir    {plan.job_dir}",
        *backend_lines,
        *_cost_lines(plan),
        *_env_lines(plan),
    ]
    return "\n".join(lines)
