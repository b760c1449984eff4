"""The conclude stage: a job has ended (or its last restart failed); its report is made from what its processes
left, the failing rank's last lines are shown, and its records are written in one call (mmt.records.conclusion)."""

import time
from pathlib import Path
from typing import Optional

from mmt.core.states import JobState
from mmt.launching.console import Console, tail
from mmt.launching.jobs import JobReport, Watched
from mmt.planning.plan import JobPlan
from mmt.records.conclusion import record_conclusion
from mmt.records.outcome import (
    JobOutcome,
    missing_result,
    outcome_of_record,
    read_primary_return,
    read_result,
    result_record,
    return_value_of,
)
from mmt.records.registry import Registry
from mmt.records.restarts import recorded, with_earlier_runs, with_requeues
from mmt.records.schema import ResultRecord, UnknownSchemaError


def conclude(item: Watched, outcome: JobOutcome, console: Console, registry: Optional[Registry]) -> JobReport:
    plan, attempt = item.plan, item.handle.attempt
    for follower in item.followers:
        follower.finish()
    primary = read_primary_return(attempt)
    existing = _existing_result(plan) if item.claim is None else None
    concluded_itself = existing is not None and existing.concludes(attempt.id)
    if existing is not None and concluded_itself:
        # re-attached to a job that concluded itself: its result is the truth
        record, outcome = existing, outcome_of_record(existing)
    else:
        if outcome.status == JobState.COMPLETED and primary is None:
            outcome.status, outcome.failure = JobState.FAILED, missing_result(plan)
        record = result_record(
            plan,
            outcome,
            return_value_of(primary),
            attempt.id,
            started_at=item.started_at,
            ended_at=time.time(),
            attempt=attempt,
        )
        # the runs this process restarted, else those a restart inside a SLURM allocation recorded
        record = with_requeues(with_earlier_runs(record, item.earlier_runs or recorded(attempt)), attempt)
    if outcome.failure is not None and outcome.failure.rank != 0 and not outcome.failure.missing_result:
        _show_tail(plan, outcome, console)
    recorded_as = record_conclusion(
        plan,
        attempt,
        record,
        registry=registry,
        claim=item.claim,
        keep_records=item.survives_launcher,
        write=not concluded_itself,
    )
    if recorded_as.registry_error is not None:  # the job dir has the result; the registry reconciles from it later
        console.write(f"mmt: could not update the job registry: {recorded_as.registry_error}\n")
    return JobReport(
        plan=plan,
        outcome=outcome,
        attempt=attempt,
        primary=primary,
        record=record,
        write_error=recorded_as.result_error,
    )


def _existing_result(plan: JobPlan) -> Optional[ResultRecord]:
    """The job dir's result.json, when this mmt can read it (one a newer mmt wrote concludes another attempt)."""
    try:
        return read_result(Path(plan.job_dir))
    except UnknownSchemaError:
        return None


def _show_tail(plan: JobPlan, outcome: JobOutcome, console: Console) -> None:
    failure = outcome.failure
    assert failure is not None
    label = f"[#{plan.num} n{failure.node_rank}" + ("" if plan.per_node else f" r{failure.rank}") + "]"
    lines = tail(Path(failure.log))
    if lines:
        console.write(f"{label} --- last lines of {failure.log} ---\n" + "".join(f"{label} {line}\n" for line in lines))
