"""The SLURM backend: each sweep job becomes one SLURM job of N nodes x M tasks, submitted through submitit.

The plan, the payload, the worker and the outcome handling are the local backend's; only starting and watching
processes differ. Every task maps SLURM's variables onto the rank contract (``_slurm_task.py``); the launcher
polls the job's state (``_slurm_state.py``), follows rank 0's log on the shared filesystem, and cancels its jobs
on Ctrl-C. A job cancelled, killed or timed out outside is reported as such, never waited on.
"""

import os
import shutil
import signal
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, List, Optional, Sequence, TextIO

from . import _payload, _slurm_state
from ._console import LogFollower
from ._outcome import COMPLETED, FAILED, INTERRUPTED, TIMEOUT, JobOutcome, read_failure
from ._plan import JobPlan
from ._sbatch import SlurmSettings, python_command, render_script, sbatch_parameters
from ._signals import SignalTrap
from ._slurm_task import SlurmTask, failed_tasks
from .errors import ConfigError, RankFailure

# how often the job dirs are read (rank 0's log, outcome files); SLURM itself is asked every poll_interval_s
_TICK_S = 0.1


@dataclass
class _Submitted:
    plan: JobPlan
    job: Any  # submitit.slurm.slurm.SlurmJob
    submitted: float
    followers: List[LogFollower] = field(default_factory=list)
    restarts: int = 0
    started: Optional[float] = None
    outcome: Optional[JobOutcome] = None


def _job_name(plan: JobPlan) -> str:
    return f"mmt-{plan.num}"


