"""How a SLURM job ended, from what its processes recorded and what SLURM says (or, inside the job, what is known
there). The launcher and the job's own last step (``finalize``) conclude with the same function."""

import signal
from pathlib import Path
from typing import Optional, Sequence

from mmt.backends.dependencies import cancelled_because
from mmt.backends.slurm.nodes import LostNode, lost_in_run, lost_node_detail
from mmt.backends.slurm.queue import GONE
from mmt.backends.slurm.task import failed_tasks
from mmt.core.errors import RankFailure
from mmt.core.jobdir import Attempt
from mmt.core.states import JobState
from mmt.monitor.hangs import read_hang
from mmt.planning.plan import JobPlan
from mmt.records.outcome import JobOutcome, all_succeeded, first_failure, missing_result, running_detail
from mmt.records.world import last_world_plan, read_failure


def srun_failure(plan: JobPlan, stderr: Optional[Path]) -> Optional[RankFailure]:
    """srun's own report of a dead task (per-rank tasks, where no agent records exits)."""
    try:
        reports = failed_tasks(stderr.read_text(errors="replace")) if stderr is not None else []
    except OSError:
        reports = []
    for report in reports:
        if report.exit_code is None and report.how == "Terminated":
            continue  # SLURM's own SIGTERM, after another task failed
        index = report.task
        if index >= plan.process_count:
            continue
        place = plan.place(index)
        log = plan.log_path(index)
        return RankFailure(
            rank=place.rank,
            node_rank=place.node_rank,
            exit_code=report.exit_code,
            signal=None if report.exit_code is not None else report.how,
            exception=None,
            traceback=None,
            log=str(log),
            whole_node=plan.per_node,
        )
    return None


# SLURM's final states that mean "ended from outside": every process was signalled, whatever it was doing
_ENDED_OUTSIDE = ("CANCELLED", "TIMEOUT", "PREEMPTED", "DEADLINE", "NODE_FAIL")


def terminated_at(plan: JobPlan, attempt: Attempt, batch_terminated_at: Optional[float] = None) -> Optional[float]:
    """When the job was first told to stop from outside: the batch script's or a node agent's SIGTERM."""
    times = [t for t in [batch_terminated_at] if t]
    for node in range(plan.num_nodes):
        record = attempt.agent(node) or {}
        if record.get("terminated_at"):
            times.append(float(record["terminated_at"]))
    return min(times) if times else None


def conclude(
    plan: JobPlan,
    attempt: Attempt,
    *,
    scheduler_id: str,
    duration_s: Optional[float],
    slurm_state: Optional[str],
    stopped_because: Optional[str] = None,
    stderr: Optional[Path] = None,
    time_limit_reached: bool = False,
    batch_terminated_at: Optional[float] = None,
    lost: Sequence[LostNode] = (),
    hosts: Sequence[str] = (),
) -> JobOutcome:
    """``slurm_state``: SLURM's final state (None inside the job, where it is not known yet);
    ``stopped_because``: the launcher cancelled the job, and why; ``batch_terminated_at``: when the batch script got
    SIGTERM (inside the job); ``lost``: the nodes SLURM holds lost now, of the run's ``hosts`` (node order)."""
    outcome = JobOutcome(JobState.COMPLETED, duration_s, scheduler_id=scheduler_id)
    plan = last_world_plan(plan, attempt)  # an elastic job: its processes' records are its last world's
    if all_succeeded(plan, attempt):
        return outcome
    too_few = read_failure(attempt) if plan.elastic is not None else None
    if too_few is not None and not stopped_because:  # its coordinator: the world could not form again
        outcome.status, outcome.detail = JobState.FAILED, f"SLURM job {scheduler_id} {too_few}"
        return outcome
    hung = read_hang(attempt)
    if hung is not None and not stopped_because:  # its node agents stopped it: every rank's end follows from that
        outcome.status, outcome.detail = JobState.FAILED, hung
        return outcome
    # an elastic job's lost nodes were changes of its world, not its end
    lost = lost_in_run(plan, attempt, lost, hosts) if plan.elastic is None else []
    if lost and not stopped_because:  # every other rank's end (SIGTERM, a broken collective) follows from that
        outcome.status = JobState.FAILED
        outcome.detail = lost_node_detail(plan, attempt, scheduler_id, lost, hosts)
        outcome.detail += f"; SLURM ended the job {slurm_state or 'for it'}"  # NODE_FAIL, seen from outside
        return outcome
    stopped_at = terminated_at(plan, attempt, batch_terminated_at)
    ended_outside = stopped_at is not None or stopped_because is not None or slurm_state in _ENDED_OUTSIDE
    # a SIGTERM death is always a consequence (SLURM, an agent, srun --kill-on-bad-exit stopping the rest); a SIGKILL
    # one only when the job was stopped from outside at an unknown time: when that time is known, a SIGKILL before
    # it is a failure of its own (the OOM killer), and what came after is left aside by its time. An agent's
    # SIGTERM is not always "from outside" either: srun sends it to the other nodes when one failed.
    signals = (signal.SIGTERM, signal.SIGKILL) if ended_outside and stopped_at is None else (signal.SIGTERM,)
    failure = first_failure(plan, attempt, terminated_at=stopped_at, outside_signals=signals) or (
        None if ended_outside else srun_failure(plan, stderr)
    )
    if failure is not None and not stopped_because:
        outcome.status, outcome.failure = JobState.FAILED, failure
        return outcome
    if stopped_because:
        outcome.status, outcome.detail = JobState.INTERRUPTED, f"stopped: {stopped_because}"
    elif slurm_state == "TIMEOUT" or (slurm_state is None and time_limit_reached):
        outcome.status = JobState.TIMEOUT
        unfinished = [index for index in range(plan.process_count) if attempt.done(index) != 0]
        outcome.detail = f"SLURM job {scheduler_id} reached its time limit; {running_detail(plan, unfinished)}"
    elif slurm_state == "CANCELLED" and plan.after and attempt.agent(0) is None:
        # it never started, and waited for other jobs: SLURM cancels it when one ends without completing
        # (--kill-on-invalid-dep), and says no more; which one it was comes from their records
        outcome.status, outcome.detail = JobState.CANCELLED, cancelled_because(plan.after)
    elif slurm_state == "CANCELLED":
        outcome.status = JobState.INTERRUPTED
        outcome.detail = f"SLURM job {scheduler_id} was cancelled outside the launcher (scancel)"
    elif slurm_state is None and ended_outside:
        outcome.status = JobState.INTERRUPTED
        outcome.detail = (
            f"SLURM job {scheduler_id} was stopped from outside (scancel, preemption or a node "
            "failure) before its processes ended"
        )
    elif all(attempt.done(i) == 0 for i in range(plan.process_count)):
        outcome.status, outcome.failure = JobState.FAILED, missing_result(plan)
    else:
        outcome.status = JobState.FAILED
        why = f"SLURM job {scheduler_id} ended {slurm_state}"
        if slurm_state == GONE:
            why += " without a result; SLURM accounting (sacct) is needed to tell why"
        outcome.detail = why
    return outcome
