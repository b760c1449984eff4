"""The runs of a job that failed and were restarted (``hydra.launcher.max_restarts``), as its result tells them.

Whoever restarts a job keeps them: the engine in memory for the jobs it supervises (local), the batch script's
restart step in the attempt dir (``earlier_runs.json``: SLURM, where the restart happens inside the allocation and
the job's last step writes its result).
"""

import json
from dataclasses import asdict, replace
from typing import List, Optional, Sequence

from mmt.core.jobdir import Attempt, read_json, write_atomic
from mmt.records.schema import EarlierRun, ResultRecord


def recorded(attempt: Attempt) -> List[EarlierRun]:
    """The earlier runs the attempt dir records, oldest first (none when it records none)."""
    data = read_json(attempt.earlier_runs_file)
    runs = data.get("runs") if isinstance(data, dict) else None
    return [run for run in map(EarlierRun.of, runs if isinstance(runs, list) else []) if run is not None]


def record(attempt: Attempt, run: EarlierRun) -> None:
    """Add ``run`` to the attempt dir's record (atomically: a reader sees the runs before or after it)."""
    runs = [*recorded(attempt), run]
    write_atomic(attempt.earlier_runs_file, json.dumps({"runs": [asdict(r) for r in runs]}).encode(), private=True)


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
