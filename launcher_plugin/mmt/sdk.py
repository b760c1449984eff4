"""The Python SDK, shaped like Lightning's (``lightning_sdk.Job`` / ``MMT``): submit a command job, walk away, and
from any process later follow, wait for and stop it.

    from mmt import Job, MMT, Machine
    job = MMT.run(command="echo Hello, Lightning!", name="echo-example", machine=Machine.CPU, num_machines=2)
    job.wait(timeout=600); print(job.status, job.logs())
    Job.get("echo-example").machines[1].logs

Jobs run detached: on the local backend in a supervisor process that outlives this one, on SLURM as SLURM jobs that
conclude themselves. Lightning-only parameters (studio, teamspace, cloud ...) are refused with mmt's equivalent.
"""

import enum
from typing import Any, Dict, List, Optional, Union

from mmt.core.errors import ConfigError
from mmt.planning.machine import canonical_name, catalogue_names
from mmt.service.handle import RegisteredJob, Status  # noqa: F401  (Status: `from mmt import Status`, Lightning's states)
from mmt.records.registry import Registry
from mmt.service.submit import RunSpec, run

#: Lightning's machine types in mmt's catalogue: ``Machine.T4``, ``Machine.A100_X_8`` ... (values: catalogue names)
Machine = enum.Enum("Machine", {name.upper(): name for name in catalogue_names()}, type=str)  # type: ignore[misc]


# Lightning's parameters that have no meaning here, and what to use instead
LIGHTNING_ONLY = {
    "studio": "mmt runs in this environment: the launcher's Python, its venv and this directory",
    "teamspace": "there are no teamspaces: jobs are this user's, in the registry ($MMT_HOME)",
    "org": "there are no organisations: jobs are this user's",
    "user": "there are no organisations: jobs are this user's",
    "cloud": "pick the cluster with cluster='local' | 'slurm' | <your site config>",
    "interruptible": "preemption is SLURM's: mmt requeues on its signal (hydra.launcher.max_requeues)",
    "image_credentials": "the cluster's container runtime pulls images with its own credentials",
    "cloud_account_auth": "the cluster's container runtime pulls images with its own credentials",
    "entrypoint": "the command runs with /bin/sh -c; put a different entrypoint in the command",
    "path_mappings": "bind mounts: hydra.launcher.container_mounts=[SRC:DST] (SLURM)",
    "max_run_attempts": "requeues on SLURM: hydra.launcher.max_requeues",
    "reuse_snapshot": "there are no snapshots: every node runs this directory as it is",
    "placement_group_id": "node placement is SLURM's: hydra.launcher.constraint / sbatch_extra",
    "tags": "name jobs instead (name=...); `mmt list` shows every job",
    "keep_minutes": "nothing is kept running after a job ends",
    "scratch_disks": "use the cluster's own scratch space",
}


def _refuse_lightning_only(options: Dict[str, Any]) -> None:
    for key, value in options.items():
        if key in LIGHTNING_ONLY:
            raise ConfigError(key, value, "a Lightning AI parameter that mmt does not have", LIGHTNING_ONLY[key])
        raise TypeError(f"unexpected argument {key!r}")


class Job(RegisteredJob):
    """Lightning's ``Job``: submit a command job, or find one again by name."""

    # ------------------------------------------------------------------------------------------ submitting

    @classmethod
    def run(cls, command: str, name: Optional[str] = None, num_machines: int = 1,
            machine: Union[str, "enum.Enum"] = "cpu", image: Optional[str] = None,
            env: Optional[Dict[str, str]] = None, cluster: str = "local", devices: Optional[int] = None,
            command_mode: str = "per_node", max_runtime: Optional[float] = None,
            env_from: Optional[List[str]] = None, overrides: Optional[List[str]] = None, **lightning: Any) -> "Job":
        """Submit ``command`` on ``num_machines`` nodes of ``machine`` and return at once.

        ``max_runtime``: seconds (Lightning's name) before the job is stopped; ``devices``: processes per node;
        ``env_from``: names of variables copied from this process's environment (secrets never pass through
        arguments or files); ``overrides``: more Hydra overrides, e.g. site settings.
        """
        _refuse_lightning_only(lightning)
        spec = RunSpec(command=command, name=name, num_machines=num_machines,
                       machine=canonical_name(machine.value if isinstance(machine, enum.Enum) else str(machine)),
                       image=image, env={k: str(v) for k, v in (env or {}).items()}, env_from=list(env_from or []),
                       cluster=cluster, devices=devices, command_mode=command_mode,
                       timeout_min=max_runtime / 60.0 if max_runtime is not None else None,
                       overrides=list(overrides or []), detach=True)
        [submitted] = run(spec)
        return cls(submitted.plan.name)

    @classmethod
    def get(cls, name: str) -> "Job":
        """Re-attach to a job started by any process (by its name)."""
        registry = Registry()
        registry.require(name)
        return cls(name, registry)



class MMT(Job):
    """Multi-machine training (Lightning's ``MMT``): a Job of at least two machines."""

    @classmethod
    def run(cls, command: str, name: Optional[str] = None, num_machines: int = 2, **options: Any) -> "Job":
        if num_machines < 2:
            raise ConfigError("num_machines", num_machines, "Multi-Machine training cannot be run with less than "
                              "2 Machines", "use Job.run for one machine")
        return Job.run(command=command, name=name, num_machines=num_machines, **options)

