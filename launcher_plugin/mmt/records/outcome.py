"""Concluding a job: who failed first (from the records its processes left), and the ``result.json`` that says
how it ended. The launcher, a detached supervisor and a SLURM job's own last step all conclude the same way.
"""

import json
import math
import signal
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, List, Optional, Tuple

from mmt.core.errors import (
    JobCancelledError,
    JobFailedError,
    JobInterruptedError,
    JobTimeoutError,
    RankFailedError,
    RankFailure,
)
from mmt.core.jobdir import Attempt, JobDir
from mmt.core.states import JobState, ProcessState
from mmt.planning.plan import JobPlan
from mmt.planning.redact import masked_overrides
from mmt.records import job_return
from mmt.records.payload import UnsafePayloadError, open_private
from mmt.records.schema import ErrorRecord, ExitRecord, ResultRecord, RoleResult
from mmt.records.world import read_changes


@dataclass
class JobOutcome:
    """How a job ended, as its backend saw it (``result.json`` records it)."""

    status: JobState
    duration_s: Optional[float]
    # FAILED: the first process that failed
    failure: Optional[RankFailure] = None
    # TIMEOUT: which processes were still running; INTERRUPTED: why
    detail: str = ""
    # the scheduler's id (SLURM job id), when there is one
    scheduler_id: Optional[str] = None
    # seconds from the decision to stop the job (failure, time limit, interrupt) until its last process was gone
    stop_latency_s: Optional[float] = None


def _signal_name(code: int) -> str:
    try:
        return signal.Signals(-code).name
    except ValueError:
        return f"signal {-code}"


def _log(plan: JobPlan, index: int) -> str:
    return str(plan.log_path(index))


def process_error(attempt: Attempt, index: int) -> Optional[ErrorRecord]:
    """What process ``index`` reported when it raised (or its command failed), if it did."""
    return ErrorRecord.read(attempt.error_file(index))


def process_exit(attempt: Attempt, index: int) -> Optional[ExitRecord]:
    """How process ``index`` exited, as its agent recorded it, once it did."""
    return ExitRecord.read(attempt.exit_file(index))


def _failure(plan: JobPlan, index: int, error: Optional[ErrorRecord], code: Optional[int]) -> RankFailure:
    place = plan.place(index)
    exit_code, signal_name = (error.exit_code, error.signal) if error is not None else (None, None)
    if (error is None or not error.command) and code is not None:  # not a command's own status: the process's
        exit_code, signal_name = (code, None) if code >= 0 else (None, _signal_name(code))
    role = plan.role_at(index) if plan.roles else None
    return RankFailure(
        rank=place.rank,
        node_rank=place.node_rank,
        exit_code=exit_code,
        signal=signal_name,
        exception=error.exception if error else None,
        traceback=error.traceback if error else None,
        log=_log(plan, index),
        whole_node=plan.per_node if role is None else role.per_node,
        role=None if role is None else role.name,
    )


def process_state(attempt: Attempt, index: int) -> ProcessState:
    """Where process ``index`` of a started job is, by the records it and its agent left."""
    if process_error(attempt, index) is not None:
        return ProcessState.FAILED
    exit_record = process_exit(attempt, index)
    if exit_record is not None:
        if exit_record.code == 0:
            return ProcessState.SUCCEEDED
        return ProcessState.STOPPED if exit_record.stopped else ProcessState.FAILED
    done = attempt.done(index)
    if done is not None:  # its task has finished; the process is exiting
        return ProcessState.SUCCEEDED if done == 0 else ProcessState.FAILED
    return ProcessState.RUNNING


# how late a silent death may be recorded after the first error it caused (the agent's reap, a busy host)
_REAP_LAG_S = 2.0


