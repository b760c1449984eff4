"""The submit stage: refuse what cannot run, claim each job dir, write the payloads, register the jobs and hand
them to the backend, all or nothing.

A launch that fails part-way cancels what it had submitted, saying why; a job never submitted (refused, or the
launcher interrupted first) leaves nothing behind: no attempt, no claim, no registry row.
"""

import os
import re
import shutil
import socket
import time
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence, Tuple

from mmt.backends.base import Backend, Dependency, Submission
from mmt.backends.registry import backend_class
from mmt.core import proctree, timeline
from mmt.core.errors import ConfigError, UsageError
from mmt.core.jobdir import Attempt, JobDir, new_attempt_id
from mmt.core.states import JobState
from mmt.launching.console import Console
from mmt.launching.jobs import LaunchOptions, PreparedJob, Watched
from mmt.launching.report import first_line
from mmt.launching.signals import SignalTrap
from mmt.planning.plan import JobPlan
from mmt.planning.redact import masked_overrides
from mmt.records.outcome import read_result
from mmt.records.ownership import Claim, claim
from mmt.records.payload import write_payload
from mmt.records.registry import JobRecord, Registry, named
from mmt.records.schema import OwnerRecord, UnknownSchemaError


def refuse_unrunnable(backend: Backend[Any], plans: Sequence[JobPlan]) -> None:
    for plan in plans:
        problems = backend.problems(plan)
        if problems:
            raise problems[0]


def _refuse_taken_names(registry: Optional[Registry], plans: Sequence[JobPlan]) -> None:
    if registry is None:
        return
    taken = registry.names_taken([plan.name for plan in plans])
    if taken:
        raise UsageError(
            f"the registry already holds a job named {taken[0]!r}. HINT: choose another name "
            f"(hydra.launcher.name / --name), or `mmt delete {taken[0]}` first"
        )


def resolve_after(plans: Sequence[JobPlan], registry: Optional[Registry]) -> Dict[int, Tuple[Dependency, ...]]:
    """Each job's ``hydra.launcher.after`` as the jobs it waits for, by job number; refused before anything starts
    when a name is no registered job or launch, or names one that ended without completing (a job after it could
    never start). Jobs that completed already are nothing to wait for."""
    wanted = {name for plan in plans for name in plan.after}
    if not wanted:
        return {plan.num: () for plan in plans}
    if registry is None:
        raise ConfigError(
            "hydra.launcher.after",
            sorted(wanted),
            "the jobs to wait for are found through the job registry, which cannot be opened here",
            "fix MMT_HOME (or ~/.mmt), or launch without hydra.launcher.after",
        )
    records = registry.list()
    found: Dict[str, List[Dependency]] = {}
    for entry in sorted(wanted):
        matching = named(entry, records)
        if not matching:
            raise ConfigError(
                "hydra.launcher.after",
                entry,
                "no registered job or launch has that name",
                "`mmt list` shows the registered jobs; a launch's jobs are <hydra.launcher.name>-<n>",
            )
        found[entry] = []
        for record in matching:
            record = backend_class(record.backend).refresh(record, registry)  # its state now, not when last seen
            state = JobState(record.state)
            if state == JobState.COMPLETED:
                continue
            if state.final:
                raise ConfigError(
                    "hydra.launcher.after",
                    entry,
                    f"job {record.name} ended {record.state}, so a job after it could never start",
                    f"run {record.name} again first, or leave it out of hydra.launcher.after",
                )
            found[entry].append(
                Dependency(record.name, record.backend, record.job_dir, record.attempt, record.scheduler_id)
            )
    return {plan.num: tuple(dep for entry in plan.after for dep in found[entry]) for plan in plans}


def _claim_all(plans: Sequence[JobPlan], backend: Backend[Any], attempts: Dict[int, Attempt]) -> Dict[int, Claim]:
    claims: Dict[int, Claim] = {}
    try:
        for plan in plans:
            owner = OwnerRecord.of_this_process(
                attempt=attempts[plan.num].id, name=plan.name, backend=backend.name, job_id=plan.job_id
            )
            claims[plan.num] = claim(JobDir(Path(plan.job_dir)), owner, backend.owner_active)
    except BaseException:
        for held in claims.values():
            held.release(forget=False)
        raise
    return claims


def _record(plan: JobPlan, attempt: Attempt, backend: str, sweep_dir: Path, detached: bool) -> JobRecord:
    return JobRecord(
        name=plan.name,
        job_id=plan.job_id,
        backend=backend,
        job_dir=plan.job_dir,
        sweep_dir=str(sweep_dir.absolute()),
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
        detached=detached,
        created_at=time.time(),
    )


