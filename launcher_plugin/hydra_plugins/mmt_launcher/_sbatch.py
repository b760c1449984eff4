"""SLURM settings and the sbatch parameters of a job: validated here, rendered by submitit (pure, no I/O).

What reaches the generated script is safe by construction: ``#SBATCH`` values and srun arguments are shell-quoted
by submitit, the container wrapper is quoted here, and a value that cannot be quoted on one line (a newline, a NUL)
is refused. ``env`` and ``command`` never pass through the script: they travel in the job payload. ``setup`` lines
are shell code on purpose (module load, conda activate) and are written as given.
"""

import math
import re
import shlex
import sys
from dataclasses import dataclass
from typing import Any, Dict, List, Optional, Tuple

from omegaconf import DictConfig, OmegaConf

from . import _validate as check
from ._plan import JobPlan
from .errors import ConfigError

CONTAINER_RUNTIMES = ("pyxis", "apptainer", "singularity")
# sbatch options the launcher sets itself from the plan; overriding them through sbatch_extra would desynchronise
# the job from its plan (and from Lightning's validation of devices/num_nodes)
_MANAGED = {"nodes", "ntasks-per-node", "ntasks", "time", "output", "error", "signal", "job-name", "open-mode",
            "gpus-per-node", "cpus-per-task", "mem", "partition", "account", "qos", "constraint", "array"}
_OPTION_NAME = re.compile(r"^[a-z][a-z0-9_-]*$")


def _one_line(key: str, value: Any) -> Any:
    if isinstance(value, str) and ("\n" in value or "\r" in value or "\0" in value):
        raise ConfigError(key, value, "a value written into the sbatch script must fit on one line",
                          "remove the newline; pass multi-line data through env or a file instead")
    return value


@dataclass(frozen=True)
class SlurmSettings:
    """``hydra.launcher.*`` of cluster=slurm, validated."""

    folder: str
    partition: Optional[str]
    account: Optional[str]
    qos: Optional[str]
    constraint: Optional[str]
    cpus_per_task: Optional[int]
    mem_gb: Optional[int]
    gpus_per_node: Optional[int]
    setup: Tuple[str, ...]
    sbatch_extra: Tuple[Tuple[str, Any], ...]
    srun_extra: Tuple[str, ...]
    container_runtime: str
    container_mounts: Tuple[str, ...]
    signal_delay_s: int
    max_requeues: int
    poll_interval_s: float

    @classmethod
    def from_config(cls, cfg: DictConfig) -> "SlurmSettings":
        keys = ("submitit_folder", "partition", "account", "qos", "constraint", "cpus_per_task", "mem_gb",
                "gpus_per_node", "setup", "sbatch_extra", "srun_extra", "container_runtime", "container_mounts",
                "signal_delay_s", "max_requeues", "poll_interval_s")
        raw = {k: OmegaConf.to_container(cfg[k], resolve=True) if OmegaConf.is_config(cfg[k]) else cfg[k]
               for k in keys}
        text = {k: _one_line(f"hydra.launcher.{k}", raw[k]) for k in ("partition", "account", "qos", "constraint")}
        extra = {}
        for name, value in (raw["sbatch_extra"] or {}).items():
            key = f"hydra.launcher.sbatch_extra.{name}"
            option = str(name).replace("_", "-")
            if not _OPTION_NAME.match(str(name)):
                raise ConfigError(key, value, "sbatch option names are lower-case letters, digits, - and _",
                                  "e.g. hydra.launcher.sbatch_extra.mail-type=END")
            if option in _MANAGED:
                raise ConfigError(key, value, f"--{option} is set by mmt from the job's plan",
                                  "use num_nodes/devices/machine or the hydra.launcher field of that name")
            if not isinstance(value, (str, int, float, bool)):
                raise ConfigError(key, value, "expected a string, number or boolean", f"e.g. {key}=value")
            extra[str(name)] = _one_line(key, value)
        optional_int = lambda key, minimum: None if raw[key] is None else check.whole_number(  # noqa: E731
            f"hydra.launcher.{key}", raw[key], minimum, f"e.g. hydra.launcher.{key}=4")
        return cls(
            folder=str(raw["submitit_folder"]),
            cpus_per_task=optional_int("cpus_per_task", 1),
            mem_gb=optional_int("mem_gb", 1),
            gpus_per_node=optional_int("gpus_per_node", 0),
            setup=tuple(str(line) for line in raw["setup"] or ()),
            sbatch_extra=tuple(sorted(extra.items())),
            srun_extra=tuple(_one_line("hydra.launcher.srun_extra", str(a)) for a in raw["srun_extra"] or ()),
            container_runtime=check.choice("hydra.launcher.container_runtime", raw["container_runtime"],
                                           CONTAINER_RUNTIMES),
            container_mounts=tuple(_mount(m) for m in raw["container_mounts"] or ()),
            signal_delay_s=check.whole_number("hydra.launcher.signal_delay_s", raw["signal_delay_s"], 1,
                                              "seconds before the time limit, e.g. 90"),
            max_requeues=check.whole_number("hydra.launcher.max_requeues", raw["max_requeues"], 0,
                                            "e.g. hydra.launcher.max_requeues=3"),
            poll_interval_s=check.positive_number("hydra.launcher.poll_interval_s", raw["poll_interval_s"],
                                                  "seconds, e.g. 1"),
            **text,
        )


