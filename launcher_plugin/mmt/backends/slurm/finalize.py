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
from mmt.backends.slurm.queue import restart_count
from mmt.backends.slurm.sbatch import RUN_STARTED_VAR, STARTED_VAR
from mmt.core.jobdir import Attempt
from mmt.records.outcome import read_primary_return, result_record, return_value_of, write_result
from mmt.records.ownership import read_owner
from mmt.records.payload import discard_payload, read_plan
from mmt.records.restarts import recorded, with_earlier_runs


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


def requeued(attempt: Attempt, job_id: str) -> bool:
    """Whether this run of the job was requeued, by mmt (the requeue signal) or by SLURM itself (scontrol requeue,
    preemption, a node failure); the next run needs the payload (job.json, job.pkl) and concludes the job."""
    restarts = int(os.environ.get("SLURM_RESTART_COUNT") or 0)
    if attempt.requeued_file(restarts).exists():
        return True
    if _requeued_by_slurm(job_id, restarts):
        attempt.requeued_file(restarts).touch()
        print(
            f"mmt: SLURM job {job_id} was requeued (restart {restarts + 1}); its next run concludes it", file=sys.stderr
        )
        return True
    return False


def main(argv: Optional[List[str]] = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    attempt = Attempt(Path(args[0]))
    if not attempt.plan.exists():
        return 0  # concluded and cleaned up already
    job_id = os.environ.get("SLURM_JOB_ID", "?")
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
    outcome = conclude(
        plan,
        attempt,
        scheduler_id=job_id,
        duration_s=time.time() - run_started,
        slurm_state=None,
        stderr=batch_stderr(),
        time_limit_reached=terminated is not None and elapsed >= limit_s - 5,
        batch_terminated_at=terminated,
    )
    value = return_value_of(read_primary_return(attempt))
    result = result_record(plan, outcome, value, attempt.id, started_at=started, ended_at=time.time())
    write_result(plan, with_earlier_runs(result, recorded(attempt)))  # the runs restarted inside the allocation
    discard_payload(attempt)
    attempt.finalized.touch()
    print(f"mmt: job {plan.name} concluded inside the allocation: {outcome.status}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
