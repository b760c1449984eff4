"""The last step of an mmt SLURM job, inside the allocation: conclude the job and write its ``result.json``.

Run by the batch script's EXIT trap (``mmt.backends.slurm.sbatch.finalize_line``) however the script ends: the
tasks' end, scancel, the time limit. So a detached job, or one whose launcher lost its terminal or was killed, still
says how it ended. A launcher that watches concludes it too, later, with what SLURM's accounting adds.

    python -m mmt.backends.slurm.finalize <attempt dir> <srun's exit status> [<time the script got SIGTERM>]
"""

import os
import sys
import time
from pathlib import Path
from typing import List, Optional

from mmt.backends.slurm.conclusion import conclude
from mmt.backends.slurm.nodes import LostNode, lost_in_run, lost_nodes, node_hosts, requeue_why
from mmt.backends.slurm.queue import restart_count
from mmt.backends.slurm.sbatch import RUN_STARTED_VAR, STARTED_VAR, own_job_id
from mmt.core.jobdir import Attempt
from mmt.planning.plan import JobPlan
from mmt.records.outcome import all_succeeded, read_primary_return, result_record, return_value_of, write_result
from mmt.records.ownership import read_owner
from mmt.records.payload import discard_payload, read_plan
from mmt.records.restarts import record_requeue, recorded, with_earlier_runs, with_requeues
from mmt.records.scheduler import read_scheduler


def batch_stderr() -> Optional[Path]:
    """The batch script's stderr, where srun reports dead tasks (per-rank tasks)."""
    try:
        return Path(os.readlink("/proc/self/fd/2"))
    except OSError:
        return None


def _requeued_by_slurm(job_id: str, restarts: int) -> bool:
    """SLURM has counted a restart beyond this run's: the job is requeued, not ended."""
    now = restart_count(job_id) if job_id != "?" else None
    return now is not None and now > restarts


def _nodelist() -> str:
    """This run's nodes, SLURM's compressed list (node[1-2])."""
    return os.environ.get("SLURM_JOB_NODELIST") or ""


def lost_here(plan: JobPlan, attempt: Attempt, hosts: List[str]) -> List[LostNode]:
    """The nodes of this run that SLURM holds lost (asked only when the run did not complete)."""
    if all_succeeded(plan, attempt) or not hosts:
        return []
    return lost_in_run(plan, attempt, lost_nodes(_nodelist()), hosts)


def requeued(attempt: Attempt, job_id: str) -> bool:
    """Whether this run of the job was requeued, by mmt (the requeue signal) or by SLURM itself (scontrol requeue,
    preemption, a node failure); the next run needs the payload (job.json, job.pkl) and concludes the job. A run
    whose every process reported success was not: slurmctld is asked only about a run that did not complete (the
    common path's last step waits on no daemon)."""
    restarts = int(os.environ.get("SLURM_RESTART_COUNT") or 0)
    if attempt.requeued_file(restarts).exists():
        return True
    try:
        plan: Optional[JobPlan] = read_plan(attempt)
    except Exception:  # noqa: BLE001 - a payload it cannot read is the next run's to refuse; the why stays
        plan = None
    if plan is not None and all_succeeded(plan, attempt):
        return False
    if _requeued_by_slurm(job_id, restarts):
        why = requeue_why(plan, attempt, job_id, restarts, _nodelist() or None)
        record_requeue(attempt, restarts, why)
        print(f"mmt: {why} (restart {restarts + 1}); its next run concludes it", file=sys.stderr)
        return True
    return False


def main(argv: Optional[List[str]] = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    attempt = Attempt(Path(args[0]))
    if not attempt.plan.exists():
        return 0  # concluded and cleaned up already
    job_id = own_job_id()
    if requeued(attempt, job_id):
        return 0  # the next run of the job concludes it
    owner = read_owner(attempt.job_dir.root)
    if owner is None or owner.attempt != attempt.id:
        return 0  # a newer launch owns the job dir now
    plan = read_plan(attempt)
    started = float(os.environ.get(STARTED_VAR) or time.time())
    elapsed = time.time() - started
    limit_s = max(60.0, 60.0 * -(-plan.timeout_s // 60))  # sbatch --time is whole minutes
    terminated = float(args[2]) if len(args) > 2 and args[2] else None
    run_started = float(os.environ.get(RUN_STARTED_VAR) or started)  # the last run's, after restarts
    hosts = node_hosts(_nodelist()) if _nodelist() else []
    view = read_scheduler(attempt)
    outcome = conclude(
        plan,
        attempt,
        scheduler_id=job_id,
        duration_s=time.time() - run_started,
        slurm_state=None,
        stderr=batch_stderr(),
        time_limit_reached=terminated is not None and elapsed >= limit_s - 5,
        batch_terminated_at=terminated,
        stopped_because=view.stopped_because if view is not None else None,  # its launcher cancelled it: why
        lost=lost_here(plan, attempt, hosts) if terminated is not None else [],
        hosts=hosts,
    )
    value = return_value_of(read_primary_return(attempt))
    result = result_record(plan, outcome, value, attempt.id, started_at=started, ended_at=time.time())
    # the runs restarted inside the allocation, and those SLURM requeued
    write_result(plan, with_requeues(with_earlier_runs(result, recorded(attempt)), attempt))
    discard_payload(attempt)
    attempt.finalized.touch()
    print(f"mmt: job {plan.name} concluded inside the allocation: {outcome.status}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
