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

from mmt.backends.registry import specs as backend_specs
from mmt.core.errors import ConfigError
from mmt.records.registry import Registry
from mmt.service.handle import RegisteredJob, Status  # noqa: F401  (Status: `from mmt import Status`, Lightning's states)
from mmt.service.machines import Machine  # noqa: F401  (`from mmt import Machine`: Lightning's machine types)
from mmt.service.submit import RunSpec, max_runtime_s, run

# the clusters a job may name, as Lightning's hints spell them: every backend the registry knows
_CLUSTERS = " | ".join(f"'{spec.name}'" for spec in backend_specs())

# Lightning's parameters that have no meaning here, and what to use instead
LIGHTNING_ONLY = {
    "studio": "mmt runs in this environment: the launcher's Python, its venv and this directory",
    "teamspace": "there are no teamspaces: jobs are this user's, in the registry ($MMT_HOME)",
    "org": "there are no organisations: jobs are this user's",
    "user": "there are no organisations: jobs are this user's",
    "cloud": f"pick the cluster with cluster={_CLUSTERS} | <your site config>",
    "cloud_account": f"mmt runs on this host or on SLURM: use cluster={_CLUSTERS} | <your site config>",
    "interruptible": "preemption is SLURM's: mmt requeues on its signal (hydra.launcher.max_requeues)",
    "image_credentials": "the cluster's container runtime pulls images with its own credentials",
    "cloud_account_auth": "the cluster's container runtime pulls images with its own credentials",
    "entrypoint": "the command runs with /bin/sh -c; put a different entrypoint in the command",
    "path_mappings": "bind mounts: hydra.launcher.container_mounts=[SRC:DST] (SLURM)",
    "reuse_snapshot": "there are no snapshots: every node runs this directory as it is",
    "placement_group_id": "node placement is SLURM's: hydra.launcher.constraint / sbatch_extra",
    "tags": "name jobs instead (name=...); `mmt list` shows every job",
    "keep_minutes": "nothing is kept running after a job ends",
    "scratch_disks": "use the cluster's own scratch space",
}

# Lightning's defaults for them: given explicitly, they ask for what mmt does anyway (a non-interruptible machine,
# the command under sh -c, one run attempt, no credentials), so they are accepted, as None and empty values are
LIGHTNING_DEFAULTS: Dict[str, Any] = {
    "interruptible": False,
    "cloud_account_auth": False,
    "reuse_snapshot": True,
    "entrypoint": "sh -c",
}

# what Job.run takes besides Lightning's parameters (for the message about an unknown one)
_OWN = (
    "name",
    "machine",
    "command",
    "image",
    "env",
    "num_machines",
    "cluster",
    "devices",
    "command_mode",
    "max_runtime",
    "max_run_attempts",
    "env_from",
    "overrides",
)


def _means_nothing(key: str, value: Any) -> bool:
    if value is None or (isinstance(value, (list, tuple, dict, set)) and not value):
        return True
    default = LIGHTNING_DEFAULTS.get(key, None)
    return default is not None and type(value) is type(default) and value == default


def _refuse_lightning_only(options: Dict[str, Any], where: str = "Job.run") -> None:
    for key, value in options.items():
        if key in LIGHTNING_ONLY:
            if _means_nothing(key, value):
                continue
            raise ConfigError(key, value, "a Lightning AI parameter that mmt does not have", LIGHTNING_ONLY[key])
        raise TypeError(
            f"{where}() got an unexpected keyword argument {key!r} (mmt's: {', '.join(_OWN)}; "
            f"Lightning's, each refused with mmt's equivalent unless given its default: "
            f"{', '.join(LIGHTNING_ONLY)})"
        )


