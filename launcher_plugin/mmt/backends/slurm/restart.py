"""A SLURM job's restart step, inside its allocation: after a run that failed, whether to run it again.

Run by the batch script's restart loop (``mmt.backends.slurm.sbatch.with_restart_loop``) when srun ended non-zero
and the script was not told to stop (scancel, the time limit). Exits 0 to restart, having recorded the run
(``earlier_runs.json``) and set its process records aside; 1 to let the job end (restarts used up, a stop, a requeue,
a run that did not fail). The restart reuses the allocation: its nodes, its time limit, its MASTER_PORT.

    python -m mmt.backends.slurm.restart <attempt dir> <srun's exit status>
"""

import os
import sys
import time
from pathlib import Path
from typing import List, Optional

from mmt.backends.slurm.conclusion import conclude
from mmt.backends.slurm.finalize import batch_stderr, requeued
from mmt.backends.slurm.sbatch import RUN_STARTED_VAR, own_job_id
from mmt.core.jobdir import Attempt
from mmt.core.rank_env import MMT_RESTART_COUNT
from mmt.core.states import JobState
from mmt.records import restarts
from mmt.records.outcome import error_for
from mmt.records.payload import read_plan
from mmt.records.schema import EarlierRun


def main(argv: Optional[List[str]] = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    attempt = Attempt(Path(args[0]))
    restart = int(os.environ.get(MMT_RESTART_COUNT) or 0)
    job_id = own_job_id()
    if not attempt.plan.exists() or requeued(attempt, job_id):
        return 1
    plan = read_plan(attempt)
    if restart >= plan.max_restarts:
        return 1
    started = float(os.environ.get(RUN_STARTED_VAR) or time.time())
    ended = time.time()
    outcome = conclude(
        plan, attempt, scheduler_id=job_id, duration_s=ended - started, slurm_state=None, stderr=batch_stderr()
    )
    if outcome.status != JobState.FAILED:
        return 1
    error = next((line for line in str(error_for(plan, outcome)).splitlines() if line.strip()), "")
    restarts.record(
        attempt,
        EarlierRun(restart=restart, error=error, started_at=started, ended_at=ended, duration_s=ended - started),
    )
    attempt.set_run_aside(restart)
    print(
        f"mmt: SLURM job {job_id}: run {restart} failed: {error}\n"
        f"mmt: restart {restart + 1} of {plan.max_restarts}, every task, inside the allocation, "
        f"in {plan.restart_backoff_s:g} s",
        file=sys.stderr,
        flush=True,
    )
    time.sleep(plan.restart_backoff_s)
    return 0


if __name__ == "__main__":
    sys.exit(main())