def _mount(value: Any) -> str:
    value = _one_line("hydra.launcher.container_mounts", str(value))
    if "," in value or ":" not in value:
        raise ConfigError("hydra.launcher.container_mounts", value, "expected SOURCE:TARGET[:FLAGS] without commas",
                          "e.g. hydra.launcher.container_mounts=[/data:/data]")
    return value


def python_command(plan: JobPlan, settings: SlurmSettings, project_dir: str) -> str:
    """How the task runs Python: this interpreter, or python3 inside the job's container (quoted here)."""
    if plan.image is None:
        return shlex.quote(sys.executable)
    if settings.container_runtime == "pyxis":
        return "python3"  # srun itself enters the container (--container-image)
    binds = [f"{project_dir}:{project_dir}", *settings.container_mounts]
    wrapper = [settings.container_runtime, "exec", "--pwd", project_dir]
    for bind in binds:
        wrapper += ["--bind", bind]
    if plan.machine.gpus:
        wrapper.append("--nv")
    return shlex.join([*wrapper, plan.image, "python3"])


def _container_srun_args(plan: JobPlan, settings: SlurmSettings, project_dir: str) -> List[str]:
    if plan.image is None or settings.container_runtime != "pyxis":
        return []
    mounts = ",".join([f"{project_dir}:{project_dir}", *settings.container_mounts])
    return [f"--container-image={plan.image}", f"--container-mounts={mounts}", f"--container-workdir={project_dir}"]


def sbatch_parameters(plan: JobPlan, settings: SlurmSettings, project_dir: str, job_name: str) -> Dict[str, Any]:
    """The parameters of submitit's SlurmExecutor for this job (its names: time, ntasks_per_node, mem ...)."""
    tasks_per_node = plan.processes_per_node
    cpus = settings.cpus_per_task
    if cpus is None and plan.machine.cpus:
        cpus = max(1, plan.machine.cpus // tasks_per_node)
    gpus = settings.gpus_per_node if settings.gpus_per_node is not None else plan.machine.gpus
    params: Dict[str, Any] = {
        "job_name": job_name,
        "nodes": plan.num_nodes,
        "ntasks_per_node": tasks_per_node,
        "time": max(1, math.ceil(plan.timeout_s / 60.0)),
        "signal_delay_s": settings.signal_delay_s,
        # one dead rank ends the whole job at once instead of leaving the others in a collective until timeout
        "srun_args": ["--kill-on-bad-exit=1", *_container_srun_args(plan, settings, project_dir),
                      *settings.srun_extra],
        "additional_parameters": {"requeue": True, **dict(settings.sbatch_extra)},
    }
    if cpus:
        params["cpus_per_task"] = cpus
    if gpus:
        params["gpus_per_node"] = gpus
    if settings.mem_gb:
        params["mem"] = f"{settings.mem_gb}GB"
    for key in ("partition", "account", "qos", "constraint"):
        if getattr(settings, key) is not None:
            params[key] = getattr(settings, key)
    setup = list(settings.setup)
    if plan.image is not None:
        # the image brings Python and the libraries; mmt, the app and its recipes come from the mounted project
        paths = shlex.quote(f"{project_dir}/launcher_plugin:{project_dir}")
        setup.append(f"export PYTHONPATH={paths}${{PYTHONPATH:+:$PYTHONPATH}}")
    if setup:
        params["setup"] = setup
    return params


def render_script(plan: JobPlan, settings: SlurmSettings, project_dir: str, job_name: str) -> str:
    """The exact sbatch script submitit will write for this job."""
    from submitit.slurm.slurm import _make_sbatch_string  # lazy: submitit is only needed for cluster=slurm

    folder = settings.folder
    command = " ".join([python_command(plan, settings, project_dir), "-u -m submitit.core._submit",
                        shlex.quote(folder)])
    return _make_sbatch_string(command=command, folder=folder,
                               **sbatch_parameters(plan, settings, project_dir, job_name))
