"""The environment of one process of a job: the one function every backend and the dry run build it with.

Layers, later ones winning: the inherited environment without other launchers' variables; the launcher's own
Python environment first on PATH (so ``python``, ``torchrun`` and the venv's scripts in a command are the
launcher's, on every node); the user's ``env`` and the variables copied from the launcher (``env_from``); OpenMP's
thread count (and TensorFlow's, for a TensorFlow job); the rank contract with the launcher's extras (batch plan,
topology hints) and the job's framework variables (``TF_CONFIG``, JAX's coordinator); and what a backend must keep
(SLURM's own variables in per-rank task mode).
"""

import os
import sys
from dataclasses import dataclass
from typing import Any, Dict, Mapping, Optional, Tuple, Union

from mmt.core.rank_env import (
    MMT_ROLE,
    MMT_ROLES,
    MMT_ROLES_FILE,
    OMP_NUM_THREADS,
    RankPlace,
    contract_env,
    framework_threads,
    role_addrs_var,
    role_port_var,
    scrubbed,
    threads_per_rank,
)
from mmt.planning.plan import JobPlan
from mmt.planning.roles import RolePlan

# Warnings that are wrong in a process mmt started (see mmt.worker.guards): Lightning's advice to use srun (mmt
# started the ranks, or ran them through srun), and its CSV logger's "not empty" about the job dir (mmt made it).
SRUN_WARNING = "The `srun` command is available on your system but is not used"
NOT_EMPTY_WARNING = "Experiment logs directory {job_dir} exists and is not empty"


def python_warnings(job_dir: str, inherited: Optional[str]) -> str:
    """PYTHONWARNINGS for a command's own interpreters: the same two filters, after the user's own."""
    ours = [f"ignore:{SRUN_WARNING}"]
    if ":" not in job_dir and "," not in job_dir:  # the option's own separators
        ours.append(f"ignore:{NOT_EMPTY_WARNING.format(job_dir=job_dir.rstrip('/'))}")
    return ",".join([w for w in (inherited or "").split(",") if w] + ours)


@dataclass(frozen=True)
class Rendezvous:
    """Where node 0 listens, where every node is, and the ports held for the job's framework.

    ``master_port`` is None in a dry run (chosen at start). ``node_addrs``: every node's address in node order
    (empty: ``master_addr`` for every node, as when all nodes share one host). ``framework_ports``: the ports held
    for the plan's framework (``mmt.core.rank_env.framework_port_count``: one per TensorFlow worker, in process
    order; JAX's coordinator).
    """

    master_addr: str
    master_port: Optional[Union[int, str]]
    node_addrs: Tuple[str, ...] = ()
    framework_ports: Tuple[Union[int, str], ...] = ()


@dataclass(frozen=True)
class PythonEnvironment:
    """The interpreter that runs the launcher, to put first on every process's PATH."""

    executable: str
    prefix: str
    in_venv: bool

    @classmethod
    def current(cls) -> "PythonEnvironment":
        # not resolved: .venv/bin/python is a link to the base interpreter, and the venv is the point
        return cls(executable=os.path.abspath(sys.executable), prefix=sys.prefix, in_venv=sys.prefix != sys.base_prefix)

    def apply(self, env: Dict[str, str]) -> None:
        bin_dir = os.path.dirname(self.executable)
        parts = [p for p in env.get("PATH", os.defpath).split(os.pathsep) if p and p != bin_dir]
        env["PATH"] = os.pathsep.join([bin_dir, *parts])
        if self.in_venv:
            env["VIRTUAL_ENV"] = self.prefix
        else:
            env.pop("VIRTUAL_ENV", None)


