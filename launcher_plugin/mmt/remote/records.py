"""Which of a launch's files come back from the cluster to the sweep dir here: what a user and Hydra read (each
job's ``result.json``, rank 0's return value, ``metrics.csv``, ``.hydra/``, the snapshot's record; the sweep's
summary and console). The logs, checkpoints, machine metrics and the scheduler's files stay there: ``mmt logs``
reads a log on demand. Shared by the rsync of a running launch (mmt.remote.results) and the archive that ends
its console's stream (mmt.remote.entry)."""

import fnmatch
import os
from typing import Iterator, List

KEPT_THERE = ("logs", "checkpoints", ".submitit", "metrics", "previous")
BROUGHT = (
    "result.json",
    "metrics.csv",
    "summary.csv",
    "summary.png",
    "snapshot.json",
    "snapshot.diff",
    "return.pkl",
    "console-*.log",
)
HYDRA_DIR = ".hydra"


def rsync_filters() -> List[str]:
    words = [f"--exclude={folder}/" for folder in KEPT_THERE]
    words += [f"--include={HYDRA_DIR}/***", "--include=*/"]
    words += [f"--include={name}" for name in BROUGHT]
    return [*words, "--exclude=*"]


def brought(sweep_dir: str) -> Iterator[str]:
    """The paths under ``sweep_dir`` (relative) that come back, as ``rsync_filters`` selects them."""
    for folder, dirs, files in os.walk(sweep_dir):
        dirs[:] = [d for d in dirs if d not in KEPT_THERE]
        rel = os.path.relpath(folder, sweep_dir)
        inside_hydra = HYDRA_DIR in rel.split(os.sep)
        for name in files:
            if inside_hydra or any(fnmatch.fnmatchcase(name, pattern) for pattern in BROUGHT):
                yield os.path.normpath(os.path.join(rel, name))
