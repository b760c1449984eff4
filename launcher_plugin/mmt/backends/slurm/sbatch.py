"""SLURM settings and the sbatch parameters of a job: validated here, rendered by submitit (pure, no I/O).

A job is ``--nodes=N``, and by default one task per node (``tasks=per_node``): each task is that node's agent, which
forks the node's ranks (``mmt.agent.node``). ``tasks=per_rank`` gives SLURM one task per rank instead, for sites that
bind resources per task. The batch script's exit runs ``mmt.backends.slurm.finalize``, which writes the job's
result from inside the allocation, whether or not a launcher still watches.

What reaches the generated script is safe by construction: ``#SBATCH`` values and srun arguments are shell-quoted
by submitit, the container wrapper and mmt's own lines are quoted here, and a value that cannot be quoted on one line
(a newline, a NUL) is refused. ``env`` and ``command`` never pass through the script: they travel in the job
payload. ``setup`` lines are shell code on purpose (module load, conda activate) and are written as given.
"""

import math
import os
import re
import shlex
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence, Tuple, Union

from omegaconf import DictConfig

from mmt.backends import settings as common
from mmt.backends.mounts import MountSyntax, parse_mount
from mmt.backends.slurm.oci import BUNDLE
from mmt.core.errors import ConfigError
from mmt.core.jobdir import WATCHED_FRESH_S, Attempt
from mmt.core.rank_env import MMT_RESTART_COUNT
from mmt.core.snapshot import binds as snapshot_binds
from mmt.core.states import StartMethod
from mmt.planning import validate as check
from mmt.planning.machine import Machine
from mmt.planning.plan import JobPlan

TASK_LAYOUTS = ("per_node", "per_rank")
# the batch script's start, for the job's own conclusion (duration, time limit reached or not)
STARTED_VAR = "MMT_BATCH_STARTED"
# when the batch script got SIGTERM (scancel, the time limit), if it did
TERMINATED_VAR = "MMT_BATCH_TERMINATED"
# when the batch script last got USR1/USR2, if it did (kept from killing the shell)
# when the current run of a job that may restart began (its restart step measures the run from it)
RUN_STARTED_VAR = "MMT_RUN_STARTED"
SIGNALLED_VAR = "MMT_BATCH_SIGNALLED"

CONTAINER_RUNTIMES = ("pyxis", "apptainer", "singularity", "oci")
# sbatch options the launcher sets itself from the plan; overriding them through sbatch_extra would desynchronise
# the job from its plan (and from Lightning's validation of devices/num_nodes)
_MANAGED = {
    "nodes",
    "ntasks-per-node",
    "ntasks",
    "time",
    "output",
    "error",
    "signal",
    "job-name",
    "open-mode",
    "gpus-per-node",
    "cpus-per-task",
    "mem",
    "partition",
    "account",
    "qos",
    "constraint",
    "array",
}
_OPTION_NAME = re.compile(r"^[a-z][a-z0-9_-]*$")


_ONE_LINE_HINT = "remove the newline; pass multi-line data through env or a file instead"


def _one_line(key: str, value: Any) -> Any:
    return check.one_line(key, value, _ONE_LINE_HINT)


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
    tasks: str = "per_node"
    # seconds between SIGTERM and SIGKILL when a node agent stops its ranks
    kill_grace_s: float = 1.0
    # how node agents start ranks
    start_method: str = StartMethod.fork.value
    # most tasks of each of the launch's job arrays running at once (hydra.launcher.max_parallel_jobs: %N)
    max_parallel_jobs: Optional[int] = None
    # SLURM's commands run on a login node reached over SSH (mmt.remote): they are not looked for here
    over_ssh: bool = False

    @property
    def agent_per_node(self) -> bool:
        return self.tasks == "per_node"

    @classmethod
    def for_watching(cls, poll_interval_s: float = 1.0) -> "SlurmSettings":
        """What watching jobs another process submitted needs (no site settings: nothing is submitted)."""
        return cls(
            folder="",
            partition=None,
            account=None,
            qos=None,
            constraint=None,
            cpus_per_task=None,
            mem_gb=None,
            gpus_per_node=None,
            setup=(),
            sbatch_extra=(),
            srun_extra=(),
            container_runtime="pyxis",
            container_mounts=(),
            signal_delay_s=90,
            max_requeues=0,
            poll_interval_s=poll_interval_s,
        )

    @classmethod
    def from_config(cls, cfg: DictConfig) -> "SlurmSettings":
        raw = common.plain_values(cfg, (k for k in _SETTINGS if k != "max_parallel_jobs"), {"max_parallel_jobs": None})
        found = common.validated(raw, _SETTINGS)
        return cls(folder=found.pop("submitit_folder"), **found)