class SlurmBackend:
    name = "slurm"

    def __init__(self, settings: SlurmSettings, out: TextIO = sys.stdout) -> None:
        self.settings = settings
        self.out = out
        self.project_dir = os.getcwd()
        self.interrupted_by: Optional[int] = None

    @classmethod
    def from_config(cls, cfg: Any) -> "SlurmBackend":
        return cls(SlurmSettings.from_config(cfg))

    # ------------------------------------------------------------------------------------------ planning

    def describe(self, plan: JobPlan) -> List[str]:
        script = render_script(plan, self.settings, self.project_dir, _job_name(plan))
        srun = next(line for line in script.splitlines() if line.startswith("srun "))
        lines = ["  backend    slurm: MASTER_ADDR=<first node of the allocation>, MASTER_PORT=20000 + job id % 20000",
                 f"  srun       {srun}", "  sbatch script:"]
        return lines + [f"    | {line}" for line in script.rstrip().splitlines()]

    def preflight(self, plans: Sequence[JobPlan]) -> None:
        missing = [tool for tool in ("sbatch", "squeue", "scancel", "scontrol") if shutil.which(tool) is None]
        if missing:
            raise ConfigError("cluster", "slurm", f"SLURM's commands are not on PATH ({', '.join(missing)} missing)",
                              "run on a SLURM login node, or start the local test cluster: "
                              "scripts/slurm_cluster.sh start && eval \"$(scripts/slurm_cluster.sh env)\"")

    # ------------------------------------------------------------------------------------------ running

    def _submit(self, plan: JobPlan) -> _Submitted:
        import submitit  # lazy: only cluster=slurm needs it

        executor = submitit.SlurmExecutor(folder=self.settings.folder, max_num_timeout=0,
                                          python=python_command(plan, self.settings, self.project_dir))
        executor.update_parameters(**sbatch_parameters(plan, self.settings, self.project_dir, _job_name(plan)))
        task = SlurmTask(payload_dir=str(_payload.payload_dir(plan.job_dir)), job_dir=plan.job_dir,
                         job_id=plan.job_id, num_nodes=plan.num_nodes, devices=plan.devices,
                         per_node=plan.per_node, env=dict(plan.env), extra=plan.extra_env(),
                         max_requeues=self.settings.max_requeues)
        job = executor.submit(task)
        submitted = _Submitted(plan=plan, job=job, submitted=time.monotonic())
        rank0 = "node0.log" if task.per_node else "node0.rank0.log"
        submitted.followers.append(LogFollower(Path(plan.job_dir) / "logs" / rank0, f"[#{plan.num} n0 r0] ",
                                               self.out))
        self.out.write(f"mmt: job {plan.num} submitted as SLURM job {job.job_id} ({plan.num_nodes} nodes x "
                       f"{plan.processes_per_node} tasks); sbatch script and task logs: {job.paths.folder}\n")
        self.out.flush()
        return submitted

    def run(self, plans: Sequence[JobPlan]) -> List[JobOutcome]:
        jobs: List[_Submitted] = []
        cancelled_by_us = False
        with SignalTrap() as trap:
            try:
                for plan in plans:
                    if trap.received is not None:
                        break
                    jobs.append(self._submit(plan))
                next_query = 0.0
                while any(j.outcome is None for j in jobs):
                    if trap.received is not None and not cancelled_by_us:
                        self.interrupted_by, cancelled_by_us = trap.received, True
                        _slurm_state.cancel(j.job.job_id for j in jobs if j.outcome is None)
                        next_query = 0.0
                    # the job dirs (logs, outcome files) are read every tick; SLURM is asked every poll_interval_s
                    query = time.monotonic() >= next_query
                    self._poll(jobs, cancelled_by_us, query)
                    if query:
                        next_query = time.monotonic() + self.settings.poll_interval_s
                    if any(j.outcome is None for j in jobs):
                        time.sleep(_TICK_S)
            except BaseException:
                # a second Ctrl-C, or a bug: never leave jobs queued or running behind us
                _slurm_state.cancel(j.job.job_id for j in jobs if j.outcome is None)
                raise
        reason = None if self.interrupted_by is None else \
            f"the launcher received {signal.Signals(self.interrupted_by).name}"
        by_num = {j.plan.num: j.outcome for j in jobs}
        return [by_num.get(plan.num) or JobOutcome(INTERRUPTED, None, detail=f"not submitted: {reason}")
                for plan in plans]

    def _poll(self, jobs: List[_Submitted], cancelled_by_us: bool, query_slurm: bool) -> None:
        states = _slurm_state.job_states(j.job.job_id for j in jobs if j.outcome is None) if query_slurm else {}
        for job in jobs:
            if job.outcome is not None:
                continue
            for follower in job.followers:
                follower.poll()
            if self._every_process_succeeded(job.plan):
                # done: SLURM still runs the job's epilog for a second or more, nothing that changes the result
                for follower in job.followers:
                    follower.finish()
                job.outcome = JobOutcome(COMPLETED, time.monotonic() - (job.started or job.submitted),
                                         scheduler_id=str(job.job.job_id))
                continue
            state = states.get(job.job.job_id)
            if state is None:
                continue
            if state.state == "RUNNING" and job.started is None:
                job.started = time.monotonic()
            if state.restarts > job.restarts:
                job.restarts = state.restarts
                self.out.write(f"mmt: job {job.plan.num} (SLURM {job.job.job_id}) was requeued "
                               f"(restart {state.restarts}); it resumes in {job.plan.job_dir}\n")
            if state.final:
                for follower in job.followers:
                    follower.finish()
                job.outcome = self._outcome(job, state, cancelled_by_us)

    def _outcome(self, job: _Submitted, state: _slurm_state.JobState, cancelled_by_us: bool) -> JobOutcome:
        duration = time.monotonic() - (job.started or job.submitted)
        outcome = JobOutcome(COMPLETED, duration, scheduler_id=str(job.job.job_id))
        if state.state == "COMPLETED" or (state.state == _slurm_state.GONE and self._primary_reported(job.plan)):
            return outcome
        if state.state == "CANCELLED":
            outcome.status = INTERRUPTED
            outcome.detail = (f"stopped: the launcher received {signal.Signals(self.interrupted_by).name}"
                              if cancelled_by_us and self.interrupted_by else
                              f"SLURM job {job.job.job_id} was cancelled outside the launcher (scancel)")
            return outcome
        if state.state == "TIMEOUT":
            outcome.status, outcome.detail = TIMEOUT, f"SLURM job {job.job.job_id} reached its time limit"
            return outcome
        outcome.status = FAILED
        outcome.failure = self._failure(job, state)
        return outcome

    def _every_process_succeeded(self, plan: JobPlan) -> bool:
        directory = _payload.payload_dir(plan.job_dir)
        for index in range(plan.num_nodes * plan.processes_per_node):
            try:
                if _payload.done_path(directory, index).read_text() != "0":
                    return False
            except FileNotFoundError:
                return False
        return self._primary_reported(plan)

    def _primary_reported(self, plan: JobPlan) -> bool:
        directory = _payload.payload_dir(plan.job_dir)
        return _payload.return_path(directory).exists() and not list(directory.glob("proc*.error.json"))

    def _failure(self, job: _Submitted, state: _slurm_state.JobState) -> RankFailure:
        """Which rank failed first: a Python error it reported, else srun's report of the dead task."""
        plan, directory = job.plan, _payload.payload_dir(job.plan.job_dir)
        places = plan.places()  # process index -> node and rank (per-node: the node's first rank)
        errors = sorted(directory.glob("proc*.error.json"), key=lambda p: p.stat().st_mtime)
        logs = Path(plan.job_dir) / "logs"
        if errors:
            index = int(errors[0].name[len("proc"):-len(".error.json")])
            place = places[index]
            return read_failure(directory, index, place.node_rank, place.rank, None, None,
                                str(logs / plan.log_name(place)), whole_node=plan.per_node)
        stderr = Path(str(job.job.paths.stderr).replace("%t", "0"))
        reports = failed_tasks(stderr.read_text(errors="replace")) if stderr.exists() else []
        if reports:
            report, place = reports[0], places[int(reports[0]["task"])]
            return RankFailure(rank=place.rank, node_rank=place.node_rank, exit_code=report["exit_code"],
                               signal=None if report["exit_code"] is not None else str(report["how"]),
                               exception=None, traceback=None, log=str(logs / plan.log_name(place)),
                               whole_node=plan.per_node)
        why = f"SLURM job {job.job.job_id} ended {state.state}" + (f" (exit {state.exit_code})"
                                                                  if state.exit_code else "")
        if state.state == _slurm_state.GONE:
            why += " without a result; SLURM accounting (sacct) is needed to tell why"
        return RankFailure(rank=0, node_rank=0, exit_code=None, signal=None, exception=why, traceback=None,
                           log=str(stderr))
