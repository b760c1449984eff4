"""The submit stage: refuse what cannot run, claim each job dir, write the payloads, register the jobs and hand
them to the backend, all or nothing.

A launch that fails part-way cancels what it had submitted, saying why; a job never submitted (refused, or the
launcher interrupted first) leaves nothing behind: no attempt, no claim, no registry row (mmt.records.opening opens
and gives up the records, each in one call).
"""

import time
from typing import Any, Dict, List, Optional, Sequence, Tuple

from mmt.backends.base import Backend, Dependency, Submission, capability_problems
from mmt.backends.registry import backend_class, scheduler_job
from mmt.core.errors import ConfigError, UsageError
from mmt.core.states import JobState
from mmt.launching.console import Console
from mmt.launching.jobs import LaunchOptions, PreparedJob, Watched
from mmt.launching.report import first_line
from mmt.launching.signals import SignalTrap
from mmt.planning.plan import JobPlan
from mmt.planning.redact import masked_overrides
from mmt.records.opening import Launch, Opened, open_jobs
from mmt.records.registry import Registry, named


def refuse_unrunnable(backend: Backend[Any], plans: Sequence[JobPlan]) -> None:
    for plan in plans:
        problems = capability_problems(backend, plan) or backend.problems(plan)
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


def start_jobs(
    jobs: Sequence[PreparedJob],
    backend: Backend[Any],
    options: LaunchOptions,
    console: Console,
    detached: bool,
    trap: Optional[SignalTrap] = None,
) -> Tuple[List[Watched], List[JobPlan]]:
    """Refuse, open every job's records (mmt.records.opening) and submit every job; on any failure nothing is left
    behind.

    A signal caught by ``trap`` stops the submitting: the jobs not submitted yet are given up (their claims, payloads
    and records go) and returned second; the ones submitted are the caller's to stop."""
    plans = [job.plan for job in jobs]
    refuse_unrunnable(backend, plans)
    _refuse_taken_names(options.registry, plans)
    after = resolve_after(plans, options.registry)
    launch = Launch(
        backend=backend.name,
        sweep_dir=options.sweep_dir,
        registry=options.registry,
        detached=detached,
        still_active=backend.owner_active,
        survives_launcher=backend.survives_launcher,
    )
    opened = open_jobs([job.payload for job in jobs], launch)
    watched: List[Watched] = []
    try:
        console.write(f"mmt: launching {len(jobs)} job(s) on cluster={backend.name}, sweep dir {options.sweep_dir}\n")
        submissions = []
        for job in jobs:
            if trap is not None and trap.received is not None:
                break
            plan = job.plan
            console.write(
                f"\t#{plan.num} {plan.name}: {' '.join(masked_overrides(plan.overrides, plan.secret_names))}"
                f" ({plan.topology})\n"
            )
            aside = opened.logs_aside.get(plan.num)
            if aside is not None:
                console.write(f"\t   (the earlier run's logs are in {aside})\n")
            submissions.append(
                Submission(
                    plan=plan, attempt=opened.attempts[plan.num], copied_env=job.copied_env, after=after[plan.num]
                )
            )
        for batch in backend.submit_all(submissions):
            for submission, handle in batch:
                watched.append(_watched(submission, handle, opened, backend))
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
        opened.give_up(_unsubmitted(plans, watched))
        raise
    unsubmitted = _unsubmitted(plans, watched)
    opened.give_up(unsubmitted)
    return watched, unsubmitted


def _watched(submission: Submission, handle: Any, opened: Opened, backend: Backend[Any]) -> Watched:
    """A job the backend accepted, from now on watched; its scheduler's id recorded where its owner and row are."""
    scheduler_id = backend.poll(handle).scheduler_id
    job = scheduler_job(backend.name, scheduler_id) if scheduler_id else None
    opened.submitted(submission.plan, scheduler_id, job)
    return Watched(
        plan=submission.plan,
        handle=handle,
        claim=opened.claims[submission.plan.num],
        started_at=time.time(),
        survives_launcher=backend.survives_launcher,
        copied_env=dict(submission.copied_env),
        run_started_at=time.time(),
    )


def _unsubmitted(plans: Sequence[JobPlan], watched: Sequence[Watched]) -> List[JobPlan]:
    submitted = {item.plan.num for item in watched}
    return [plan for plan in plans if plan.num not in submitted]
