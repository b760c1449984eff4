"""The records of a launch's jobs, opened in one call before anything is submitted, and given up in one call for the
jobs that never were: what the submit stage (``mmt.launching.submit``) needs of the records layer.

Opening a launch's jobs, all or nothing: every job dir claimed (``owner.json``, its lock, the attempt's beacon), a
new attempt dir made and the job's payload written into it, the jobs registered (one registry row each), the logs
an earlier attempt left in the dir set aside, and each job's timeline started with the launcher's own start. Once
a job is submitted, its scheduler's id is recorded where its owner and its row are; a job never submitted (refused,
the launcher interrupted first) leaves nothing behind: no attempt, no claim, no registry row.
"""

import os
import re
import shutil
import socket
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, Optional, Sequence

from mmt.core import proctree, timeline
from mmt.core.jobdir import Attempt, JobDir, new_attempt_id
from mmt.core.states import JobState
from mmt.planning.plan import JobPlan
from mmt.planning.redact import masked_overrides
from mmt.records import snapshot_use
from mmt.records.outcome import read_result
from mmt.records.ownership import Claim, StillActive, claim
from mmt.records.payload import JobPayload, write_payload
from mmt.records.registry import JobRecord, Registry
from mmt.records.schema import OwnerRecord, UnknownSchemaError


@dataclass(frozen=True)
class Launch:
    """Where and how a launch's jobs are recorded."""

    backend: str
    sweep_dir: Path
    registry: Optional[Registry]
    # the jobs run on without a supervisor (a detached launch)
    detached: bool
    # whether the launch an owner.json names still runs (the backend's question: a job outliving its launcher)
    still_active: StillActive
    # the backend's jobs outlive the launcher: a job given up keeps its dir's owner.json
    survives_launcher: bool = False


@dataclass
class Opened:
    """The launch's jobs, by number: each one's new attempt and its claim of the job dir, and where the logs of an
    earlier attempt went (None: there were none, or they could not be moved)."""

    launch: Launch
    attempts: Dict[int, Attempt]
    claims: Dict[int, Claim]
    logs_aside: Dict[int, Optional[Path]] = field(default_factory=dict)

    def submitted(self, plan: JobPlan, scheduler_id: Optional[str], scheduler_job: Optional[str]) -> None:
        """The job was submitted: its timeline says so, and its scheduler's id (and the job as its users know it:
        ``SLURM job 123``) is recorded where its owner and its row are."""
        timeline.mark_at(self.attempts[plan.num].timeline, timeline.SUBMITTED)
        if scheduler_id:
            self.claims[plan.num].update(scheduler_id=scheduler_id, scheduler_job=scheduler_job)
            if self.launch.registry is not None:
                self.launch.registry.update(plan.name, scheduler_id=scheduler_id)

    def give_up(self, plans: Sequence[JobPlan]) -> None:
        """Jobs that were never submitted leave nothing behind: no attempt, no claim, no record."""
        for plan in plans:
            snapshot_use.release_job(plan)
            shutil.rmtree(self.attempts[plan.num].dir, ignore_errors=True)
            self.claims[plan.num].release(forget=not self.launch.survives_launcher)
            if self.launch.registry is not None:
                self.launch.registry.delete(plan.name, attempt=self.attempts[plan.num].id)  # only what was inserted


def open_jobs(payloads: Sequence[JobPayload], launch: Launch) -> Opened:
    """Claim, write the payload, register, set earlier logs aside and start the timeline of every job, all or
    nothing: a failure part-way gives up every job it had opened, and raises."""
    plans = [payload.plan for payload in payloads]
    attempts = {plan.num: JobDir(Path(plan.job_dir)).attempt(new_attempt_id()) for plan in plans}
    earlier = {plan.num: _last_attempt(plan) for plan in plans}  # before the claim names this one the owner
    opened = Opened(launch, attempts, _claim_all(plans, launch, attempts))
    launcher_started = timeline.process_start_time()
    try:
        for payload in payloads:
            write_payload(attempts[payload.plan.num], payload)
            snapshot_use.add_job(payload.plan)
        if launch.registry is not None:
            launch.registry.add([_record(plan, attempts[plan.num], launch) for plan in plans])
        for plan in plans:
            opened.logs_aside[plan.num] = _set_earlier_logs_aside(plan, earlier[plan.num])
            _new_timeline(attempts[plan.num], launcher_started)
    except BaseException:
        opened.give_up(plans)
        raise
    return opened


