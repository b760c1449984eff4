"""The SLURM backend: each mmt job becomes one SLURM job of N nodes, submitted through submitit.

Submitting returns at once; polling reads the job's attempt dir on the shared filesystem (every call: a job whose
processes have all reported success is done without waiting for SLURM's epilog) and asks SLURM itself every
``poll_interval_s`` (``queue``). A job cancelled, killed or timed out outside is reported as such, never waited on.
Why a job waits in the queue is shown (a notice, and the attempt's ``scheduler.json`` that ``mmt list`` and the live
page read); a job that can never start (``pending``) is cancelled at once and FAILED, saying what it asks and what
its partition offers; and a scheduler that stops answering is said so, with since when.
"""

import dataclasses
import functools
import os
import secrets
import shlex
import shutil
import time
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Dict, Iterator, List, Optional, Sequence, Tuple

from mmt.backends.base import Submission
from mmt.backends.scheduled import STOP_RETRY_S, ScheduledBackend, ScheduledJob
from mmt.backends.slurm import oci, over_ssh, pending, queue, records
from mmt.backends.slurm.conclusion import conclude
from mmt.backends.slurm.nodes import lost_by_run, lost_in_run, lost_node_detail, node_fail_kwargs
from mmt.backends.slurm.sbatch import (
    SlurmSettings,
    TaskTarget,
    job_name_for,
    oci_command,
    python_command,
    render_script,
    sbatch_parameters,
    signal_delay_problem,
    task_command,
    tasks_per_node,
    with_mmt_lines,
)
from mmt.backends.slurm.task import (
    FRAMEWORK_PORT_BASE,
    FRAMEWORK_PORT_SLOTS,
    FRAMEWORK_PORT_WINDOW,
    SlurmTask,
    run_array_task_file,
    run_task_file,
    write_task_file,
)
from mmt.core.errors import ConfigError, MMTError
from mmt.core.jobdir import JobDir, make_private_dir, write_atomic
from mmt.core.states import JobState
from mmt.planning.plan import JobPlan
from mmt.records.outcome import JobOutcome
from mmt.records.payload import read_plan
from mmt.records.registry import JobRecord
from mmt.records.scheduler import SchedulerRecord, clock, read_scheduler, write_scheduler
from mmt.records.schema import OwnerRecord

_TOOLS = ("sbatch", "squeue", "scancel", "scontrol")


@dataclass(kw_only=True)
class SlurmJob(ScheduledJob):
    job_id: str
    stderr: Path
    final_state: Optional[str] = None
    # the scheduler's view of the job as last written to its attempt dir (scheduler.json)
    view: Optional[SchedulerRecord] = None

    @property
    def scheduler_id(self) -> str:
        return self.job_id


@dataclass
class _Asked:
    """What SLURM's queries told so far: each job's last state, whether accounting answers, and the daemon that did
    not answer the last query (and since when), as said in a notice."""

    states: Dict[str, queue.SlurmState] = field(default_factory=dict)
    accounting: Optional[bool] = None
    unanswered: Optional[str] = None
    since: Optional[float] = None


# seconds between two asks to cancel a job that slurmctld did not take
CANCEL_RETRY_S = STOP_RETRY_S


class SubmissionRefused(MMTError):
    """sbatch refused a job: what SLURM said, what the job asks and what the partition offers, on one line."""


def job_name(plan: JobPlan) -> str:
    return job_name_for(plan.name)


@contextmanager
def _private_files() -> Iterator[None]:
    """submitit's pickles hold the job's config and copied secrets: created readable by the owner only."""
    previous = os.umask(0o077)
    try:
        yield
    finally:
        os.umask(previous)


_EXECUTOR: Any = None