class Job(RegisteredJob):
    """Lightning's ``Job``: submit a command job, or find one again by name."""

    # ------------------------------------------------------------------------------------------ submitting

    @classmethod
    def run(
        cls,
        name: Optional[str] = None,
        machine: Union[str, "enum.Enum"] = "cpu",
        cloud: Optional[str] = None,
        command: Optional[str] = None,
        studio: Any = None,
        image: Optional[str] = None,
        teamspace: Any = None,
        org: Any = None,
        user: Any = None,
        env: Optional[Dict[str, str]] = None,
        interruptible: bool = False,
        *,
        num_machines: int = 1,
        cluster: str = "local",
        devices: Optional[int] = None,
        command_mode: str = "per_node",
        max_runtime: Union[None, int, float, str] = None,
        max_run_attempts: int = 1,
        env_from: Optional[List[str]] = None,
        overrides: Optional[List[str]] = None,
        after: Optional[List[Union["Job", str]]] = None,
        **lightning: Any,
    ) -> "Job":
        """Submit ``command`` on ``num_machines`` nodes of ``machine`` and return at once.

        The positional parameters are Lightning's, in Lightning's order (``Job.run(name, machine, cloud, command,
        ...)``). ``max_runtime``: seconds (Lightning's), or a duration such as "90m", "1h30m", "3600s", before the job
        is stopped; ``devices``: processes per node; ``env_from``: names of variables copied from this process's
        environment (secrets never pass through arguments or files); ``overrides``: more Hydra overrides, e.g. site
        settings. ``max_run_attempts``: Lightning's meaning, attempts = restarts after a failure + 1. ``after``: jobs
        (or their names) this one starts after, once every one has completed; it is cancelled when one does not.
        Lightning's parameters that mean nothing here are accepted with their defaults (None,
        ``interruptible=False`` ...) and refused otherwise, each with mmt's equivalent.
        """
        _refuse_lightning_only(
            {
                "cloud": cloud,
                "studio": studio,
                "teamspace": teamspace,
                "org": org,
                "user": user,
                "interruptible": interruptible,
                **lightning,
            },
            f"{cls.__name__}.run",
        )
        seconds = max_runtime_s("max_runtime", max_runtime) if max_runtime is not None else None
        if isinstance(max_run_attempts, bool) or not isinstance(max_run_attempts, int) or max_run_attempts < 1:
            raise ConfigError(
                "max_run_attempts",
                max_run_attempts,
                "expected a whole number >= 1",
                "attempts = restarts after a failure + 1, e.g. max_run_attempts=3",
            )
        spec = RunSpec(
            command=command if command is not None else "",  # refused in one line when empty
            name=name,
            num_machines=num_machines,
            machine=str(machine.value if isinstance(machine, enum.Enum) else machine),
            image=image,
            env={k: str(v) for k, v in (env or {}).items()},
            env_from=list(env_from or []),
            cluster=cluster,
            devices=devices,
            command_mode=command_mode,
            timeout_min=seconds / 60.0 if seconds is not None else None,
            max_restarts=max_run_attempts - 1 if max_run_attempts > 1 else None,
            overrides=list(overrides or []),
            after=[job.name if isinstance(job, Job) else str(job) for job in after or []],
            detach=True,
        )
        submitted = run(spec)
        assert isinstance(submitted, list) and len(submitted) == 1  # detached: the one job submitted
        return cls(submitted[0].plan.name)

    @classmethod
    def get(cls, name: str) -> "Job":
        """Re-attach to a job started by any process (by its name); a job launched from here onto a cluster reached
        over SSH: a handle that asks the cluster (mmt.service.remote_handle, docs/remote.md)."""
        registry = Registry()
        if registry.get(name) is None:
            from mmt.service.remote_handle import find

            remote = find(name)
            if remote is not None:
                return remote  # type: ignore[return-value]  # shaped like Job for what a remote job can answer
        registry.require(name)
        return cls(name, registry)


class MMT(Job):
    """Multi-machine training (Lightning's ``MMT``): a Job of at least two machines."""

    @classmethod
    def run(  # type: ignore[override]  # Lightning's MMT.run defaults to 2 machines
        cls,
        name: Optional[str] = None,
        num_machines: int = 2,
        machine: Union[str, "enum.Enum"] = "cpu",
        cloud: Optional[str] = None,
        command: Optional[str] = None,
        studio: Any = None,
        image: Optional[str] = None,
        teamspace: Any = None,
        org: Any = None,
        user: Any = None,
        env: Optional[Dict[str, str]] = None,
        interruptible: bool = False,
        **options: Any,
    ) -> "Job":
        """Lightning's ``MMT.run``, its parameters in its order (``MMT.run(name, num_machines, machine, cloud,
        command, ...)``)."""
        if isinstance(num_machines, int) and not isinstance(num_machines, bool) and num_machines < 2:
            raise ConfigError(
                "num_machines",
                num_machines,
                "Multi-Machine training cannot be run with less than 2 Machines",
                "use Job.run for one machine",
            )
        return Job.run(
            name,
            machine,
            cloud,
            command,
            studio,
            image,
            teamspace,
            org,
            user,
            env,
            interruptible,
            num_machines=num_machines,
            **options,
        )