def _sbatch_extra(given: Any) -> Tuple[Tuple[str, Any], ...]:
    """``sbatch_extra``: further ``#SBATCH`` options, never one that mmt sets from the plan."""
    extra = {}
    for name, value in (given if isinstance(given, dict) else {}).items():
        key = f"hydra.launcher.sbatch_extra.{name!s}"
        option = str(name).replace("_", "-")
        if not _OPTION_NAME.match(str(name)):
            raise ConfigError(
                key,
                value,
                "sbatch option names are lower-case letters, digits, - and _",
                "e.g. hydra.launcher.sbatch_extra.mail-type=END",
            )
        if option in _MANAGED:
            raise ConfigError(
                key,
                value,
                f"--{option} is set by mmt from the job's plan",
                "use num_nodes/devices/machine or the hydra.launcher field of that name",
            )
        if not isinstance(value, (str, int, float, bool)):
            raise ConfigError(key, value, "expected a string, number or boolean", f"e.g. {key}=value")
        extra[str(name)] = _one_line(key, value)
    return tuple(sorted(extra.items()))


def _text(name: str) -> common.Check:
    """A SLURM name (partition, account, ...): on one line."""
    return lambda value: _one_line(common.key(name), value)


def _optional_int(name: str, minimum: int) -> common.Check:
    return common.unless_none(
        lambda value: check.whole_number(common.key(name), value, minimum, f"e.g. hydra.launcher.{name}=4")
    )


def _each(checked: common.Check) -> common.Check:
    """A list setting (null: empty): each item checked."""
    return lambda value: tuple(checked(item) for item in value or ())


# container_mounts as pyxis (which joins them with commas), apptainer and SLURM's OCI runtime bind them
_MOUNTS = MountSyntax(
    expected="expected SOURCE:TARGET[:FLAGS] without commas",
    hint="e.g. hydra.launcher.container_mounts=[/data:/data]",
    commas=False,
    one_line_hint=_ONE_LINE_HINT,
)

# hydra.launcher.* of cluster=slurm -> its check, in the order they are checked (submitit_folder is the folder field)
_SETTINGS: Dict[str, common.Check] = {
    **{name: _text(name) for name in ("partition", "account", "qos", "constraint")},
    "sbatch_extra": _sbatch_extra,
    "submitit_folder": lambda value: _one_line(common.key("submitit_folder"), str(value)),
    "cpus_per_task": _optional_int("cpus_per_task", 1),
    "mem_gb": _optional_int("mem_gb", 1),
    "gpus_per_node": _optional_int("gpus_per_node", 0),
    "setup": _each(str),
    "srun_extra": _each(lambda arg: _one_line(common.key("srun_extra"), str(arg))),
    "container_runtime": lambda value: check.choice(common.key("container_runtime"), value, CONTAINER_RUNTIMES),
    "container_mounts": _each(lambda mount: parse_mount(mount, _MOUNTS)),
    "signal_delay_s": lambda value: check.whole_number(
        common.key("signal_delay_s"), value, 1, "seconds before the time limit, e.g. 90"
    ),
    "max_requeues": lambda value: check.whole_number(
        common.key("max_requeues"), value, 0, "e.g. hydra.launcher.max_requeues=3"
    ),
    "poll_interval_s": common.poll_interval_s,
    "tasks": lambda value: check.choice(common.key("tasks"), value, TASK_LAYOUTS),
    "kill_grace_s": common.kill_grace_s,
    "start_method": common.start_method,
    # absent from an older config
    "max_parallel_jobs": common.unless_none(
        lambda value: check.whole_number(
            common.key("max_parallel_jobs"),
            value,
            1,
            "tasks of a job array at once, e.g. hydra.launcher.max_parallel_jobs=4",
        )
    ),
}