def _executor_class() -> Any:
    """submitit's SlurmExecutor, with sbatch run in a session of its own: the terminal's Ctrl-C reaches the
    launcher's whole process group, and an sbatch killed after slurmctld accepted the job, before it printed the
    id, would leave a job that nobody knows of (the launcher itself takes the Ctrl-C, and stops what it submitted)."""
    global _EXECUTOR
    if _EXECUTOR is None:
        import submitit  # lazy: only cluster=slurm needs it

        setsid = shutil.which("setsid")

        class SessionSlurmExecutor(submitit.SlurmExecutor):
            # the job's plan and attempt, for mmt's own lines around submitit's srun (the restart loop)
            mmt_job: Optional[Tuple[JobPlan, TaskTarget]] = None
            mmt_settings: SlurmSettings
            mmt_project_dir: str

            def _make_submission_command(self, submission_file_path: Path) -> List[str]:
                command = super()._make_submission_command(submission_file_path)
                return [setsid, *command] if setsid else command

            @property
            def _submitit_command_str(self) -> str:
                # the tasks run mmt's task runner on the attempt's task file, not submitit's (see mmt...task)
                if self.mmt_job is None:
                    return str(super()._submitit_command_str)
                plan, attempt = self.mmt_job
                return task_command(plan, self.mmt_settings, self.mmt_project_dir, attempt)

            def _make_submission_file_text(self, command: str, uid: str) -> str:
                text = super()._make_submission_file_text(command, uid)
                if self.mmt_job is None:
                    return text
                plan, target = self.mmt_job
                return with_mmt_lines(text, plan, self.mmt_settings, self.mmt_project_dir, target)

        _EXECUTOR = SessionSlurmExecutor
    return _EXECUTOR


def _elastic_problems(plan: JobPlan, settings: SlurmSettings) -> List[ConfigError]:
    """An elastic job runs a node agent per node, each in a step of its own (``mmt.backends.slurm.elastic``)."""
    if plan.elastic is None:
        return []
    if not settings.agent_per_node:
        return [
            ConfigError(
                "hydra.launcher.tasks",
                settings.tasks,
                f"an elastic job (num_nodes={plan.elastic.label}) runs one node agent per node, which forks the "
                "node's ranks again as its world changes",
                "use hydra.launcher.tasks=per_node",
            )
        ]
    if plan.image is not None and settings.container_runtime == "oci":
        return [
            ConfigError(
                "hydra.launcher.container_runtime",
                settings.container_runtime,
                f"an elastic job (num_nodes={plan.elastic.label}) runs each node in a step of its own: its image "
                "with pyxis or apptainer, not SLURM's OCI containers",
                "use hydra.launcher.container_runtime=pyxis or apptainer",
            )
        ]
    return []


def _roles_problems(plan: JobPlan, settings: SlurmSettings) -> List[ConfigError]:
    """A job with roles runs as one heterogeneous job of node agents, each role's in its image or here."""
    if not plan.roles:
        return []
    names = ", ".join(role.name for role in plan.roles)
    if not settings.agent_per_node:
        return [
            ConfigError(
                "hydra.launcher.tasks",
                settings.tasks,
                f"a job with roles ({names}) runs one node agent per node, which starts its role's ranks",
                "use hydra.launcher.tasks=per_node",
            )
        ]
    if plan.images and settings.container_runtime == "oci":
        role = next(role for role in plan.roles if role.image is not None)
        return [
            ConfigError(
                f"roles.{role.name}.image",
                role.image,
                f"a job with roles ({names}) runs its roles' images with pyxis or apptainer: SLURM's OCI containers "
                "give a task no SLURM_PROCID, by which a role's node agent finds its role",
                "use hydra.launcher.container_runtime=pyxis (or apptainer), or run the roles in this environment",
            )
        ]
    return []