def first_failure(
    plan: JobPlan, attempt: Attempt, terminated_at: Optional[float] = None, outside_signals: Tuple[int, ...] = ()
) -> Optional[RankFailure]:
    """The process that failed first, by the time of its record; None when none failed by itself.

    A process mmt stopped (a sibling failed, the time limit) is not a failure. When the job was terminated from
    outside (scancel, SLURM's time limit), what happened from ``terminated_at`` on is its consequence, and so is a
    death by one of ``outside_signals`` (what SLURM sends: SIGTERM, then SIGKILL).
    """
    found: List[Tuple[float, RankFailure]] = []
    for index in range(plan.process_count):
        if process_state(attempt, index) != ProcessState.FAILED:
            continue
        error, exit_record = process_error(attempt, index), process_exit(attempt, index)
        code = exit_record.code if exit_record else None
        if error is None and exit_record is None:
            continue  # its task failed (done marker) and its exit is not recorded yet: the exit record names how
        if error is None and code is not None and code < 0 and -code in outside_signals:
            continue
        when = error.when if error is not None else exit_record.when if exit_record is not None else math.inf
        failure = _failure(plan, index, error, code)
        if terminated_at is None or when < terminated_at:
            found.append((when, failure))
    if not found:
        return None
    first_when, first = min(found, key=lambda item: item[0])
    # a process that died without a word (a signal, os._exit) is timed when its agent reaped it, after its peers
    # already raised about the broken collective ("Connection reset by peer"): within that lag, the silent death is
    # the cause and the peers' errors its consequence
    silent = [(when, f) for when, f in found if f.exception is None and when - first_when <= _REAP_LAG_S]
    return min(silent, key=lambda item: item[0])[1] if silent else first


def missing_result(plan: JobPlan) -> RankFailure:
    return RankFailure(
        rank=0,
        node_rank=0,
        exit_code=0,
        signal=None,
        exception=None,
        traceback=None,
        log=_log(plan, 0),
        whole_node=plan.per_node,
        missing_result=True,
    )


def all_succeeded(plan: JobPlan, attempt: Attempt) -> bool:
    """Every process finished its task and the primary reported its result. A job with roles: every process of
    the primary role did, and each other role's process did too or was stopped by mmt (the primary's end stops
    them; one that had not even reached its task yet has no done marker, only its agent's exit record)."""
    if not attempt.primary_return.exists():
        return False
    if not plan.roles:
        return all(attempt.done(index) == 0 for index in range(plan.process_count))
    if not all(attempt.done(index) == 0 for index in plan.roles[0].indices):
        return False
    return all(
        _role_process_state(attempt, index) in (ProcessState.SUCCEEDED, ProcessState.STOPPED)
        for role in plan.roles[1:]
        for index in role.indices
    )


def read_primary_return(attempt: Attempt) -> Any:
    """The primary process's JobReturn, or None when it left none (or left it where others could have written it:
    a pickle is code, and it is only loaded from a dir this user owns that nobody else can write)."""
    try:
        with open_private(attempt.primary_return) as handle:
            return job_return.load(handle)
    except (FileNotFoundError, NotADirectoryError, EOFError):
        return None
    except UnsafePayloadError as exc:
        print(f"mmt: WARNING not reading job {attempt.job_dir.root}'s return value: {exc}", file=sys.stderr)
        return None


def return_value_of(primary: Any) -> Any:
    """The value the primary process's task returned (None when it left no JobReturn)."""
    return getattr(primary, "_return_value", None) if primary is not None else None


def running_detail(plan: JobPlan, running: List[int]) -> str:
    """Which processes had not reached the end at the time limit (TIMEOUT's message)."""
    if not running:
        return "every process had finished"
    if len(running) == plan.process_count:
        who = "nodes" if plan.per_node else "ranks"
        return f"all {plan.process_count} {who} were still running (none reached the end)"
    return "still running at the limit: " + ", ".join(plan.describe_place(plan.place(i)) for i in running)


def error_for(plan: JobPlan, outcome: JobOutcome) -> Exception:
    """The exception a failed job's result carries (what Hydra's JobReturn raises for it)."""
    if outcome.status == JobState.TIMEOUT:
        return JobTimeoutError(plan.label, plan.timeout_s, outcome.detail)
    if outcome.status == JobState.INTERRUPTED:
        return JobInterruptedError(plan.label, outcome.detail)
    if outcome.status == JobState.CANCELLED:
        return JobCancelledError(plan.label, outcome.detail)
    if outcome.failure is None:
        return JobFailedError(plan.label, outcome.detail or "failed without a record of why")
    return RankFailedError(plan.label, outcome.failure)


def outcome_of_record(record: ResultRecord) -> JobOutcome:
    """A result.json read back (a job that concluded itself, seen from another process)."""
    error = record.error or ""
    detail = error.split(": ", 1)[1] if ": " in error and record.failure is None else ""
    return JobOutcome(
        status=record.status,
        duration_s=record.duration_s,
        failure=record.failure,
        detail=detail,
        scheduler_id=record.scheduler_id,
        stop_latency_s=record.stop_latency_s,
    )