def python_command(plan: JobPlan, settings: SlurmSettings, project_dir: str) -> str:
    """How the task runs Python: this interpreter, or python3 inside the job's container (quoted here)."""
    if plan.image is None or oci_command(plan, settings):
        # a command in SLURM's OCI containers: the node agent runs here, each rank's command in a container
        return shlex.quote(sys.executable)
    if settings.container_runtime in ("pyxis", "oci"):
        return "python3"  # srun itself enters the container (--container-image, --container)
    binds = [f"{project_dir}:{project_dir}", *snapshot_binds(plan.snapshot), *settings.container_mounts]
    wrapper = [settings.container_runtime, "exec", "--pwd", project_dir]
    for bind in binds:
        wrapper += ["--bind", bind]
    if plan.machine.gpus:
        wrapper.append("--nv")
    return shlex.join([*wrapper, plan.image, "python3"])


def _container_srun_args(plan: JobPlan, settings: SlurmSettings, project_dir: str) -> List[str]:
    if plan.image is None or settings.container_runtime != "pyxis":
        return []
    mounts = ",".join([f"{project_dir}:{project_dir}", *snapshot_binds(plan.snapshot), *settings.container_mounts])
    return [f"--container-image={plan.image}", f"--container-mounts={mounts}", f"--container-workdir={project_dir}"]


def oci_command(plan: JobPlan, settings: SlurmSettings) -> bool:
    """A command job in SLURM's OCI containers: its ranks' commands run in containers, not its node agents."""
    return plan.image is not None and settings.container_runtime == "oci" and plan.command is not None


def with_container(script: str, plan: JobPlan, settings: SlurmSettings, attempt: Union[Attempt, "TaskTarget"]) -> str:
    """The task function in SLURM's OCI containers: the srun line enters the attempt's bundle (``oci.derive``),
    ``--container`` after srun's own options. Written here, not through submitit's srun arguments, which it quotes:
    a job array's tasks find their attempt dir in a variable. Unchanged for anything else."""
    if plan.image is None or settings.container_runtime != "oci" or oci_command(plan, settings):
        return script
    target = TaskTarget.of(attempt)
    word = (
        shlex.quote(str(target.attempt.dir / BUNDLE))
        if target.attempt is not None
        else f'"${ARRAY_ATTEMPT_VAR}"/{BUNDLE}'
    )
    lines = script.split("\n")
    at = next(index for index, line in enumerate(lines) if line.startswith("srun "))
    python = f" {python_command(plan, settings, '')} "
    head, tail = lines[at].split(python, 1)
    lines[at] = f"{head} --container={word}{python}{tail}"
    return "\n".join(lines)


def tasks_per_node(plan: JobPlan, settings: SlurmSettings) -> int:
    """SLURM tasks per node: the node agent alone, or one per rank (a per-node command is one process anyway)."""
    return 1 if settings.agent_per_node else plan.processes_per_node


# a job array's task: its own job's attempt dir, looked up in the array's manifest by SLURM_ARRAY_TASK_ID
ARRAY_ATTEMPT_VAR = "MMT_TASK_ATTEMPT"