class SlurmBackend(ScheduledBackend[SlurmJob, SlurmSettings], name="slurm", settings=SlurmSettings, records=records):
    """One SLURM job of N nodes per mmt job, through submitit; it watches the jobs it registered too."""

    # a job with roles: one heterogeneous job, a component per role (sbatch.with_het_components)
    runs_roles = True
    runs_elastic = True

    def __init__(self, settings: SlurmSettings) -> None:
        super().__init__(settings)
        self._asked = _Asked()

    # ------------------------------------------------------------------------------------------ over SSH

    runs_over_ssh = True

    def plan_over_ssh(self) -> None:
        self.settings = dataclasses.replace(self.settings, over_ssh=True)

    def settings_there(self, local_sweep_dir: str, remote_sweep_dir: str) -> SlurmSettings:
        return over_ssh.settings_there(self.settings, local_sweep_dir, remote_sweep_dir)

    # ------------------------------------------------------------------------------------------ planning

    def problems(self, plan: JobPlan) -> List[ConfigError]:
        found = _roles_problems(plan, self.settings) + _elastic_problems(plan, self.settings)
        if plan.framework == "tensorflow" and plan.processes_per_node > FRAMEWORK_PORT_WINDOW:
            found.append(
                ConfigError(
                    "hydra.launcher.framework",
                    plan.framework,
                    f"on SLURM each TensorFlow worker's port derives from "
                    f"the job id, from a window of {FRAMEWORK_PORT_WINDOW} per job: at most {FRAMEWORK_PORT_WINDOW} "
                    f"workers per node, not {plan.processes_per_node}",
                    "use fewer devices per node and more nodes",
                )
            )
        if plan.image is not None and self.settings.container_runtime == "oci":
            found += oci.image_problems(plan, self.settings.container_mounts, os.environ.get("SLURM_CONF"))
            if not self.settings.agent_per_node:
                found.append(
                    ConfigError(
                        "hydra.launcher.tasks",
                        self.settings.tasks,
                        "SLURM runs one container task per node (srun --container refuses more)",
                        "use hydra.launcher.tasks=per_node: the node agent starts the node's ranks",
                    )
                )
        delay = signal_delay_problem(plan, self.settings)
        if delay is not None:
            found.append(delay)
        missing = [] if self.settings.over_ssh else [tool for tool in _TOOLS if shutil.which(tool) is None]
        if missing:
            found.append(
                ConfigError(
                    "cluster",
                    "slurm",
                    f"SLURM's commands are not on PATH ({', '.join(missing)} missing)",
                    "run on a SLURM login node, or start the local test cluster: "
                    'scripts/slurm_cluster.sh start && eval "$(scripts/slurm_cluster.sh env)"',
                )
            )
        return found

    def describe(self, plan: JobPlan) -> List[str]:
        attempt = JobDir(Path(plan.job_dir)).attempt("<attempt>")
        script = render_script(plan, self.settings, self.project_dir, job_name(plan), attempt)
        srun = next(line.strip() for line in script.splitlines() if line.strip().startswith("srun "))
        layout = (
            "one task per node: the node agent forks the node's ranks"
            if self.settings.agent_per_node
            else "one task per rank"
        )
        lines = [
            f"  backend    slurm: {tasks_per_node(plan, self.settings)} task(s) per node ({layout}); "
            "MASTER_ADDR=<first node of the allocation>, MASTER_PORT=10000 + job id % 20000 (held by node 0)",
            f"  srun       {srun}",
            "  sbatch script:",
        ]
        if oci_command(plan, self.settings):
            # the node agent runs on the host; each rank's command in a container step of its own (mmt...oci)
            bundle = attempt.dir / oci.BUNDLE
            argv = oci.rank_exec(bundle, "<node 0>", "<job id>", os.environ.get("SLURM_CONF"))
            lines.insert(2, f"  container  node 0, each rank: {shlex.join([*argv, 'sh', '-c', str(plan.command)])}")
        if plan.framework_port_count:
            lines.insert(
                1,
                f"  framework  {plan.framework}: {plan.framework_port_count} port(s) = "
                f"{FRAMEWORK_PORT_BASE} + (job id % {FRAMEWORK_PORT_SLOTS}) x {FRAMEWORK_PORT_WINDOW} + "
                f"process % {FRAMEWORK_PORT_WINDOW}, each held by its node's agent",
            )
        throttle = self.settings.max_parallel_jobs
        if plan.roles:
            lines.insert(
                -1,
                "  roles      one heterogeneous job: a component per role (#SBATCH hetjob), the primary's first; one "
                "srun step over all of them (--het-group), each role's MASTER_PORT and port = 10000 + (job id x 8 + "
                "2 x role) % 19999 (+1), held by the role's first node",
            )
        else:
            lines.insert(
                -1,
                "  array      the launch's jobs that share this script go out as one job array (#SBATCH "
                "--array=0-<n-1>"
                + (f"%{throttle}: at most {throttle} of its tasks at once" if throttle else "")
                + "), job i as task <array id>_i",
            )
        if plan.after:
            lines.insert(
                -1,
                f"  after      starts once every job of {', '.join(plan.after)} has completed (#SBATCH "
                "--dependency=afterok:<their SLURM job ids> --kill-on-invalid-dep=yes); CANCELLED if one does not",
            )
        lines += [f"    | {line}" for line in script.rstrip().splitlines()]
        unwatched = self._unwatched(plan)
        if unwatched:
            lines.append(f"  WARNING    {unwatched}")
        return lines + [f"  WARNING    {problem}" for problem in self.problems(plan)]

    def _unwatched(self, plan: JobPlan) -> Optional[str]:
        """Hang detection is the node agents' (each watches the whole job); per-rank tasks run none, so a job
        there is not watched: said in the dry run and at submission, never refused (a recipe may turn it on)."""
        if plan.hang_timeout_s is None or self.settings.agent_per_node:
            return None
        return (
            f"hydra.launcher.hang_timeout_min={plan.hang_timeout_s / 60:g} is not watched with "
            "hydra.launcher.tasks=per_rank, which runs no node agent: only the time limit ends a hung job "
            "(tasks=per_node watches it)"
        )

    def owner_active(self, owner: OwnerRecord) -> bool:
        job_id = owner.scheduler_id
        return bool(job_id) and queue.is_active(str(job_id)) is not False

    # ------------------------------------------------------------------------------------------ the interface

    def submit(self, submission: Submission) -> SlurmJob:
        [(_, job)] = self._submit_group([submission])
        return job

    def submit_all(self, submissions: Sequence[Submission]) -> Iterator[List[Tuple[Submission, SlurmJob]]]:
        """One sbatch per group of jobs that share their sbatch script but for the job itself (nodes, tasks,
        resources, time, partition, image, setup, dependencies ...): a job array, each of its tasks one whole
        multi-node job; split where a group is larger than the cluster's MaxArraySize. A job alone in its group
        goes out as a job of its own."""
        self._refuse_foreign_dependencies(submissions)
        for group in self._groups(submissions):
            yield self._submit_group(group)

    def _groups(self, submissions: Sequence[Submission]) -> List[List[Submission]]:
        groups: Dict[str, List[Submission]] = {}
        for submission in submissions:
            key = render_script(
                submission.plan,
                self.settings,
                self.project_dir,
                "<job>",
                TaskTarget(manifest=Path("<manifest>")),
                self._after(submission),
            )
            # a heterogeneous job cannot be a job array's task, nor an elastic one (its coordinator runs in its
            # batch script, for its own job): one sbatch each
            if submission.plan.roles or submission.plan.elastic is not None:
                key = f"{key}\n# {submission.plan.job_id}"
            groups.setdefault(key, []).append(submission)
        # MaxArraySize: indices below it (0: the site allows no job arrays); None when it cannot be asked
        largest = queue.max_array_size() if any(len(group) > 1 for group in groups.values()) else None
        size = max(1, 1000 if largest is None else largest)
        return [group[start : start + size] for group in groups.values() for start in range(0, len(group), size)]

    def _after(self, submission: Submission) -> Tuple[str, ...]:
        return tuple(str(dep.scheduler_id) for dep in submission.after)

    def _refuse_foreign_dependencies(self, submissions: Sequence[Submission]) -> None:
        """SLURM can make a job wait only for SLURM jobs (``--dependency``): refused before any sbatch runs."""
        for submission in submissions:
            for dep in submission.after:
                if dep.backend != self.name or not dep.scheduler_id:
                    raise ConfigError(
                        "hydra.launcher.after",
                        dep.name,
                        f"a SLURM job can wait only for SLURM jobs, and {dep.name} runs on cluster={dep.backend}",
                        "wait for it first (mmt wait), then launch without it in hydra.launcher.after",
                    )

    def _submit_group(self, group: List[Submission]) -> List[Tuple[Submission, SlurmJob]]:
        """Submit one job, or one job array of every job of ``group`` (task i runs ``group[i]``)."""
        first = group[0].plan
        array = len(group) > 1
        # SLURM opens the tasks' logs in a dir that must be there: one per job (%j) is made by submitit before its
        # sbatch, one per array task cannot be (its id is unknown until then): an array's logs share the root
        root = Path(self.settings.folder.split("%j")[0])
        folder = str(root) if array else self.settings.folder
        make_private_dir(root)
        if array:
            manifest = root / f"array-{secrets.token_hex(6)}.tasks"
            target = TaskTarget(manifest=manifest)
            name = job_name_for(f"{first.name}-array")
        else:
            target, name = TaskTarget(attempt=group[0].attempt), job_name(first)
        executor = _executor_class()(
            folder=folder,
            max_num_timeout=0,
            python=python_command(first, self.settings, self.project_dir),
        )
        executor.update_parameters(
            **sbatch_parameters(first, self.settings, self.project_dir, name, target, self._after(group[0]))
        )
        if array:
            # submitit's own array parameters: --array=0-<n-1>%<at once>, and %A_%a in the task logs' names
            executor.parameters["map_count"] = len(group)
            executor.parameters["array_parallelism"] = self.settings.max_parallel_jobs or len(group)
        executor.mmt_job = (first, target)
        executor.mmt_settings, executor.mmt_project_dir = self.settings, self.project_dir
        asked_at = time.time()
        with _private_files():
            task_files = [write_task_file(self._task(submission)) for submission in group]
            if first.image is not None and self.settings.container_runtime == "oci":
                for submission in group:
                    oci.derive(
                        submission.plan, self.settings.container_mounts, self.project_dir, submission.attempt.dir
                    )
            if array:
                write_atomic(manifest, "".join(f"{s.attempt.dir}\n" for s in group).encode(), private=True)
                for index, submission in enumerate(group):
                    records.write_array_task(submission.attempt, name, index)
                call = functools.partial(run_array_task_file, str(manifest))
            else:
                call = functools.partial(run_task_file, str(task_files[0]))
            try:
                submitted = executor.submit(call)
            except Exception as exc:  # noqa: BLE001 - submitit's and sbatch's errors, named below or raised as they are
                if _unanswered(exc):
                    raise _created_anyway(first, asked_at, name) from None
                refused = _refusal(exc, first, self.settings)
                if refused is None:
                    raise
                raise refused from None
        from submitit.core.utils import JobPaths  # lazy, as submitit itself

        ids = [f"{submitted.job_id}_{index}" for index in range(len(group))] if array else [str(submitted.job_id)]
        accepted = []
        for submission, job_id in zip(group, ids):
            paths = JobPaths(folder, job_id=job_id, task_id=0)
            job = SlurmJob(submission=submission, job_id=job_id, stderr=Path(paths.stderr), submitted=time.monotonic())
            self._watched.append(job)
            accepted.append((submission, job))
            self._announce(submission.plan, job, paths.folder, array)
        if array:
            self._announce_array(group, str(submitted.job_id), folder)
        return accepted

    def _task(self, submission: Submission) -> SlurmTask:
        return SlurmTask(
            plan=submission.plan,
            attempt_dir=str(submission.attempt.dir),
            per_node_tasks=self.settings.agent_per_node,
            kill_grace_s=self.settings.kill_grace_s,
            start_method=self.settings.start_method,
            max_requeues=self.settings.max_requeues,
            copied_env=dict(submission.copied_env),
            oci_bundle=str(submission.attempt.dir / oci.BUNDLE)
            if oci_command(submission.plan, self.settings)
            else None,
        )

    def _announce(self, plan: JobPlan, job: SlurmJob, folder: Path, array: bool) -> None:
        unwatched = self._unwatched(plan)
        if unwatched:
            self._notices.append(f"mmt: job {plan.num} ({plan.name}): {unwatched}")
        if not array:
            self._notices.append(
                f"mmt: job {plan.num} ({plan.name}) submitted as SLURM job {job.job_id} "
                f"({plan.num_nodes} nodes x {tasks_per_node(plan, self.settings)} tasks); sbatch script "
                f"and task logs: {folder}"
            )

    def _announce_array(self, group: List[Submission], array_id: str, folder: str) -> None:
        """One line for a job array, however many jobs it runs: job i is its task <array>_i."""
        plan, throttle = group[0].plan, self.settings.max_parallel_jobs
        at_once = f", at most {throttle} at once" if throttle and throttle < len(group) else ""
        nums = queue.index_ranges(submission.plan.num for submission in group)
        self._notices.append(
            f"mmt: jobs {nums} submitted as SLURM job array {array_id} (job {plan.num} is task {array_id}_0 ...; "
            f"{len(group)} tasks of {plan.num_nodes} nodes x {tasks_per_node(plan, self.settings)} tasks{at_once}); "
            f"sbatch script and task logs: {folder}"
        )

    def attach(self, record: JobRecord) -> SlurmJob:
        """A job another process submitted, watched from here (``mmt wait``)."""
        attempt = JobDir(Path(record.job_dir)).attempt(record.attempt)
        job = SlurmJob(
            submission=Submission(plan=read_plan(attempt), attempt=attempt),
            job_id=str(record.scheduler_id),
            stderr=Path("/nonexistent"),
            submitted=time.monotonic(),
        )
        self._watched.append(job)
        self._next_query = 0.0
        return job

    def _silent(self, job: SlurmJob) -> Optional[str]:
        # a cancel slurmctld has not taken: the job runs on inside its allocation, and concludes itself there
        if job.stop_due is None:
            return None
        return f"slurmctld did not take the cancel of SLURM job {job.job_id}; check with `squeue -j {job.job_id}`"

    def _record_stop(self, job: SlurmJob, reason: str) -> None:
        self._write_view(job, replace(self._view(job), stopped_because=reason))

    def kill(self, handle: SlurmJob) -> None:
        if handle.outcome is None and not queue.cancel([handle.job_id], signal_name="KILL"):
            handle.stop_due = handle.stop_due or time.monotonic()  # the plain cancel is asked again

    def _send_stop(self, job: SlurmJob) -> Optional[str]:
        return None if queue.cancel([job.job_id]) else "scancel failed"

    def _stop_taken(self, job: SlurmJob) -> None:
        if job.stop_due is not None:
            self._notices.append(f"mmt: SLURM job {job.job_id} cancelled (slurmctld answers again)")
        self._write_view(job, self._view(job).stop_sent())

    def _stop_not_taken(self, job: SlurmJob, why: str) -> str:
        return (
            f"mmt: slurmctld did not take the cancel of SLURM job {job.job_id} ({job.plan.name}); asking again "
            f"every {CANCEL_RETRY_S:g} s until it does (the job runs on meanwhile)"
        )

    # ------------------------------------------------------------------------------------------ watching

    def _query(self) -> None:
        if self._asked.accounting is None:
            self._asked.accounting = queue.accounting_available()
        jobs = [job for job in self._watched if job.outcome is None]
        answer = queue.query([job.job_id for job in jobs], accounting=self._asked.accounting)
        self._asked.states.update(answer.states)
        self._next_query = time.monotonic() + self.settings.poll_interval_s
        if jobs:
            self._answered(jobs, answer)

    def _answered(self, jobs: List[SlurmJob], answer: queue.Answer) -> None:
        """Say once that a daemon stopped answering (and once that it answers again), and keep each job's
        scheduler.json saying so: a state that does not change is then one the scheduler cannot tell, not a hang."""
        who = answer.unanswered
        if who != self._asked.unanswered:
            if who is not None:
                self._asked.since = time.time()
                self._notices.append(
                    f"mmt: {who} is not answering ({_ASKED_WITH[who]} failed) since "
                    f"{time.strftime('%H:%M:%S')}; the jobs' states are the last ones seen until it "
                    "answers"
                )
            elif self._asked.unanswered is not None:
                self._notices.append(
                    f"mmt: {self._asked.unanswered} answers again (it did not since "
                    f"{clock(self._asked.since or time.time())})"
                )
            self._asked.unanswered = who
        for job in jobs:
            if who is not None and job.job_id not in answer.states:
                self._write_view(job, self._view(job).unanswered(who, now=self._asked.since))

    def _update(self, job: SlurmJob) -> None:
        now = time.monotonic()
        state = self._asked.states.get(job.job_id)
        if state is not None:
            self._note_queue(job, state)
            if job.outcome is not None:  # it can never start: cancelled and concluded
                return
            if state.state == "RUNNING" and job.started is None:
                job.started = now
                if job.state == JobState.PENDING:
                    job.state = JobState.RUNNING
            if state.restarts > job.restarts:
                job.restarts = state.restarts
                lost, hosts = lost_by_run(job.job_id, state.restarts - 1)
                lost = lost_in_run(job.plan, job.attempt, lost, hosts)
                what = (
                    f": {lost_node_detail(job.plan, job.attempt, job.job_id, lost, hosts)}; SLURM requeued it"
                    if lost
                    else " was requeued"
                )
                self._notices.append(
                    f"mmt: job {job.plan.num} (SLURM {job.job_id}){what} (restart {state.restarts}); it resumes in "
                    f"{job.plan.job_dir}"
                )
        self._note_world_changes(job)
        if self._completed(job, now):  # SLURM still runs the job's epilog for a second or more: nothing it changes
            return
        if (
            (state is None or not state.final)
            and self._asked.unanswered is not None
            and self._concluded_itself(job, now)
        ):
            return
        if state is None or not state.final:
            return
        job.final_state = state.state
        never = read_scheduler(job.attempt)
        if never is not None and never.never_starts and job.stopped_because is None:
            # another process (`mmt list`) found it could never start, and cancelled it: FAILED, saying why
            self._conclude(
                job,
                JobOutcome(JobState.FAILED, now - job.submitted, detail=never.message or "", scheduler_id=job.job_id),
            )
            return
        self._conclude(
            job,
            conclude(
                job.plan,
                job.attempt,
                scheduler_id=job.job_id,
                duration_s=now - (job.started or job.submitted),
                slurm_state=job.final_state,
                stopped_because=job.stopped_because,
                stderr=job.stderr,
                **node_fail_kwargs(job.job_id, job.final_state),
            ),
        )

    def _note_queue(self, job: SlurmJob, state: queue.SlurmState) -> None:
        """Why the job waits, shown once per reason (a notice, scheduler.json); a reason that never resolves
        cancels the job and concludes it FAILED with the one line of :mod:`pending`."""
        if state.final:
            return
        reason = state.reason if state.state == "PENDING" else None
        view = self._view(job)
        self._write_view(job, view.seen(state.state, reason, pending.explain(reason) if reason else None))
        if reason == job.reason:
            return
        job.reason = reason
        if reason is None or job.stopped_because is not None:
            return
        message = pending.check(job.job_id, reason, waits_for_jobs=bool(job.plan.after))
        if message is None:
            if reason in pending.THROTTLED:
                return  # the throttle asked for (said when the array was submitted), in every job's scheduler.json
            self._notices.append(
                f"mmt: job {job.plan.num} ({job.plan.name}) waits in SLURM's queue (job "
                f"{job.job_id}): {pending.describe(reason)}"
            )
            return
        # recorded before the cancel: whoever sees the job CANCELLED next (`mmt list`) concludes it FAILED, saying why
        self._write_view(job, replace(self._view(job), never_starts=True, message=message))
        queue.cancel([job.job_id])
        self._conclude(
            job, JobOutcome(JobState.FAILED, time.monotonic() - job.submitted, detail=message, scheduler_id=job.job_id)
        )

    def _view(self, job: SlurmJob) -> SchedulerRecord:
        if job.view is None:
            job.view = read_scheduler(job.attempt) or SchedulerRecord(scheduler_id=job.job_id)
        return job.view

    def _write_view(self, job: SlurmJob, view: SchedulerRecord) -> None:
        write_scheduler(job.attempt, view, job.view)
        job.view = view

    def _concluded_itself(self, job: SlurmJob, now: float, fallback_duration: Optional[float] = None) -> bool:
        """While SLURM does not answer: the job's own last step may have concluded it already, inside its allocation
        (``finalized``, result.json of this attempt): conclude it from that instead of waiting in silence."""
        own = self._own_conclusion(job)
        if own is None:
            return False
        self._notices.append(
            f"mmt: job {job.plan.num} ({job.plan.name}): {self._asked.unanswered} is not answering; the job concluded "
            f"itself inside its allocation: {own.status.value}"
        )
        return super()._concluded_itself(job, now, now - job.submitted)


