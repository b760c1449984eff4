"""Runs ``train.py`` (a dry run) with mmt's job preparation timed: each job's prepare time and pickled payload size
go to the JSON file named by ``MMT_PLANNING_PROBE``. Used by bench_planning.py; nothing in mmt is changed."""

import json
import os
import runpy
import sys
import time
from pathlib import Path

import cloudpickle

from mmt.launching import prepare

_prepare_job = prepare.prepare_job
_samples = []


def timed_prepare_job(**kwargs):  # type: ignore[no-untyped-def]
    started = time.perf_counter()
    job = _prepare_job(**kwargs)
    seconds = time.perf_counter() - started
    _samples.append(
        {
            "num": job.prepared.plan.num,
            "seconds": seconds,
            "payload_bytes": len(cloudpickle.dumps(job.prepared.payload)),
        }
    )
    return job


prepare.prepare_job = timed_prepare_job
try:
    sys.argv = ["train.py", *sys.argv[1:]]
    runpy.run_path(str(Path(__file__).resolve().parents[1] / "train.py"), run_name="__main__")
except SystemExit as exit_:
    if exit_.code not in (0, None):
        raise
finally:
    Path(os.environ["MMT_PLANNING_PROBE"]).write_text(json.dumps(_samples))
