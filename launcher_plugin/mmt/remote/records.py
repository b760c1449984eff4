"""Which of a launch's files come back from the cluster to the sweep dir here: what a user and Hydra read (each
job's ``result.json``, rank 0's return value, ``metrics.csv``, ``.hydra/``, the snapshot's record; the sweep's
summary and console). The logs, checkpoints, machine metrics and the scheduler's files stay there: ``mmt logs``
reads a log on demand. Shared by the rsync of a running launch (mmt.remote.results) and the archive that ends
its console's stream (mmt.remote.entry)."""

import fnmatch
import os
from pathlib import Path
from typing import Iterator, List

from mmt.core.jobdir import (
    CHECKPOINTS,
    LOGS,
    METRICS,
    PREVIOUS_LOGS,
    PRIVATE,
    RESULT,
    TRAINING_METRICS,
    Attempt,
    JobDir,
    SweepDir,
)

HYDRA_DIR = ".hydra"  # Hydra's record of each job's config
# the names are mmt.core.jobdir's: read off its records of a job, an attempt and a sweep
_JOB, _ATTEMPT, _SWEEP = JobDir(Path("job")), Attempt(Path("attempt")), SweepDir(Path("sweep"))
KEPT_THERE = (LOGS, CHECKPOINTS, METRICS, PREVIOUS_LOGS)
# a sweep's or a job's hidden folders stay there (the scheduler's own files) but for these two
HIDDEN_BROUGHT = (HYDRA_DIR, PRIVATE)
BROUGHT = (
    RESULT,
    TRAINING_METRICS,
    _SWEEP.summary_csv.name,
    _SWEEP.summary_png.name,
    _JOB.snapshot.name,
    _JOB.snapshot_diff.name,
    _ATTEMPT.primary_return.name,
    "console-*.log",  # mmt.remote.launch names each batch's console
)


def rsync_filters() -> List[str]:
    words = [f"--exclude={folder}/" for folder in KEPT_THERE]
    words += [f"--include={HYDRA_DIR}/***", *(f"--include={name}/" for name in HIDDEN_BROUGHT), "--exclude=.*/"]
    words += ["--include=*/"]
    words += [f"--include={name}" for name in BROUGHT]
    return [*words, "--exclude=*"]


def brought(sweep_dir: str) -> Iterator[str]:
    """The paths under ``sweep_dir`` (relative) that come back, as ``rsync_filters`` selects them."""
    for folder, dirs, files in os.walk(sweep_dir):
        dirs[:] = [d for d in dirs if d not in KEPT_THERE and (not d.startswith(".") or d in HIDDEN_BROUGHT)]
        rel = os.path.relpath(folder, sweep_dir)
        inside_hydra = HYDRA_DIR in rel.split(os.sep)
        for name in files:
            if inside_hydra or any(fnmatch.fnmatchcase(name, pattern) for pattern in BROUGHT):
                yield os.path.normpath(os.path.join(rel, name))