_ASKED_WITH = {"slurmctld": "squeue", "slurmdbd": "sacct"}


# what sbatch says when slurmctld did not answer in time: the request may still be taken later, creating a job
_NO_ANSWER = ("Socket timed out", "Unable to contact slurm controller", "Transport endpoint is not connected")
# how long a submission that timed out looks for the job slurmctld may have created anyway
LOOKUP_AFTER_TIMEOUT_S = 120.0


def _unanswered(exc: Exception) -> bool:
    from submitit.core.utils import FailedJobError  # lazy, as submitit itself

    return isinstance(exc, FailedJobError) and any(said in str(exc) for said in _NO_ANSWER)


def _created_anyway(plan: JobPlan, asked_at: float, name: str) -> SubmissionRefused:
    """sbatch gave up waiting for slurmctld, which may still create the job once it catches up, with nobody to know
    of it (submitit never learnt its id, so its task could not even find its pickle). Look for it by its unique name
    until slurmctld answers, and cancel it: the submission failed, and says so in one line, leaving nothing queued."""
    deadline, found, answered = time.monotonic() + LOOKUP_AFTER_TIMEOUT_S, None, 0
    while time.monotonic() < deadline:
        found = queue.latest_job_named(name, asked_at)
        if found:
            break
        if found == "":  # the queue answered without it; twice, so a request still in flight has been taken
            answered += 1
            if answered >= 2:
                break
        time.sleep(2.0)
    said = "sbatch gave up waiting for slurmctld (it did not answer in time)"
    hint = "submit again once `squeue` answers"
    if found:
        while not queue.cancel([found]) and time.monotonic() < deadline:
            time.sleep(2.0)
        return SubmissionRefused(
            f"job {plan.num} ({plan.name}): {said}; the SLURM job it created anyway ({found}) was cancelled, nothing "
            f"is left queued. HINT: {hint}"
        )
    if answered:
        return SubmissionRefused(f"job {plan.num} ({plan.name}): {said}; no job was created. HINT: {hint}")
    return SubmissionRefused(
        f"job {plan.num} ({plan.name}): {said}, and it still does not answer after "
        f"{LOOKUP_AFTER_TIMEOUT_S:.0f} s: a job it takes later would run without mmt. HINT: once it answers, "
        f"`scancel --name={name}`, then {hint}"
    )