def start_jobs(
    jobs: Sequence[PreparedJob],
    backend: Backend[Any],
    options: LaunchOptions,
    console: Console,
    detached: bool,
    trap: Optional[SignalTrap] = None,
) -> Tuple[List[Watched], List[JobPlan]]:
    """Refuse, claim, write payloads, register and submit every job; on any failure nothing is left behind.

    A signal caught by ``trap`` stops the submitting: the jobs not submitted yet are given up (their claims, payloads
    and records go) and returned second; the ones submitted are the caller's to stop."""
    plans = [job.plan for job in jobs]
    refuse_unrunnable(backend, plans)
    _refuse_taken_names(options.registry, plans)
    after = resolve_after(plans, options.registry)
    attempts = {plan.num: JobDir(Path(plan.job_dir)).attempt(new_attempt_id()) for plan in plans}
    earlier = {plan.num: _last_attempt(plan) for plan in plans}  # before the claim names this one the owner
    claims = _claim_all(plans, backend, attempts)
    watched: List[Watched] = []
    launcher_started = timeline.process_start_time()
    try:
        for job in jobs:
            write_payload(attempts[job.plan.num], job.payload)
        if options.registry is not None:
            options.registry.add(
                [_record(p, attempts[p.num], backend.name, options.sweep_dir, detached) for p in plans]
            )
        console.write(f"mmt: launching {len(jobs)} job(s) on cluster={backend.name}, sweep dir {options.sweep_dir}\n")
        submissions = []
        for job in jobs:
            if trap is not None and trap.received is not None:
                break
            plan = job.plan
            console.write(
                f"\t#{plan.num} {plan.name}: {' '.join(masked_overrides(plan.overrides, plan.secret_names))}"
                f" ({plan.num_nodes} x {plan.devices})\n"
            )
            aside = _set_earlier_logs_aside(plan, earlier[plan.num])
            if aside is not None:
                console.write(f"\t   (the earlier run's logs are in {aside})\n")
            _new_timeline(attempts[plan.num], launcher_started)
            submissions.append(
                Submission(plan=plan, attempt=attempts[plan.num], copied_env=job.copied_env, after=after[plan.num])
            )
        for batch in backend.submit_all(submissions):
            for submission, handle in batch:
                watched.append(_watched(submission, handle, claims[submission.plan.num], backend, options))
            if trap is not None and trap.received is not None:
                break  # what the backend has not accepted yet is never submitted
    except BaseException as exc:
        # a launch is all or nothing: the jobs it submitted before one was refused are cancelled, saying why
        why = f"the launch failed: {first_line(str(exc)) or type(exc).__name__}"
        for item in watched:
            backend.cancel(item.handle, why)
        if watched:
            jobs_text = ", ".join(f"#{item.plan.num} ({item.plan.name})" for item in watched)
            console.write(f"mmt: cancelled the job(s) this launch had submitted, {jobs_text}: {why}\n")
        _give_up(_unsubmitted(plans, watched), attempts, claims, backend, options.registry)
        raise
    unsubmitted = _unsubmitted(plans, watched)
    _give_up(unsubmitted, attempts, claims, backend, options.registry)
    return watched, unsubmitted


def _watched(
    submission: Submission, handle: Any, claim: Claim, backend: Backend[Any], options: LaunchOptions
) -> Watched:
    """A job the backend accepted, from now on watched; its scheduler's id recorded where its owner and row are."""
    timeline.mark_at(submission.attempt.timeline, timeline.SUBMITTED)
    scheduler_id = backend.poll(handle).scheduler_id
    if scheduler_id:
        claim.update(scheduler_id=scheduler_id)
        if options.registry is not None:
            options.registry.update(submission.plan.name, scheduler_id=scheduler_id)
    return Watched(
        plan=submission.plan,
        handle=handle,
        claim=claim,
        started_at=time.time(),
        survives_launcher=backend.survives_launcher,
        copied_env=dict(submission.copied_env),
        run_started_at=time.time(),
    )


def _new_timeline(attempt: Attempt, launcher_started: Optional[float]) -> None:
    """The job dir's timeline is the new attempt's from now on: it starts with the launcher's own start."""
    attempt.timeline.unlink(missing_ok=True)
    timeline.mark_at(attempt.timeline, timeline.LAUNCHER_START, launcher_started)
    timeline.mark_at(attempt.timeline, timeline.SUBMIT)


_SAFE_LABEL = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,80}$")


def _last_attempt(plan: JobPlan) -> Optional[str]:
    """The attempt that last ran in the job dir, if one did: owner.json names the last launch that has not released
    the dir (killed, or a SLURM job's, which stays), result.json the last one that concluded."""
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
    after `mmt delete`, a resume from last.ckpt). The earlier run's logs go to logs/previous/<its attempt>/. A SLURM
    requeue is the same attempt run again: it never comes here, and its ranks append."""
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


def _unsubmitted(plans: Sequence[JobPlan], watched: Sequence[Watched]) -> List[JobPlan]:
    submitted = {item.plan.num for item in watched}
    return [plan for plan in plans if plan.num not in submitted]


def _give_up(
    plans: Sequence[JobPlan],
    attempts: Dict[int, Attempt],
    claims: Dict[int, Claim],
    backend: Backend[Any],
    registry: Optional[Registry],
) -> None:
    """Jobs that were never submitted leave nothing behind: no attempt, no claim, no record."""
    for plan in plans:
        shutil.rmtree(attempts[plan.num].dir, ignore_errors=True)
        claims[plan.num].release(forget=not backend.survives_launcher)
        if registry is not None:
            registry.delete(plan.name, attempt=attempts[plan.num].id)  # only what this launch inserted
