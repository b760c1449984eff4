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
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict, Iterator, List, Optional, Tuple, Union

from mmt.backends.base import JobState
from mmt.errors import ConfigError
from mmt.jobdir import JobDir
from mmt.planning.machine import canonical_name, catalogue_names
from mmt.service import status as job_status
from mmt.service.registry import JobRecord, Registry
from mmt.service.submit import RunSpec, run

#: Lightning's machine types in mmt's catalogue: ``Machine.T4``, ``Machine.A100_X_8`` ... (values: catalogue names)
Machine = enum.Enum("Machine", {name.upper(): name for name in catalogue_names()}, type=str)  # type: ignore[misc]


class Status(str, enum.Enum):
    """Lightning's job states."""

    Pending = "Pending"
    Running = "Running"
    Stopping = "Stopping"
    Stopped = "Stopped"
    Completed = "Completed"
    Failed = "Failed"

    @property
    def final(self) -> bool:
        return self in (Status.Stopped, Status.Completed, Status.Failed)


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


@dataclass(frozen=True)
class MachineRun:
    """One node of a job (Lightning's ``job.machines[i]``)."""

    job: "Job"
    rank: int

    @property
    def status(self) -> Status:
        return self.job._node_status(self.rank)

    @property
    def logs(self) -> str:
        return self.job._node_logs(self.rank)


class Job:
    """A handle on a registered job, by name: valid in any process, on the machine that submitted it."""

    def __init__(self, name: str, registry: Optional[Registry] = None) -> None:
        self.name = name
        self._registry = registry or Registry()

    def __repr__(self) -> str:
        return f"Job(name={self.name!r})"

    def __reduce__(self):  # a handle travels by name (a detached sweep's JobReturn values)
        return (Job, (self.name,))

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

    # ------------------------------------------------------------------------------------------ facts

    def _record(self) -> JobRecord:
        return job_status.refresh(self._registry.require(self.name), self._registry)

    @property
    def status(self) -> Status:
        return Status(job_status.lightning_status(self._record().state))

    @property
    def dir(self) -> Path:
        return Path(self._registry.require(self.name).job_dir)

    @property
    def num_machines(self) -> int:
        return self._registry.require(self.name).num_nodes

    @property
    def is_multi_machine(self) -> bool:
        return self.num_machines > 1

    @property
    def machine(self) -> str:
        return self._registry.require(self.name).machine

    @property
    def command(self) -> Optional[str]:
        return self._registry.require(self.name).command

    @property
    def id(self) -> str:
        return self._registry.require(self.name).job_id

    @property
    def result(self) -> Any:
        """Rank 0's return value once the job completed (a command's: its exit code and duration), else None."""
        record = self._record()
        return (record.result or {}).get("return_value")

    @property
    def error(self) -> Optional[str]:
        return (self._record().result or {}).get("error")

    @property
    def machines(self) -> Tuple[MachineRun, ...]:
        return tuple(MachineRun(self, rank) for rank in range(self.num_machines))

    # ------------------------------------------------------------------------------------------ acting

    def wait(self, interval: float = 0.5, timeout: Optional[float] = None, stop_on_timeout: bool = False) -> Status:
        """Block until the job has ended; TimeoutError after ``timeout`` seconds (stopping it first if asked)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            current = self.status
            if current.final:
                return current
            if deadline is not None and time.monotonic() >= deadline:
                if stop_on_timeout:
                    self.stop()
                raise TimeoutError(f"job {self.name} is still {current.value} after {timeout:g} s")
            time.sleep(interval)

    def stop(self) -> None:
        job_status.stop(self._record())

    def logs(self, rank: int = 0, follow: bool = False, tail: Optional[int] = None) -> Union[str, Iterator[str]]:
        """Rank ``rank``'s output (a per-node command job: node ``rank``'s); ``follow``: an iterator of lines that
        ends when the job has ended."""
        path = self._log_path(rank)
        if follow:
            return self._follow(path)
        text = path.read_text(errors="replace") if path.exists() else ""
        return "".join(text.splitlines(keepends=True)[-tail:]) if tail else text

    # ------------------------------------------------------------------------------------------ internals

    def _log_path(self, rank: int) -> Path:
        record = self._registry.require(self.name)
        per_node = record.command is not None and record.command_mode == "per_node"
        logs = JobDir(Path(record.job_dir)).logs
        if per_node:
            return logs / f"node{rank}.log"
        return logs / f"node{rank // record.devices}.rank{rank}.log"

    def _follow(self, path: Path) -> Iterator[str]:
        offset, partial = 0, ""
        while True:
            ended = self.status.final
            if path.exists():
                with open(path, errors="replace") as handle:
                    handle.seek(offset)
                    data = handle.read()
                    offset = handle.tell()
                lines = (partial + data).split("\n")
                partial = lines.pop()
                yield from (line + "\n" for line in lines)
            if ended:
                if partial:
                    yield partial
                return
            time.sleep(0.5)

    def _node_status(self, node: int) -> Status:
        job = self.status
        if not job.final:
            return job
        failure = (self._record().result or {}).get("failure")
        if job == Status.Failed and failure is not None and failure.get("node_rank") != node:
            return Status.Stopped  # its ranks were stopped because another node's failed
        return job

    def _node_logs(self, node: int) -> str:
        logs = JobDir(self.dir).logs
        files = sorted(logs.glob(f"node{node}.log")) + sorted(logs.glob(f"node{node}.rank*.log"),
                                                               key=lambda p: int(p.name.split("rank")[1][:-4]))
        return "".join(p.read_text(errors="replace") for p in files)


class MMT(Job):
    """Multi-machine training (Lightning's ``MMT``): a Job of at least two machines."""

    @classmethod
    def run(cls, command: str, name: Optional[str] = None, num_machines: int = 2, **options: Any) -> "Job":
        if num_machines < 2:
            raise ConfigError("num_machines", num_machines, "Multi-Machine training cannot be run with less than "
                              "2 Machines", "use Job.run for one machine")
        return Job.run(command=command, name=name, num_machines=num_machines, **options)

