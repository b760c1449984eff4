"""The code that runs is the code you launched, on the real SLURM test cluster (docs/snapshots.md): a sweep queued
behind a throttle of 1 (a job array's %1) whose files are edited, added and deleted while job 0 runs and job 1 waits
in SLURM's queue; and a job requeued by SLURM (`scontrol requeue`) after an edit, whose next run starts from the top
and imports everything again. Every run returns the values of the code as launched."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from helpers.processes import wait_until
from helpers.snapshot_app import LAUNCHED, app_run, edit_after_launch, make_app, results

pytestmark = pytest.mark.slurm

SLURM = ("hydra/launcher=mmt_slurm", "hydra.launcher.poll_interval_s=0.5", "hydra.launcher.metrics_interval_s=0")
MMT = str(Path(sys.executable).with_name("mmt"))


@pytest.fixture(autouse=True)
def _cluster(slurm_cluster):
    yield


def _expect_launched(result: dict, app: Path) -> None:
    value, tree = result["return_value"], result["snapshot"]["dir"]
    assert result["status"] == "COMPLETED", result
    assert {k: value[k] for k in LAUNCHED} == LAUNCHED, value
    assert value["data"] == "data as launched" and value["late_file"] == f"{tree}/late.py"
    assert value["original_cwd"] == str(app)


def test_a_sweep_queued_behind_a_throttle_runs_the_code_as_launched(tmp_path, tag):
    app = make_app(tmp_path / "project")
    gate = tmp_path / "gate"
    process = app_run(
        app,
        *SLURM,
        "x=0,1",
        f"gate={gate}",
        "hydra.launcher.max_parallel_jobs=1",
        f"hydra.launcher.snapshot.dir={tmp_path / 'store'}",
        tag=tag,
    )
    wait_until(lambda: (tmp_path / "started.0.0").exists() or process.poll() is not None, 180, "job 0 at its gate")
    assert process.poll() is None, (tmp_path / "out.txt").read_text()[-3000:]
    assert not (tmp_path / "started.1.0").exists()  # job 1 waits in SLURM's queue (%1)
    edit_after_launch(app)
    gate.touch()
    assert process.wait(timeout=300) == 0, (tmp_path / "out.txt").read_text()[-3000:]
    first, second = results(next((app / "multirun").glob("*/*")))
    assert first["snapshot"] == second["snapshot"] and first["snapshot"]["dirty"] is True
    for result in (first, second):
        _expect_launched(result, app)


def _row(name: str) -> dict:
    done = subprocess.run([MMT, "list", "--json"], capture_output=True, text=True, timeout=60)
    return {row["name"]: row for row in json.loads(done.stdout or "[]")}.get(name, {})


def test_a_job_slurm_requeues_after_an_edit_runs_the_launched_code_again(tmp_path, tag):
    app = make_app(tmp_path / "project")
    gate, started = tmp_path / "gate", tmp_path / "started.0.0"
    name = f"snaprq{tmp_path.name[-6:]}".replace("_", "")
    process = app_run(
        app,
        *SLURM,
        f"gate={gate}",
        "hydra.launcher.detach=true",
        f"hydra.launcher.name={name}",
        f"hydra.launcher.snapshot.dir={tmp_path / 'store'}",
        tag=tag,
    )
    assert process.wait(timeout=120) == 0, (tmp_path / "out.txt").read_text()[-3000:]
    wait_until(started.exists, 180, "the job at its gate")
    job_id = str(_row(f"{name}-0")["scheduler_id"])
    edit_after_launch(app)
    started.unlink()
    requeued = subprocess.run(["scontrol", "requeue", job_id], capture_output=True, text=True)
    assert requeued.returncode == 0, requeued.stderr
    wait_until(started.exists, 180, "the requeued run at its gate")  # it started again from the top
    gate.touch()
    waited = subprocess.run([MMT, "wait", f"{name}-0"], capture_output=True, text=True, timeout=300)
    assert waited.returncode == 0, waited.stdout + waited.stderr
    [result] = results(next((app / "multirun").glob("*/*")))
    assert len(result["requeues"]) == 1, result
    _expect_launched(result, app)