def process_env(
    plan: JobPlan,
    place: RankPlace,
    *,
    rendezvous: Rendezvous,
    inherited: Mapping[str, str],
    copied: Mapping[str, str],
    cores_per_node: int,
    python: Optional[PythonEnvironment],
    keep: Optional[Mapping[str, str]] = None,
    restart: int = 0,
) -> Dict[str, str]:
    """The full environment of process ``place`` of ``plan``.

    ``inherited``: the environment the process starts from (the launcher's, or the SLURM task's); ``copied``: the
    values of ``plan.env_from``, read from the launcher's environment; ``python``: None leaves PATH as inherited (a
    container brings its own interpreter); ``keep``: variables to keep over the inherited ones, never over the
    contract; ``restart``: the job's restart count (MMT_RESTART_COUNT).
    """
    env = scrubbed(inherited)
    if python is not None:
        python.apply(env)
    env.update(plan.env)
    env.update(copied)
    if OMP_NUM_THREADS not in env:
        env[OMP_NUM_THREADS] = threads_per_rank(cores_per_node, plan.devices)
    env.update(framework_threads(plan.framework, env[OMP_NUM_THREADS], env))
    contract = contract_env(
        place,
        per_node=plan.per_node,
        master_addr=rendezvous.master_addr,
        master_port=rendezvous.master_port,
        job_dir=plan.job_dir,
        job_id=plan.job_id,
        extra=plan.extra_env(),
        node_addrs=rendezvous.node_addrs,
        framework=plan.framework,
        framework_ports=rendezvous.framework_ports,
        restart=restart,
        max_restarts=plan.max_restarts,
    )
    env.update({k: v for k, v in (keep or {}).items() if k not in contract})
    env.update(contract)
    if plan.command is not None:  # a command's interpreters are not the worker's: they get the filters this way
        env["PYTHONWARNINGS"] = python_warnings(plan.job_dir, env.get("PYTHONWARNINGS"))
    return env


@dataclass(frozen=True)
class RoleSite:
    """Where one role of a job with roles is: its own rendezvous (its ranks' MASTER_ADDR/PORT, its nodes' addresses)
    and the port held for it to serve on (``MMT_ROLE_<NAME>_PORT``; None in a dry run)."""

    rendezvous: Rendezvous
    port: Optional[Union[int, str]]

    def addrs(self, role: RolePlan) -> Tuple[str, ...]:
        return self.rendezvous.node_addrs or (self.rendezvous.master_addr,) * role.num_nodes


def role_env(plan: JobPlan, role: RolePlan, sites: Mapping[str, RoleSite], roles_file: str) -> Dict[str, str]:
    """What every process of ``role`` gets besides its role's rank contract: its role, and where every role is."""
    env = {MMT_ROLE: role.name, MMT_ROLES: ",".join(r.name for r in plan.roles), MMT_ROLES_FILE: roles_file}
    for other in plan.roles:
        site = sites[other.name]
        env[role_addrs_var(other.name)] = ",".join(site.addrs(other))
        env[role_port_var(other.name)] = str(site.port)
    return env


def roles_document(plan: JobPlan, sites: Mapping[str, RoleSite]) -> Dict[str, Any]:
    """The roles file (``MMT_ROLES_FILE``): every role's shape and where it is, written before any rank starts."""
    return {
        "job_id": plan.job_id,
        "primary": plan.roles[0].name,
        "roles": {
            role.name: {
                "primary": role.primary,
                "num_nodes": role.num_nodes,
                "devices": role.devices,
                "world_size": role.world_size,
                # a command run once per node: its logs are the nodes' (logs/<role>/node<n>.log)
                "per_node": role.per_node,
                "addrs": list(sites[role.name].addrs(role)),
                "port": sites[role.name].port,
                "master_addr": sites[role.name].rendezvous.master_addr,
                "master_port": sites[role.name].rendezvous.master_port,
            }
            for role in plan.roles
        },
    }


def role_process_env(
    plan: JobPlan, index: int, *, sites: Mapping[str, RoleSite], roles_file: str, **kwargs: Any
) -> Dict[str, str]:
    """The full environment of process ``index`` of a job with roles: its role's own rank contract (the role as a
    job of its own: ``JobPlan.for_role``), and the roles' variables. ``kwargs``: as :func:`process_env`'s."""
    role = plan.role_at(index)
    assert role is not None, f"process {index} of a job without roles"
    own = plan.for_role(role)
    env = process_env(own, plan.place(index), rendezvous=sites[role.name].rendezvous, **kwargs)
    env.update(role_env(plan, role, sites, roles_file))
    return env