def own_job_id() -> str:
    """Inside an allocation: its job as mmt (and its registry) names it, ``<array>_<index>`` for a job array's task
    (whose SLURM_JOB_ID is a number of its own, which squeue and scancel take as well)."""
    array, index = os.environ.get("SLURM_ARRAY_JOB_ID"), os.environ.get("SLURM_ARRAY_TASK_ID")
    return f"{array}_{index}" if array and index else os.environ.get("SLURM_JOB_ID", "?")


@dataclass(frozen=True)
class TaskTarget:
    """Where the allocation's tasks find the attempt dir of the job they run: one job's (``attempt``), or, for a job
    array (one sbatch for many jobs that share their resources), the ``manifest``'s line that the task's
    ``SLURM_ARRAY_TASK_ID`` picks (one attempt dir per line, the array's index order)."""

    attempt: Optional[Attempt] = None
    manifest: Optional[Path] = None

    @classmethod
    def of(cls, where: Union[Attempt, "TaskTarget"]) -> "TaskTarget":
        return where if isinstance(where, TaskTarget) else cls(attempt=where)

    @property
    def dir_word(self) -> str:
        """The attempt dir as one shell word of the batch script."""
        return shlex.quote(str(self.attempt.dir)) if self.attempt is not None else f'"${ARRAY_ATTEMPT_VAR}"'

    @property
    def task_args(self) -> str:
        """What the task runner is given: the attempt's task file, or the array's manifest."""
        if self.attempt is not None:
            return shlex.quote(str(self.attempt.cluster_task))
        return f"--array {shlex.quote(str(self.manifest))}"

    def setup(self) -> List[str]:
        """A job array's task first finds its own attempt dir (SLURM counts array tasks from 0)."""
        if self.manifest is None:
            return []
        line = '"$((SLURM_ARRAY_TASK_ID + 1))p"'
        return [f"export {ARRAY_ATTEMPT_VAR}=$(sed -n {line} {shlex.quote(str(self.manifest))})"]


def finalize_line(target: Union[Attempt, TaskTarget]) -> str:
    """The batch script's last act, whatever ends it (the tasks' end, scancel, the time limit): the job's own
    conclusion (``mmt.backends.slurm.finalize``), run by the launcher's interpreter (a shared filesystem, as for the
    job dir). Skipped when a launcher has concluded the job already, and where that interpreter is not there (a
    container-only site, where the launcher concludes)."""
    python, where = shlex.quote(sys.executable), TaskTarget.of(target).dir_word
    # nor when the tasks ended well while a launcher watches (a fresh Attempt.watched): it concludes the job from its
    # files, and an interpreter started only to find that out costs a sweep of short jobs a tenth of its CPU
    watched = f'[ -n "$(find {where}/watched -mmin -{WATCHED_FRESH_S / 60:g} 2>/dev/null)" ]'
    body = (
        f"rc=$?; [ -e {where}/concluded ] || {{ [ $rc = 0 ] && {watched}; }} || {{ [ -x {python} ] && "
        f'{python} -m mmt.backends.slurm.finalize {where} "$rc" "${{{TERMINATED_VAR}:-}}"; }}'
    )
    return f"trap {shlex.quote(body)} EXIT"


