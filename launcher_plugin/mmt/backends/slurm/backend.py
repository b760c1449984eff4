"""The SLURM backend: each mmt job becomes one SLURM job of N nodes, submitted through submitit.

Submitting returns at once; polling reads the job's attempt dir on the shared filesystem (every call: a job whose
processes have all reported success is done without waiting for SLURM's epilog) and asks SLURM itself every
``poll_interval_s`` (``queue``). A job cancelled, killed or timed out outside is reported as such, never waited on.
"""

import os
import shutil
import time
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict, Iterator, List, Optional

from mmt.backends.base import Backend, JobHandle, JobSnapshot, Submission, Watcher

from mmt.records.outcome import JobOutcome

from mmt.core.states import JobState
from mmt.backends.slurm import queue
from mmt.backends.slurm.conclusion import conclude
from mmt.backends.slurm import records
from mmt.backends.slurm.sbatch import (SlurmSettings, job_name_for, python_command, render_script, sbatch_parameters,
                                         tasks_per_node)
from mmt.backends.slurm.task import (FRAMEWORK_PORT_BASE, FRAMEWORK_PORT_SLOTS, FRAMEWORK_PORT_WINDOW,
                                     SlurmTask)
from mmt.core.errors import ConfigError
from mmt.core.jobdir import Attempt, JobDir, make_private_dir
from mmt.records.outcome import all_succeeded
from mmt.planning.plan import JobPlan, Limits
from mmt.records.payload import read_plan
from mmt.records.registry import JobRecord, Registry
from mmt.records.schema import OwnerRecord
from omegaconf import DictConfig

_TOOLS = ("sbatch", "squeue", "scancel", "scontrol")


@dataclass
class SlurmJob(JobHandle):
    submission: Submission
    job_id: str
    stderr: Path
    submitted: float
    state: JobState = JobState.PENDING
    started: Optional[float] = None
    restarts: int = 0
    stopped_because: Optional[str] = None
    final_state: Optional[str] = None
    outcome: Optional[JobOutcome] = None


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

        class SessionSlurmExecutor(submitit.SlurmExecutor):  # type: ignore[misc]
            def _make_submission_command(self, submission_file_path: Path) -> List[str]:
                command = super()._make_submission_command(submission_file_path)
                return [setsid, *command] if setsid else command

        _EXECUTOR = SessionSlurmExecutor
    return _EXECUTOR


