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
from typing import Dict, Mapping, Optional, Tuple, Union

from mmt.core.rank_env import OMP_NUM_THREADS, RankPlace, contract_env, framework_threads, scrubbed, threads_per_rank
from mmt.planning.plan import JobPlan

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