def node_resources(machine: Machine, settings: SlurmSettings, per_node: int) -> Tuple[Optional[int], int]:
    """(CPUs per task, GPUs per node) of a node of ``machine`` with ``per_node`` tasks: the site's settings, else
    the machine's."""
    cpus = settings.cpus_per_task
    if cpus is None and machine.cpus:
        cpus = max(1, machine.cpus // per_node)
    gpus = settings.gpus_per_node if settings.gpus_per_node is not None else machine.gpus
    return cpus, gpus


def sbatch_parameters(
    plan: JobPlan,
    settings: SlurmSettings,
    project_dir: str,
    job_name: str,
    attempt: Union[Attempt, TaskTarget],
    after: Sequence[str] = (),
) -> Dict[str, Any]:
    """The parameters of submitit's SlurmExecutor for this job (its names: time, ntasks_per_node, mem ...)."""
    per_node = tasks_per_node(plan, settings)
    cpus, gpus = node_resources(plan.machine, settings, per_node)
    params: Dict[str, Any] = {
        "job_name": job_name,
        # a job with roles: the first component, the primary role's nodes (with_het_components adds the others)
        "nodes": plan.roles[0].num_nodes if plan.roles else plan.num_nodes,
        "ntasks_per_node": per_node,
        "time": max(1, math.ceil(plan.timeout_s / 60.0)),
        "signal_delay_s": settings.signal_delay_s,
        # one dead task ends the whole job at once instead of leaving the others in a collective until timeout
        # (a job with roles: each component's container, with_het_components)
        "srun_args": [
            "--kill-on-bad-exit=1",
            *([] if plan.roles else _container_srun_args(plan, settings, project_dir)),
            *settings.srun_extra,
        ],
        # max_requeues=0: SLURM itself must not requeue the job either (scontrol requeue, a node failure)
        "additional_parameters": {
            "requeue" if settings.max_requeues else "no_requeue": True,
            # an elastic job's allocation outlives a failed node: its coordinator forms the world again
            **({"no_kill": True} if plan.elastic is not None else {}),
            # the jobs it runs after (hydra.launcher.after): a dependency that fails cancels it (never pends)
            **({"dependency": "afterok:" + ":".join(after), "kill_on_invalid_dep": "yes"} if after else {}),
            **dict(settings.sbatch_extra),
        },
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
    if plan.images:
        # the image brings Python and the libraries; mmt, the app and its recipes come from the mounted project
        paths = shlex.quote(f"{project_dir}/launcher_plugin:{project_dir}")
        setup.append(f"export PYTHONPATH={paths}${{PYTHONPATH:+:$PYTHONPATH}}")
        if settings.container_runtime == "oci" and not oci_command(plan, settings):
            # SLURM 22.05 gives a container task the step's environment, not the task's own variables: these would
            # be the batch script's (node 0's) on every node; the task finds its node by its host name instead
            setup.append("unset SLURM_PROCID SLURM_LOCALID SLURM_NODEID")
    # SIGTERM (scancel, the time limit) must not end the script before srun has stopped the tasks: the trap on
    # TERM makes bash wait for srun, then the EXIT trap concludes the job with every process gone
    # USR1/USR2 (`scancel --signal=USR2 --full`, a site's preemption notice) would kill the shell, and so the job,
    # unexplained: the shell ignores them (a trap with a body: the tasks keep the default disposition), the tasks get
    # them from SLURM itself (--signal, --full) and the ranks take USR2 (mmt.core.preemption)
    setup += [
        *TaskTarget.of(attempt).setup(),
        f"export {STARTED_VAR}=$(date +%s.%N)",
        f"trap '{TERMINATED_VAR}=$(date +%s.%N)' TERM",
        f"trap '{SIGNALLED_VAR}=$(date +%s.%N)' USR1 USR2",
        finalize_line(attempt),
    ]
    params["setup"] = setup
    return params


def signal_delay_problem(plan: JobPlan, settings: SlurmSettings) -> Optional[ConfigError]:
    """The requeue signal must come before the time limit, not at the job's start."""
    limit_s = 60 * max(1, math.ceil(plan.timeout_s / 60.0))
    if settings.signal_delay_s < limit_s:
        return None
    return ConfigError(
        "hydra.launcher.signal_delay_s",
        settings.signal_delay_s,
        f"SLURM would send the requeue signal (USR2) {settings.signal_delay_s} s before a time limit "
        f"of {limit_s} s (timeout_min), that is at the job's start",
        f"use a delay below {limit_s} s, e.g. hydra.launcher.signal_delay_s={max(1, limit_s // 4)}",
    )


def task_command(plan: JobPlan, settings: SlurmSettings, project_dir: str, attempt: Union[Attempt, TaskTarget]) -> str:
    """What srun runs in every task: mmt's own task runner on the attempt's task file (``mmt.backends.slurm.task``),
    or, in a job array, on the array's manifest."""
    args = TaskTarget.of(attempt).task_args
    return " ".join([python_command(plan, settings, project_dir), _TASK_RUNNER, args])


# how every task runs mmt's task runner, after the task's Python
_TASK_RUNNER = "-u -m mmt.backends.slurm.task"


def render_script(
    plan: JobPlan,
    settings: SlurmSettings,
    project_dir: str,
    job_name: str,
    attempt: Union[Attempt, TaskTarget],
    after: Sequence[str] = (),
) -> str:
    """The exact sbatch script submitit will write for this job (for a job array: for every job of the group)."""
    from submitit.slurm.slurm import _make_sbatch_string  # lazy: submitit is only needed for cluster=slurm

    folder = settings.folder
    command = task_command(plan, settings, project_dir, attempt)
    params = sbatch_parameters(plan, settings, project_dir, job_name, attempt, after)
    script = _make_sbatch_string(command=command, folder=folder, **params)
    return with_mmt_lines(script, plan, settings, project_dir, attempt)


def with_het_components(script: str, plan: JobPlan, settings: SlurmSettings, project_dir: str) -> str:
    """A job with roles is one heterogeneous job: the primary role's nodes are the first component (submitit's
    own lines), each other role a component of its own after ``#SBATCH hetjob`` (its nodes, one task per node, the
    same machine and placement), and one srun step spans every component, written per component (``srun <args>
    --het-group=0 <cmd> : <args> --het-group=1 <cmd>``) so that each runs in its role's image (pyxis's
    ``--container-image``, apptainer's wrapper) or in this environment: one submission, one allocation, one step,
    each task a node agent that finds its role by its task id. Unchanged without roles."""
    if len(plan.roles) < 2:
        return script
    lines = script.split("\n")
    last = max(index for index, line in enumerate(lines) if line.startswith("#SBATCH "))
    shared = [line for line in lines[: last + 1] if line.startswith(_COMPONENT_OPTIONS)]
    extra = []
    for role in plan.roles[1:]:
        cpus, gpus = node_resources(role.machine, settings, 1)  # one task per node: its node agent
        extra += [
            "#SBATCH hetjob",
            f"#SBATCH --nodes={role.num_nodes}",
            "#SBATCH --ntasks-per-node=1",
            *([f"#SBATCH --cpus-per-task={cpus}"] if cpus else []),
            *([f"#SBATCH --gpus-per-node={gpus}"] if gpus else []),
            *shared,
        ]
    lines[last + 1 : last + 1] = extra
    at = next(index for index, line in enumerate(lines) if line.startswith("srun "))
    # srun's options before a ':' are that component's own: the shared ones (logs, --kill-on-bad-exit) are repeated
    args, runner = lines[at][len("srun ") :].split(f" {python_command(plan, settings, project_dir)} {_TASK_RUNNER} ")
    args = _leader_paths(args)
    components = []
    for index, role in enumerate(plan.roles):
        own = plan.for_role(role)
        words = [args, f"--het-group={index}", *_container_srun_args(own, settings, project_dir)]
        components.append(" ".join([*words, python_command(own, settings, project_dir), _TASK_RUNNER, runner]))
    lines[at] = "srun " + " : ".join(components)
    return "\n".join(lines)


def _leader_paths(srun_args: str) -> str:
    """The tasks' log paths of a heterogeneous job under its leader's id: SLURM's ``%j`` is each component's own
    id, and a later component's tasks would find no dir of that name (submitit makes the leader's): they would not
    start at all."""
    words = shlex.split(srun_args)
    for flag in ("--output", "--error"):
        if flag in words[:-1]:
            path = words[words.index(flag) + 1]
            leader = '"$SLURM_JOB_ID"'.join(shlex.quote(part) for part in path.split("%j"))
            srun_args = srun_args.replace(shlex.quote(path), leader, 1)
    return srun_args


# the #SBATCH options each component of a heterogeneous job repeats: its tasks, its machine, where it runs
_COMPONENT_OPTIONS = tuple(
    f"#SBATCH --{option}"
    for option in (
        "mem=",
        "partition=",
        "account=",
        "qos=",
        "constraint=",
        "time=",
    )
)


def with_restart_loop(script: str, plan: JobPlan, attempt: Union[Attempt, TaskTarget]) -> str:
    """A job that may restart after a failure (``max_restarts``) runs its srun step again inside the allocation,
    never waiting in the queue again: after a run that failed by itself (not scancel, nor the time limit: the TERM
    trap says so), the restart step (``mmt.backends.slurm.restart``) decides, records the run and sets its records
    aside; ``MMT_RESTART_COUNT`` reaches every task one higher. The script still ends with the last run's status,
    which the EXIT trap concludes. Unchanged for a job that may not restart."""
    if not plan.max_restarts:
        return script
    lines = script.split("\n")
    at = next(index for index, line in enumerate(lines) if line.startswith("srun "))
    python, where = shlex.quote(sys.executable), TaskTarget.of(attempt).dir_word
    lines[at : at + 1] = [
        f"export {MMT_RESTART_COUNT}=0",
        "while :; do",
        f"    export {RUN_STARTED_VAR}=$(date +%s.%N)",
        f"    {lines[at]}",
        "    rc=$?",
        f'    [ "$rc" -ne 0 ] && [ -z "${{{TERMINATED_VAR}:-}}" ] || break',
        f'    {python} -m mmt.backends.slurm.restart {where} "$rc" || break',
        f"    export {MMT_RESTART_COUNT}=$(({MMT_RESTART_COUNT} + 1))",
        "done",
        '(exit "$rc")',
    ]
    return "\n".join(lines)


def with_elastic_coordinator(script: str, plan: JobPlan) -> str:
    """An elastic job asks for MIN to MAX nodes (SLURM gives what it can), and its
    batch script runs its coordinator (``mmt.backends.slurm.elastic``, by the launcher's interpreter, as the
    conclusion) in place of the srun step of every node; it runs that srun line once per node. Unchanged for any
    other job."""
    if plan.elastic is None:
        return script
    # --nodes=MIN-MAX alone gets MIN (slurm-wlm 22.05): MAX tasks, one node's CPUs each (--overcommit: CPUs per
    # node, not per task), get MAX nodes where they are free, and fewer where not
    elastic = [
        f"#SBATCH --nodes={plan.elastic.min_nodes}-{plan.elastic.max_nodes}",
        f"#SBATCH --ntasks={plan.num_nodes}",
        "#SBATCH --overcommit",
    ]
    head = [f"#SBATCH --nodes={plan.num_nodes}", "#SBATCH --ntasks-per-node=1"]
    script = "\n".join(line for line in script.split("\n") if line not in head[1:])
    script = script.replace(f"{head[0]}\n", "\n".join(elastic) + "\n", 1)
    lines = script.split("\n")
    at = next(index for index, line in enumerate(lines) if line.lstrip().startswith("srun "))
    indent = lines[at][: len(lines[at]) - len(lines[at].lstrip())]
    lines[at] = f"{indent}{shlex.quote(sys.executable)} -u -m mmt.backends.slurm.elastic {lines[at].lstrip()}"
    return "\n".join(lines)


def with_mmt_lines(
    script: str, plan: JobPlan, settings: SlurmSettings, project_dir: str, attempt: Union[Attempt, TaskTarget]
) -> str:
    """mmt's own lines around submitit's srun: the OCI container, the heterogeneous components, the restart loop,
    an elastic job's coordinator."""
    script = with_het_components(with_container(script, plan, settings, attempt), plan, settings, project_dir)
    return with_elastic_coordinator(with_restart_loop(script, plan, attempt), plan)


def job_name_for(name: str) -> str:
    """SLURM's name for the job registered as ``name`` (unique while it is registered)."""
    return f"mmt-{name}"
