"""SLURM jobs that outlive their launcher: detached, after a lost terminal, after a killed launcher; re-attached with
`mmt wait`, followed with `mmt list`/`mmt logs`, stopped with `mmt stop`. On the real two-node test cluster."""

import json
import signal
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import REPO, app_command, app_env, from_a_terminal, results, run_app, wait_until

pytestmark = pytest.mark.slurm
PY = sys.executable
MMT = str(Path(sys.executable).with_name("mmt"))
PROBE = ("cluster=slurm", "recipe=probe", "num_nodes=2", "devices=2")


@pytest.fixture(autouse=True)
def _cluster(slurm_cluster):
    yield


def _squeue() -> str:
    return subprocess.run(["squeue", "-h", "-o", "%i"], capture_output=True, text=True).stdout.strip()


def mmt(*args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run([MMT, *args], cwd=REPO, env=app_env(), capture_output=True, text=True, timeout=timeout)


def _row(name: str) -> dict:
    rows = json.loads(mmt("list", "--json").stdout)
    return {row["name"]: row for row in rows}.get(name, {})


def test_a_detached_job_returns_at_once_and_concludes_itself(tmp_path, tag):
    started = time.monotonic()
    done = run_app(*PROBE, "recipe.hold_s=6", "hydra.launcher.detach=true", "hydra.launcher.name=far",
                   "+env.SECRET_TOKEN=s3cr3t-sl", sweep_dir=tmp_path, tag=tag, timeout=60)
    elapsed = time.monotonic() - started
    assert done.returncode == 0, done.stderr[-3000:]
    assert elapsed < 2 + _startup_s(tmp_path), f"{elapsed:.1f} s"  # returns within 2 s of submission
    assert "mmt: detached job 0 far-0 (SLURM job" in done.stdout
    wait_until(lambda: _row("far-0").get("status") == "Running", 60, "Running")
    wait_until(lambda: _row("far-0").get("status") == "Completed", 90, "Completed")  # concluded inside the allocation
    row = _row("far-0")
    assert row["metric"].startswith("seconds_to_first_collective=")
    [result] = results(tmp_path)
    assert result["status"] == "COMPLETED" and result["return_value"]["all_reduce"] == 10.0
    rank3 = (tmp_path / "0" / "logs" / "node1.rank3.log").read_text()
    assert mmt("logs", "far-0", "--rank", "3").stdout == rank3
    # submitit's pickles hold the job's config and env: the owner's only
    pickles = list((tmp_path / ".submitit").rglob("*.pkl"))
    assert pickles and all(stat.S_IMODE(p.stat().st_mode) == 0o600 for p in pickles)
    assert not any(b"s3cr3t-sl" in p.read_bytes() for p in tmp_path.rglob("*") if p.is_file() and p.suffix != ".pkl")


def _startup_s(tmp_path) -> float:
    started = time.monotonic()
    run_app("hydra.launcher.dry_run=true", sweep_dir=tmp_path / "dry")
    return time.monotonic() - started


def test_mmt_stop_cancels_a_detached_job_and_nothing_stays_queued(tmp_path, tag):
    done = run_app(*PROBE, "recipe.hold_s=120", "hydra.launcher.detach=true", "hydra.launcher.name=halt",
                   sweep_dir=tmp_path, tag=tag, timeout=60)
    assert done.returncode == 0, done.stderr[-3000:]
    wait_until(lambda: _row("halt-0").get("status") == "Running", 60, "Running")
    stopped = mmt("stop", "halt-0")
    assert stopped.returncode == 0 and "cancelled" in stopped.stdout
    wait_until(lambda: _squeue() == "", 30, "the queue to empty")
    wait_until(lambda: (tmp_path / "0" / "result.json").exists(), 30, "the job's own result")
    assert results(tmp_path)[0]["status"] == "INTERRUPTED"
    assert mmt("wait", "halt-0").returncode == 1
    assert _row("halt-0")["status"] == "Stopped"


def test_an_attached_sweep_that_loses_its_terminal_runs_on_and_mmt_wait_reattaches(tmp_path, tag):
    launcher = subprocess.Popen(app_command(*PROBE, "recipe.hold_s=8", "hydra.launcher.name=hup", sweep_dir=tmp_path),
                                cwd=REPO, env=app_env(tag), preexec_fn=from_a_terminal,
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    wait_until(lambda: (tmp_path / "0" / "logs").exists() and _squeue(), 60, "the job to run")
    launcher.send_signal(signal.SIGHUP)
    output, _ = launcher.communicate(timeout=30)
    assert "1 job(s) run on, detached: hup-0" in output
    assert _squeue() != "", "the job keeps running"
    waited = mmt("wait", "hup-0", timeout=120)
    assert waited.returncode == 0, waited.stdout + waited.stderr  # the attached run's exit status
    assert "COMPLETED" in waited.stdout and "hup-0" not in waited.stderr
    assert results(tmp_path)[0]["status"] == "COMPLETED"


def test_a_rerun_after_a_killed_launcher_never_reads_the_old_jobs_files(tmp_path, tag):
    launcher = subprocess.Popen(app_command(*PROBE, "recipe.hold_s=15", sweep_dir=tmp_path), cwd=REPO,
                                env=app_env(tag), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    wait_until(lambda: (tmp_path / "0" / "logs").exists(), 60, "the job to start")
    time.sleep(2)
    launcher.kill()  # SIGKILL: the SLURM job runs on, unwatched
    launcher.wait()
    refused = run_app(*PROBE, "recipe.hold_s=1", sweep_dir=tmp_path, tag=tag, timeout=60)
    assert refused.returncode != 0
    assert "which outlived its launcher and is still running" in refused.stderr
    wait_until(lambda: _squeue() == "", 90, "the first job to end")
    first = results(tmp_path)[0]  # written inside the allocation, with no launcher watching
    assert first["status"] == "COMPLETED"
    rerun = run_app(*PROBE, "recipe.hold_s=3", sweep_dir=tmp_path, tag=tag, timeout=120)
    assert rerun.returncode == 0, rerun.stderr[-3000:]
    second = results(tmp_path)[0]
    assert second["status"] == "COMPLETED" and second["attempt"] != first["attempt"]
    assert second["scheduler_id"] != first["scheduler_id"] and second["duration_s"] > 3
