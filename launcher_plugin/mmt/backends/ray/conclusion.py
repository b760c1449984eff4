"""How one run of a Ray job ended, from what its processes recorded and what its driver saw of Ray (pure: reads the
attempt dir). The job's driver concludes each run with it (and restarts a failed one while it may); the launcher and
``mmt list`` conclude with it a job whose driver could not (killed)."""

import signal
from dataclasses import dataclass
from typing import Optional, Sequence, Tuple

from mmt.core.jobdir import Attempt
from mmt.core.states import JobState
from mmt.monitor.hangs import read_hang
from mmt.planning.plan import JobPlan
from mmt.records.outcome import JobOutcome, all_succeeded, first_failure, missing_result, running_detail


@dataclass(frozen=True)
class LostNode:
    """A Ray node of the run that Ray holds dead (its raylet gone), and which node of the job it held."""

    node: int
    ip: str
    node_id: str

    def describe(self, plan: JobPlan) -> str:
        """``127.0.0.7 (Ray node 1a2b3c4d): node 1 of the job, ranks 2-3``."""
        first, last = self.node * plan.devices, (self.node + 1) * plan.devices - 1
        ranks = f"rank {first}" if first == last else f"ranks {first}-{last}"
        return f"{self.ip} (Ray node {self.node_id[:8]}): node {self.node} of the job, {ranks}"


def lost_detail(plan: JobPlan, scheduler_id: str, lost: Sequence[LostNode]) -> str:
    """``Ray job mmt-x lost node 127.0.0.7 (Ray node 1a2b3c4d): node 1 of the job, ranks 2-3``."""
    return f"Ray job {scheduler_id} lost node " + "; ".join(one.describe(plan) for one in lost)


@dataclass(frozen=True)
class RunEnd:
    """How a run ended, as the job's driver saw it."""

    started_at: float
    ended_at: float
    # the job was stopped (mmt stop, Ctrl-C on its launcher, `ray job stop`): why
    stopped_because: Optional[str] = None
    # when the driver began stopping the nodes, whatever the reason (a failure, the time limit, a stop)
    stopped_at: Optional[float] = None
    timed_out: bool = False
    # the nodes Ray lost during the run
    lost: Tuple[LostNode, ...] = ()
    # a node's actor that died while its Ray node lives on (killed, out of memory): (node, Ray's words)
    died: Tuple[Tuple[int, str], ...] = ()
    # the run could never be placed: the one line that says what it asks and what the cluster has
    refused: Optional[str] = None
    # an elastic run (num_nodes=MIN:MAX): fewer nodes than MIN left, which ones were lost; its last world's plan
    too_few: Optional[str] = None
    plan: Optional[JobPlan] = None

    @property
    def duration_s(self) -> float:
        return max(0.0, self.ended_at - self.started_at)


def conclude(plan: JobPlan, attempt: Attempt, end: RunEnd, scheduler_id: str) -> JobOutcome:
    outcome = JobOutcome(JobState.COMPLETED, end.duration_s, scheduler_id=scheduler_id)
    if all_succeeded(plan, attempt):
        return outcome
    if end.refused is not None:
        outcome.status, outcome.detail = JobState.FAILED, end.refused
        return outcome
    stopped = end.stopped_because
    hung = read_hang(attempt)
    if hung is not None and not stopped:  # its node agents stopped it: every rank's end follows from that
        outcome.status, outcome.detail = JobState.FAILED, hung
        return outcome
    if end.too_few is not None and not stopped:
        outcome.status, outcome.detail = JobState.FAILED, f"Ray job {scheduler_id} {end.too_few}"
        return outcome
    if end.lost and not stopped:  # every other rank's end (a broken collective, the driver's stop) follows from it
        outcome.status, outcome.detail = JobState.FAILED, lost_detail(plan, scheduler_id, end.lost)
        return outcome
    # what the driver's own stop did (SIGTERM from the agents, after stopped_at) is a consequence, never a failure
    failure = first_failure(plan, attempt, terminated_at=end.stopped_at, outside_signals=(signal.SIGTERM,))
    if failure is not None and not stopped:
        outcome.status, outcome.failure = JobState.FAILED, failure
        return outcome
    if stopped:
        outcome.status, outcome.detail = JobState.INTERRUPTED, f"stopped: {stopped}"
    elif end.timed_out:
        unfinished = [index for index in range(plan.process_count) if attempt.done(index) != 0]
        outcome.status = JobState.TIMEOUT
        outcome.detail = f"Ray job {scheduler_id} reached its time limit; {running_detail(plan, unfinished)}"
    elif end.died:
        node, why = end.died[0]
        outcome.status = JobState.FAILED
        outcome.detail = f"the Ray actor of node {node} (its node agent) died, its Ray node alive: {why}"
    elif all(attempt.done(i) == 0 for i in range(plan.process_count)):
        outcome.status, outcome.failure = JobState.FAILED, missing_result(plan)
    else:
        outcome.status = JobState.FAILED
        outcome.detail = f"Ray job {scheduler_id}: its node agents ended without a record of why (see its driver log)"
    return outcome


def ended_outside(plan: JobPlan, attempt: Attempt, scheduler_id: str, status: str, message: str) -> JobOutcome:
    """A Ray job that ended without its driver concluding it (the driver killed: `ray job stop` after its grace, a
    head that went): concluded from what its processes left and what Ray says."""
    outcome = JobOutcome(JobState.COMPLETED, None, scheduler_id=scheduler_id)
    if all_succeeded(plan, attempt):
        return outcome
    hung = read_hang(attempt)
    failure = first_failure(plan, attempt, outside_signals=(signal.SIGTERM, signal.SIGKILL))
    if status == "STOPPED":
        outcome.status = JobState.INTERRUPTED
        outcome.detail = f"Ray job {scheduler_id} was stopped outside mmt (ray job stop) before its driver concluded it"
    elif hung is not None:
        outcome.status, outcome.detail = JobState.FAILED, hung
    elif failure is not None:
        outcome.status, outcome.failure = JobState.FAILED, failure
    else:
        outcome.status = JobState.FAILED
        said = f": {message}" if message else ""
        outcome.detail = f"Ray job {scheduler_id} ended {status} before its driver concluded it{said}"
    return outcome
