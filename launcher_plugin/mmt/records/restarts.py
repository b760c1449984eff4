"""The runs of a job before its last, as its result tells them: those that failed and were restarted
(``hydra.launcher.max_restarts``), and those SLURM requeued (a lost node, ``scontrol requeue``, preemption).

Whoever restarts a job keeps them: the engine in memory for the jobs it supervises (local), the batch script's
restart step in the attempt dir (``earlier_runs.json``: SLURM, where the restart happens inside the allocation and
the job's last step writes its result). A requeued run leaves ``requeued.<restart>`` in the attempt dir (written by
the rank that requeued it, empty, or by the run's last step, with why).
"""

import json
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import List, Optional, Sequence

from mmt.core.jobdir import Attempt, read_json, write_atomic
from mmt.records.schema import EarlierRun, Requeue, ResultRecord


def recorded(attempt: Attempt) -> List[EarlierRun]:
    """The earlier runs the attempt dir records, oldest first (none when it records none)."""
    data = read_json(attempt.earlier_runs_file)
    runs = data.get("runs") if isinstance(data, dict) else None
    return [run for run in map(EarlierRun.of, runs if isinstance(runs, list) else []) if run is not None]


def record(attempt: Attempt, run: EarlierRun) -> None:
    """Add ``run`` to the attempt dir's record (atomically: a reader sees the runs before or after it)."""
    runs = [*recorded(attempt), run]
    write_atomic(attempt.earlier_runs_file, json.dumps({"runs": [asdict(r) for r in runs]}).encode(), private=True)


@dataclass(frozen=True)
class PendingRestart:
    """A job between a failed run and the next: the run that failed (its ``restart``: MMT_RESTART_COUNT, 0 first),
    what failed, and when the next run starts. Recorded when the run fails, so that whoever looks (``mmt list``,
    ``mmt inspect``, the page, ``Job.status``) sees a job that is restarting, and why, not one that merely runs."""

    failed: EarlierRun
    next_at: float
    # who failed and how, in a few words (RankFailure.brief): "rank 1 exited with code 5"
    why: str = ""

    def describe(self, now: Optional[float] = None) -> str:
        """``run 1 failed: rank 1 exited with code 5; run 2 in 18 s``."""
        wait = max(0.0, self.next_at - (time.time() if now is None else now))
        run = self.failed.restart + 1
        return f"run {run} failed: {self.why or self.failed.error}; run {run + 1} in {wait:.0f} s"


def record_pending_restart(attempt: Attempt, failed: EarlierRun, next_at: float, why: str) -> None:
    write_atomic(
        attempt.pending_restart_file,
        json.dumps({"failed": asdict(failed), "next_at": next_at, "why": why}).encode(),
        private=True,
    )


def pending_restart(attempt: Attempt) -> Optional[PendingRestart]:
    """The restart the attempt waits for, if it does."""
    data = read_json(attempt.pending_restart_file)
    failed = EarlierRun.of(data.get("failed")) if isinstance(data, dict) else None
    next_at = data.get("next_at") if isinstance(data, dict) else None
    if failed is None or not isinstance(next_at, (int, float)):
        return None
    why = data.get("why") if isinstance(data, dict) else None
    return PendingRestart(failed=failed, next_at=float(next_at), why=why if isinstance(why, str) else "")


def clear_pending_restart(attempt: Attempt) -> None:
    attempt.pending_restart_file.unlink(missing_ok=True)


def unrecord_last_run(attempt: Attempt) -> None:
    """Drop the newest run from the attempt dir's record (a restart cancelled: that run is the job's last)."""
    runs = recorded(attempt)[:-1]
    if runs:
        write_atomic(attempt.earlier_runs_file, json.dumps({"runs": [asdict(r) for r in runs]}).encode(), private=True)
    else:
        attempt.earlier_runs_file.unlink(missing_ok=True)


def with_earlier_runs(result: ResultRecord, runs: Sequence[EarlierRun]) -> ResultRecord:
    """The result of a job's last run, with the runs before it; a failed one says what failed in every run."""
    if not runs:
        return result
    return replace(result, earlier_runs=tuple(runs), error=_error_with(result.error, runs))


def _error_with(error: Optional[str], runs: Sequence[EarlierRun]) -> Optional[str]:
    if error is None:
        return None
    earlier = "; ".join(f"run {run.restart}: {run.error}" for run in runs)
    head, _, rest = error.partition("\n")
    return f"{head} (run {len(runs)}, after {len(runs)} restart(s); earlier: {earlier})" + ("\n" + rest if rest else "")


# what an empty ``requeued.<restart>`` says: the rank that took the requeue signal requeued the job itself
ON_SIGNAL = "requeued by mmt on the requeue signal (USR2), from its checkpoint"


def record_requeue(attempt: Attempt, restart: int, why: str) -> None:
    """Mark run ``restart`` of the job requeued, saying why (the next run resumes; its last step concludes)."""
    write_atomic(attempt.requeued_file(restart), json.dumps({"why": why, "at": time.time()}).encode(), private=True)


def requeues(attempt: Attempt) -> List[Requeue]:
    """The requeued runs the attempt dir records, oldest first."""
    found = []
    for path in attempt.dir.glob("requeued.*"):
        restart = path.suffix.lstrip(".")
        if not restart.isdigit():
            continue
        data = read_json(path)
        data = data if isinstance(data, dict) else {}
        at = data.get("at")
        found.append(
            Requeue(
                restart=int(restart),
                why=str(data.get("why") or ON_SIGNAL),
                at=float(at) if isinstance(at, (int, float)) else _modified(path),
            )
        )
    return sorted(found, key=lambda one: one.restart)


def _modified(path: Path) -> Optional[float]:
    try:
        return path.stat().st_mtime
    except OSError:
        return None


def with_requeues(result: ResultRecord, attempt: Attempt) -> ResultRecord:
    """The result with the runs SLURM requeued before it."""
    found = requeues(attempt)
    return replace(result, requeues=tuple(found)) if found else result