def _jsonable(value: Any) -> Any:
    try:
        json.dumps(value, allow_nan=False)
        return value
    except (TypeError, ValueError):
        if isinstance(value, float) and not math.isfinite(value):
            return str(value)
        if isinstance(value, dict):
            return {str(k): _jsonable(v) for k, v in value.items()}
        if isinstance(value, (list, tuple)):
            return [_jsonable(v) for v in value]
        return repr(value)


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def summary_key(plan: JobPlan, return_value: Any) -> Optional[str]:
    """The key the job's summary number is under, as result.json records it (``summary_metric``): for a returned
    dict, the plan's ``summary_metric`` (None: its first number); for a returned number, the key the app took it
    from, its ``optimized_metric`` (lightning-hydra-template returns ``metric_dict[optimized_metric]``), or None
    when the app names none (the number is then just "the result", never the recipe's dict key)."""
    if _is_number(return_value):
        return plan.optimized_metric
    return plan.summary_metric


def result_record(
    plan: JobPlan,
    outcome: JobOutcome,
    return_value: Any,
    attempt_id: str,
    started_at: Optional[float] = None,
    ended_at: Optional[float] = None,
    attempt: Optional[Attempt] = None,
) -> ResultRecord:
    """The result of a job's attempt, as ``result.json`` and the registry keep it (``attempt``: where a job with
    roles finds how each role's processes ended)."""
    completed = outcome.status == JobState.COMPLETED
    return ResultRecord(
        job=plan.num,
        name=plan.name,
        attempt=attempt_id,
        overrides=tuple(masked_overrides(plan.overrides, plan.secret_names)),
        status=outcome.status,
        num_nodes=plan.num_nodes,
        devices=plan.devices,
        world_size=plan.world_size,
        machine=plan.machine.name,
        summary_metric=summary_key(plan, return_value if completed else None),
        duration_s=outcome.duration_s,
        stop_latency_s=outcome.stop_latency_s,
        scheduler_id=outcome.scheduler_id,
        started_at=started_at,
        ended_at=ended_at,
        return_value=_jsonable(return_value) if completed else None,
        failure=outcome.failure,
        error=None if completed else str(error_for(plan, outcome)),
        roles=role_results(plan, attempt) if attempt is not None else (),
        world_changes=tuple(read_changes(attempt.job_dir)) if attempt is not None and plan.elastic else (),
        snapshot=plan.snapshot.provenance() if plan.snapshot is not None else None,
    )


def role_results(plan: JobPlan, attempt: Attempt) -> Tuple[RoleResult, ...]:
    """How each role of a job with roles ended, from its processes' records (() without roles)."""
    results = []
    for role in plan.roles:
        states = [_role_process_state(attempt, index) for index in role.indices]
        counts = {state: states.count(state) for state in ProcessState}
        if counts[ProcessState.FAILED]:
            status = JobState.FAILED.value
        elif counts[ProcessState.SUCCEEDED] == len(states):
            status = JobState.COMPLETED.value
        else:
            status = "STOPPED"
        results.append(
            RoleResult(
                name=role.name,
                primary=role.primary,
                num_nodes=role.num_nodes,
                devices=role.devices,
                world_size=role.world_size,
                status=status,
                succeeded=counts[ProcessState.SUCCEEDED],
                failed=counts[ProcessState.FAILED],
                stopped=counts[ProcessState.STOPPED] + counts[ProcessState.RUNNING],
            )
        )
    return tuple(results)


def read_result(job_dir: Path) -> Optional[ResultRecord]:
    """``<job dir>/result.json``, of whichever attempt wrote it last (see ResultRecord.concludes)."""
    return ResultRecord.read(JobDir(job_dir).result)


def write_result(plan: JobPlan, record: ResultRecord) -> None:
    """``<job dir>/result.json``, atomically: readers see the previous result or this one."""
    record.write(JobDir(Path(plan.job_dir)).result)


def _role_process_state(attempt: Attempt, index: int) -> ProcessState:
    """A process mmt stopped is STOPPED, whatever it said on its way out (a rank torn down mid-collective raises)."""
    exit_record = process_exit(attempt, index)
    if exit_record is not None and exit_record.stopped and exit_record.code != 0:
        return ProcessState.STOPPED
    return process_state(attempt, index)
