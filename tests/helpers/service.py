"""The job registry read from outside, and a launcher that kills itself mid-submit (local and SLURM backends)."""

import json
import signal
import sqlite3
import subprocess
import sys
import tempfile
from contextlib import closing
from pathlib import Path
from typing import Dict, List

from helpers.app import app_env
from helpers.paths import REPO


def registered(prefix: str) -> Dict[str, dict]:
    """The registry's jobs whose name starts with ``prefix``, read straight from SQLite: name -> record fields."""
    from mmt.records.registry import Registry

    with closing(sqlite3.connect(Registry().path, timeout=30)) as db:
        db.row_factory = sqlite3.Row
        try:
            rows = db.execute("SELECT * FROM jobs WHERE name LIKE ?", (prefix + "%",)).fetchall()
        except sqlite3.OperationalError:  # no table yet: a new registry
            return {}
    return {row["name"]: {**dict(row), "result": json.loads(row["result"] or "null")} for row in rows}


# The registry's files (database, WAL, shared memory) that hold ``needle`` (argv: <needle> <file ...>). Read in a
# process of its own: opening and closing any of them in a process that also has the registry open through SQLite
# (this one does: the live page's client) drops that process's POSIX locks on it, and SQLite then reads a WAL it
# no longer protects ("database disk image is malformed", "How To Corrupt An SQLite Database File", 2.2).
_FILES_HOLDING = """
import json, sys
from pathlib import Path
needle = sys.argv[1].encode()
print(json.dumps([name for name in sys.argv[2:] if Path(name).is_file() and needle in Path(name).read_bytes()]))
"""


def registry_files_holding(needle: str) -> List[str]:
    """The registry's files whose bytes hold ``needle``."""
    from mmt.records.registry import Registry

    files = [str(path) for path in sorted(Registry().path.parent.glob("registry.sqlite*"))]
    assert files, "no registry"
    done = subprocess.run(
        [sys.executable, "-c", _FILES_HOLDING, needle, *files], capture_output=True, text=True, timeout=60, check=True
    )
    return json.loads(done.stdout)


# A launcher SIGKILLed mid-submit (as the OOM killer might). Watching the registry from outside and killing on the
# first record comes too late on a busy host: locally four jobs are submitted within milliseconds of being
# registered. The launcher kills its own process group instead, the moment it is about to hand submission ``nth``
# to its scheduler (``method``: a job locally, a group of jobs alike, one sbatch, on SLURM): the submissions before
# it made, the rest registered and never submitted.
KILLED_AT_SUBMIT = """
import os, runpy, signal, sys
from {module} import {backend} as Backend

submit, calls = Backend.{method}, []

def submit_until_killed(self, submission):
    calls.append(submission)
    if len(calls) == {nth} + 1:
        os.killpg(0, signal.SIGKILL)
    return submit(self, submission)

Backend.{method} = submit_until_killed
sys.argv = sys.argv[1:]
sys.path[0] = os.path.dirname(os.path.abspath(sys.argv[0]))  # as if the app were run itself: its dir first
runpy.run_path(sys.argv[0], run_name="__main__")
"""


def killed_at_submit(
    command: List[str],
    nth: int,
    tag: str,
    backend: str = "mmt.backends.local.backend:LocalBackend",
    method: str = "submit",
) -> None:
    """Run the app ``command`` (``python train.py -m ...``) until it kills itself about to make submission ``nth``
    (``backend``'s ``method``)."""
    module, name = backend.split(":")
    with tempfile.TemporaryDirectory() as scratch:
        wrapper = Path(scratch) / "killed_at_submit.py"
        wrapper.write_text(KILLED_AT_SUBMIT.format(module=module, backend=name, nth=nth, method=method))
        launcher = subprocess.run(
            [sys.executable, str(wrapper), *command[1:]],
            cwd=REPO,
            env=app_env(tag),
            capture_output=True,
            text=True,
            timeout=120,
            start_new_session=True,
        )
    assert launcher.returncode == -signal.SIGKILL, launcher.stderr[-3000:]