def _claim_all(plans: Sequence[JobPlan], launch: Launch, attempts: Dict[int, Attempt]) -> Dict[int, Claim]:
    claims: Dict[int, Claim] = {}
    try:
        for plan in plans:
            owner = OwnerRecord.of_this_process(
                attempt=attempts[plan.num].id, name=plan.name, backend=launch.backend, job_id=plan.job_id
            )
            claims[plan.num] = claim(JobDir(Path(plan.job_dir)), owner, launch.still_active)
    except BaseException:
        for held in claims.values():
            held.release(forget=False)
        raise
    return claims


def _record(plan: JobPlan, attempt: Attempt, launch: Launch) -> JobRecord:
    return JobRecord(
        name=plan.name,
        job_id=plan.job_id,
        backend=launch.backend,
        job_dir=plan.job_dir,
        sweep_dir=str(launch.sweep_dir.absolute()),
        attempt=attempt.id,
        num_nodes=plan.num_nodes,
        devices=plan.devices,
        machine=plan.machine.name,
        command=plan.command,
        command_mode=plan.command_mode,
        overrides=masked_overrides(plan.overrides, plan.secret_names),
        state=JobState.PENDING.value,
        supervisor_pid=os.getpid(),
        supervisor_host=socket.gethostname(),
        supervisor_start=proctree.start_time(os.getpid()),
        detached=launch.detached,
        created_at=time.time(),
    )


def _new_timeline(attempt: Attempt, launcher_started: Optional[float]) -> None:
    """The job dir's timeline is the new attempt's from now on: it starts with the launcher's own start."""
    attempt.timeline.unlink(missing_ok=True)
    timeline.mark_at(attempt.timeline, timeline.LAUNCHER_START, launcher_started)
    timeline.mark_at(attempt.timeline, timeline.SUBMIT)


_SAFE_LABEL = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,80}$")


def _last_attempt(plan: JobPlan) -> Optional[str]:
    """The attempt that last ran in the job dir, if one did: owner.json names the last launch that has not released
    the dir (killed, or a job that outlives its launcher, whose owner.json stays), result.json the last one that
    concluded."""
    job_dir = JobDir(Path(plan.job_dir))
    for read in (lambda: OwnerRecord.read(job_dir.owner), lambda: read_result(job_dir.root)):
        try:
            record = read()
        except (UnknownSchemaError, OSError, ValueError):
            continue
        attempt = getattr(record, "attempt", None) if record is not None else None
        if isinstance(attempt, str) and _SAFE_LABEL.match(attempt):
            return attempt
    return None


def _set_earlier_logs_aside(plan: JobPlan, attempt_id: Optional[str]) -> Optional[Path]:
    """A new attempt's logs start empty: the console follows them from their start, and a failing rank's last lines
    are this attempt's, never an earlier run's (a rerun into the same dir: a fixed hydra.sweep.dir, a name reused
    after `mmt delete`, a resume from last.ckpt). The earlier run's logs go to logs/previous/<its attempt>/. A
    scheduler's requeue is the same attempt run again: it never comes here, and its ranks append."""
    job_dir = JobDir(Path(plan.job_dir))
    label = attempt_id
    if label is None:  # no record says which run wrote them: when they were last written
        try:
            newest = max(p.stat().st_mtime for p in job_dir.logs.iterdir())
        except (OSError, ValueError):
            newest = time.time()
        label = time.strftime("%Y%m%dT%H%M%S", time.localtime(newest)) + "-earlier"
    try:
        return job_dir.set_logs_aside(label)
    except OSError:  # they stay where they are; the job runs all the same
        return None