class SlurmBackend(Backend[SlurmJob], Watcher[SlurmJob]):
    """One SLURM job of N nodes per mmt job, through submitit; it watches the jobs it registered too."""

    name = "slurm"
    survives_launcher = True

    def __init__(self, settings: SlurmSettings) -> None:
        self.settings = settings
        self.project_dir = os.getcwd()
        self._states: Dict[str, queue.JobState] = {}
        self._next_query = 0.0
        self._accounting: Optional[bool] = None
        self._notices: List[str] = []
        self._watched: List[SlurmJob] = []

    @classmethod
    def from_config(cls, launcher_cfg: DictConfig) -> "SlurmBackend":
        return cls(SlurmSettings.from_config(launcher_cfg))

    @classmethod
    def watcher(cls, poll_interval_s: float = 1.0) -> "SlurmBackend":
        return cls(SlurmSettings.for_watching(poll_interval_s))

    @classmethod
    def refresh(cls, record: JobRecord, registry: Registry) -> JobRecord:
        return records.refresh(record, registry)

    @classmethod
    def stop(cls, record: JobRecord) -> str:
        return records.stop(record)

    # ------------------------------------------------------------------------------------------ planning

    @property
    def limits(self) -> Limits:
        return Limits(max_nodes=100_000, max_devices=1_024, max_world=10_000_000,
                      why="mmt's bound for one SLURM job; sbatch refuses what the cluster cannot run")

    def problems(self, plan: JobPlan) -> List[ConfigError]:
        found = []
        if plan.framework == "tensorflow" and plan.processes_per_node > FRAMEWORK_PORT_WINDOW:
            found.append(ConfigError(
                "hydra.launcher.framework", plan.framework, f"on SLURM each TensorFlow worker's port derives from "
                f"the job id, from a window of {FRAMEWORK_PORT_WINDOW} per job: at most {FRAMEWORK_PORT_WINDOW} "
                f"workers per node, not {plan.processes_per_node}", "use fewer devices per node and more nodes"))
        missing = [tool for tool in _TOOLS if shutil.which(tool) is None]
        if missing:
            found.append(ConfigError(
                "cluster", "slurm", f"SLURM's commands are not on PATH ({', '.join(missing)} missing)",
                "run on a SLURM login node, or start the local test cluster: "
                "scripts/slurm_cluster.sh start && eval \"$(scripts/slurm_cluster.sh env)\""))
        return found

    def describe(self, plan: JobPlan) -> List[str]:
        attempt = JobDir(Path(plan.job_dir)).attempt("<attempt>")
        script = render_script(plan, self.settings, self.project_dir, job_name(plan), attempt)
        srun = next(line for line in script.splitlines() if line.startswith("srun "))
        layout = ("one task per node: the node agent forks the node's ranks" if self.settings.agent_per_node
                  else "one task per rank")
        lines = [f"  backend    slurm: {tasks_per_node(plan, self.settings)} task(s) per node ({layout}); "
                 "MASTER_ADDR=<first node of the allocation>, MASTER_PORT=10000 + job id % 20000 (held by node 0)",
                 f"  srun       {srun}", "  sbatch script:"]
        if plan.framework_port_count:
            lines.insert(1, f"  framework  {plan.framework}: {plan.framework_port_count} port(s) = "
                            f"{FRAMEWORK_PORT_BASE} + (job id % {FRAMEWORK_PORT_SLOTS}) x {FRAMEWORK_PORT_WINDOW} + "
                            f"process % {FRAMEWORK_PORT_WINDOW}, each held by its node's agent")
        lines += [f"    | {line}" for line in script.rstrip().splitlines()]
        return lines + [f"  WARNING    {problem}" for problem in self.problems(plan)]

    def owner_active(self, owner: OwnerRecord) -> bool:
        job_id = owner.scheduler_id
        return bool(job_id) and queue.is_active(str(job_id)) is not False

    # ------------------------------------------------------------------------------------------ the interface

    def submit(self, submission: Submission) -> SlurmJob:
        plan = submission.plan
        folder = Path(self.settings.folder.split("%j")[0])
        make_private_dir(folder)
        executor = _executor_class()(folder=self.settings.folder, max_num_timeout=0,
                                     python=python_command(plan, self.settings, self.project_dir))
        executor.update_parameters(**sbatch_parameters(plan, self.settings, self.project_dir, job_name(plan),
                                                       submission.attempt))
        task = SlurmTask(plan=plan, attempt_dir=str(submission.attempt.dir),
                         per_node_tasks=self.settings.agent_per_node, kill_grace_s=self.settings.kill_grace_s,
                         start_method=self.settings.start_method, max_requeues=self.settings.max_requeues,
                         copied_env=dict(submission.copied_env))
        with _private_files():
            submitted = executor.submit(task)
        job = SlurmJob(submission=submission, job_id=str(submitted.job_id),
                       stderr=Path(str(submitted.paths.stderr).replace("%t", "0")), submitted=time.monotonic())
        self._watched.append(job)
        self._notices.append(f"mmt: job {plan.num} ({plan.name}) submitted as SLURM job {job.job_id} "
                             f"({plan.num_nodes} nodes x {tasks_per_node(plan, self.settings)} tasks); sbatch script "
                             f"and task logs: {submitted.paths.folder}")
        return job

    def attach(self, record: JobRecord) -> SlurmJob:
        """A job another process submitted, watched from here (``mmt wait``)."""
        attempt = JobDir(Path(record.job_dir)).attempt(record.attempt)
        job = SlurmJob(submission=Submission(plan=read_plan(attempt), attempt=attempt), job_id=str(record.scheduler_id),
                       stderr=Path("/nonexistent"), submitted=time.monotonic())
        self._watched.append(job)
        self._next_query = 0.0
        return job

    def poll(self, handle: SlurmJob) -> JobSnapshot:
        if handle.outcome is None:
            self._update(handle)
        return JobSnapshot(state=handle.state, scheduler_id=handle.job_id, outcome=handle.outcome)

    def cancel(self, handle: SlurmJob, reason: str) -> None:
        if handle.outcome is None and handle.stopped_because is None:
            handle.stopped_because = reason
            handle.state = JobState.STOPPING
            queue.cancel([handle.job_id])
            self._next_query = 0.0

    def kill(self, handle: SlurmJob) -> None:
        if handle.outcome is None:
            queue.cancel([handle.job_id], signal_name="KILL")

    def wait(self, timeout_s: float) -> None:
        time.sleep(min(timeout_s, 0.1))
        if time.monotonic() >= self._next_query:
            self._query()

    def drain_notices(self) -> List[str]:
        notices, self._notices = self._notices, []
        return notices

    # ------------------------------------------------------------------------------------------ watching

    def _query(self) -> None:
        if self._accounting is None:
            self._accounting = queue.accounting_available()
        ids = [job.job_id for job in self._watched if job.outcome is None]
        self._states.update(queue.job_states(ids, accounting=self._accounting))
        self._next_query = time.monotonic() + self.settings.poll_interval_s

    def _update(self, job: SlurmJob) -> None:
        now = time.monotonic()
        state = self._states.get(job.job_id)
        if state is not None:
            if state.state == "RUNNING" and job.started is None:
                job.started = now
                if job.state == JobState.PENDING:
                    job.state = JobState.RUNNING
            if state.restarts > job.restarts:
                job.restarts = state.restarts
                self._notices.append(f"mmt: job {job.plan.num} (SLURM {job.job_id}) was requeued (restart "
                                     f"{state.restarts}); it resumes in {job.plan.job_dir}")
        if all_succeeded(job.plan, job.attempt):
            # done: SLURM still runs the job's epilog for a second or more, nothing that changes the result
            self._conclude(job, JobOutcome(JobState.COMPLETED, now - (job.started or job.submitted),
                                           scheduler_id=job.job_id))
            return
        if state is None or not state.final:
            return
        job.final_state = state.state
        self._conclude(job, conclude(job.plan, job.attempt, scheduler_id=job.job_id,
                                     duration_s=now - (job.started or job.submitted), slurm_state=job.final_state,
                                     stopped_because=job.stopped_because, stderr=job.stderr))

    def _conclude(self, job: SlurmJob, outcome: JobOutcome) -> None:
        job.outcome, job.state = outcome, outcome.status
        self._watched.remove(job)