def _refusal(exc: Exception, plan: JobPlan, settings: SlurmSettings) -> Optional[SubmissionRefused]:
    """sbatch's refusal (submitit's FailedJobError, its stderr) as one line naming what the job asks and what the
    partition offers; None for any other error."""
    from submitit.core.utils import FailedJobError  # lazy, as submitit itself

    if not isinstance(exc, FailedJobError):
        return None
    said = [line.split("error:", 1)[-1].strip() for line in str(exc).splitlines() if line.strip()]
    partition = settings.partition or queue.default_partition()
    offered = (
        pending.offers(partition, queue.partition_facts(partition), queue.node_kinds(partition))
        if partition
        else "the default partition could not be found (sinfo)"
    )
    cpus = settings.cpus_per_task or (
        max(1, plan.machine.cpus // tasks_per_node(plan, settings)) if plan.machine.cpus else None
    )
    asked = (
        f"{plan.num_nodes} node(s) x {tasks_per_node(plan, settings)} task(s)"
        + (f" x {cpus} CPUs" if cpus else "")
        + (f", {settings.mem_gb} GB per node" if settings.mem_gb else "")
        + (
            f", {settings.gpus_per_node or plan.machine.gpus} GPUs per node"
            if (settings.gpus_per_node or plan.machine.gpus)
            else ""
        )
        + f" (machine {plan.machine.name})"
    )
    return SubmissionRefused(
        f"{plan.label}: sbatch refused it: {'; '.join(said) or exc}; it asks {asked}; {offered}. HINT: {pending.HINT}"
    )
