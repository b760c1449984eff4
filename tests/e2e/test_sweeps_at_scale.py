"""Issue 28: sweeps at cluster scale. On SLURM the jobs of a launch that share their sbatch resources go out as one
job array (one sbatch per group, each task a whole job of its own); a throttle bounds how many run at once on both
backends; a job may wait for others (``hydra.launcher.after``), and ends CANCELLED, in one line, when one of them
fails. On the real SLURM test cluster (3 nodes x 4 CPUs) and the local backend; the app is a Hydra app of the
test's own (not train.py), run as a user types it."""

import json
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Dict, List, Optional, Tuple

import pytest

from helpers.app import app_env, results
from helpers.processes import wait_until

PY = sys.executable
MMT = str(Path(sys.executable).with_name("mmt"))

# x: the point of the sweep; sleep: how long the job takes; slow: the one x that takes slow_s instead;
# fail: the one x that fails (exit code 3)
APP = """
import time, hydra

@hydra.main(version_base="1.3", config_path=None, config_name=None)
def main(cfg):
    x = int(cfg.get("x", 0))
    time.sleep(float(cfg.slow_s) if cfg.get("slow") is not None and x == int(cfg.slow) else float(cfg.get("sleep", 0)))
    if cfg.get("fail") is not None and x == int(cfg.fail):
        raise SystemExit(3)
    return x

if __name__ == "__main__":
    main()
"""


def _app(tmp_path: Path) -> Path:
    app = tmp_path / "sweep_app.py"
    app.write_text(APP)
    return app


def _command(app: Path, cluster: str, sweep_dir: Path, *overrides: str) -> List[str]:
    return [PY, str(app), "-m", f"hydra/launcher=mmt_{cluster}", *overrides, f"hydra.sweep.dir={sweep_dir}"]


def _run(
    app: Path, cluster: str, sweep_dir: Path, *overrides: str, tag: str, timeout: float = 240
) -> subprocess.CompletedProcess:
    return subprocess.run(
        _command(app, cluster, sweep_dir, *overrides),
        cwd=app.parent,
        env=app_env(tag),
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def _start(app: Path, cluster: str, sweep_dir: Path, *overrides: str, tag: str) -> subprocess.Popen:
    return subprocess.Popen(
        _command(app, cluster, sweep_dir, *overrides),
        cwd=app.parent,
        env=app_env(tag),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


def mmt(*args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run([MMT, *args], env=app_env(), capture_output=True, text=True, timeout=timeout)


def _rows() -> Dict[str, dict]:
    return {row["name"]: row for row in json.loads(mmt("list", "--all", "--json").stdout)}


def _most_at_once(spans: List[Tuple[float, float]]) -> int:
    """The most of ``spans`` (start, end) that overlap at one moment."""
    events = sorted([(start, 1) for start, _ in spans] + [(end, -1) for _, end in spans])
    running = most = 0
    for _, step in events:
        running += step
        most = max(most, running)
    return most


def _spans(sweep_dir: Path) -> List[Tuple[float, float]]:
    return [(r["started_at"], r["ended_at"]) for r in results(sweep_dir)]


# ------------------------------------------------------------------------------------------------------ SLURM


def _sdiag_submits() -> int:
    """slurmctld's count of sbatch submissions so far (sdiag: REQUEST_SUBMIT_BATCH_JOB)."""
    out = subprocess.run(["sdiag"], capture_output=True, text=True, check=True).stdout
    return int(re.search(r"REQUEST_SUBMIT_BATCH_JOB\s+\(\s*\d+\)\s+count:(\d+)", out).group(1))


def _squeue(name: str) -> List[Tuple[str, str]]:
    """(job id, state) of every task of this user's jobs called ``name`` (SLURM's job name), one row per task."""
    out = subprocess.run(
        ["squeue", "-h", "-r", "-n", name, "-o", "%i|%T"], capture_output=True, text=True, check=True
    ).stdout
    return [tuple(line.split("|", 1)) for line in out.split()]  # type: ignore[misc]


def _alloc_cpus(job_ids: List[str]) -> Dict[str, int]:
    out = subprocess.run(
        ["sacct", "-X", "-n", "-P", "-j", ",".join(job_ids), "-o", "JobID,AllocCPUS"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    return {job_id: int(cpus) for job_id, cpus in (line.split("|") for line in out.split())}


@pytest.mark.slurm
def test_a_sweep_goes_out_as_one_job_array_per_resource_group_each_job_with_its_own_resources(
    slurm_cluster, tmp_path, tag
):
    """machine=cpu,cpu_x_2: two groups (4 and 2 CPUs per task), so two sbatch calls for four jobs; each task is a
    job of its own (job dir, result, registry row), with its group's resources."""
    app = _app(tmp_path)
    before = _sdiag_submits()
    done = _run(
        app, "slurm", tmp_path / "sweep", "+machine=cpu,cpu_x_2", "+x=0,1", "hydra.launcher.name=groups", tag=tag
    )
    submits = _sdiag_submits() - before
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert submits == 2, f"{submits} sbatch calls for 2 resource groups"
    found = results(tmp_path / "sweep")
    assert [r["status"] for r in found] == ["COMPLETED"] * 4
    assert [r["return_value"] for r in found] == [0, 1, 0, 1]
    arrays: Dict[str, set] = {}
    for result in found:
        array, index = result["scheduler_id"].split("_")
        arrays.setdefault(result["machine"], set()).add(array)
    assert len(arrays["cpu"]) == len(arrays["cpu_x_2"]) == 1 and arrays["cpu"] != arrays["cpu_x_2"], arrays
    ids = [r["scheduler_id"] for r in found]
    # slurmdbd records a job a moment after it ends: wait until it has all four
    wait_until(lambda: set(_alloc_cpus(ids)) >= set(ids), 30, "sacct to record every task")
    cpus = _alloc_cpus(ids)
    assert {r["machine"]: cpus[r["scheduler_id"]] for r in found} == {"cpu": 4, "cpu_x_2": 2}, cpus
    rows = _rows()
    assert [rows[f"groups-{n}"]["scheduler_id"] for n in range(4)] == [r["scheduler_id"] for r in found]
    assert "submitted as SLURM job array" in done.stdout + done.stderr


@pytest.mark.slurm
def test_a_throttle_of_three_keeps_at_most_three_tasks_of_a_twelve_job_sweep_running(slurm_cluster, tmp_path, tag):
    """The cluster has room for all 12 (3 nodes x 4 CPUs); hydra.launcher.max_parallel_jobs=3 (%3) runs 3."""
    app = _app(tmp_path)
    launcher = _start(
        app,
        "slurm",
        tmp_path / "sweep",
        "+x=range(12)",
        "+sleep=2",
        "hydra.launcher.max_parallel_jobs=3",
        "hydra.launcher.name=throttled",
        tag=tag,
    )
    most, seen_pending = 0, False
    while launcher.poll() is None:
        tasks = _squeue("mmt-throttled-0-array")
        most = max(most, sum(state == "RUNNING" for _, state in tasks))
        seen_pending = seen_pending or any(state == "PENDING" for _, state in tasks)
        time.sleep(0.2)
    output = launcher.stdout.read()
    assert launcher.returncode == 0, output[-3000:]
    assert [r["status"] for r in results(tmp_path / "sweep")] == ["COMPLETED"] * 12
    assert 2 <= most <= 3 and seen_pending, (most, seen_pending)
    assert _most_at_once(_spans(tmp_path / "sweep")) <= 3
    assert "at most 3 at once" in output


@pytest.mark.slurm
def test_a_failing_task_fails_alone_and_mmt_stop_of_one_job_stops_only_its_task(slurm_cluster, tmp_path, tag):
    app = _app(tmp_path)
    launcher = _start(
        app,
        "slurm",
        tmp_path / "sweep",
        "+x=range(4)",
        "+fail=1",
        "+slow=2",
        "+slow_s=120",
        "+sleep=3",
        "hydra.launcher.name=partly",
        tag=tag,
    )
    wait_until(lambda: _rows().get("partly-2", {}).get("state") == "RUNNING", 60, "job 2 running")
    stopped = mmt("stop", "partly-2")
    assert stopped.returncode == 0 and "cancelled" in stopped.stdout, stopped.stdout + stopped.stderr
    output = launcher.communicate(timeout=120)[0]
    found = results(tmp_path / "sweep")
    assert [r["status"] for r in found] == ["COMPLETED", "FAILED", "INTERRUPTED", "COMPLETED"], output[-3000:]
    assert "exited with code 3" in found[1]["error"]
    assert "job 1: rank 0 (node 0) exited with code 3" in output
    assert found[2]["scheduler_id"] in found[2]["error"]
    rows = _rows()
    assert [rows[f"partly-{n}"]["state"] for n in range(4)] == ["COMPLETED", "FAILED", "INTERRUPTED", "COMPLETED"]
    assert _squeue("mmt-partly-0-array") == []


def _after_failing_and_completed(app: Path, cluster: str, tmp_path: Path, tag: str) -> Tuple[dict, dict]:
    """prep-ok and prep-bad detached (15 s each; prep-bad then fails), then, while both run, one job after each
    (two launches at once). Returns the results of the job after prep-bad and of the one after prep-ok. (With 5 s,
    under CI's load prep-bad had sometimes failed before the launch after it composed, which is then refused up
    front, rightly: a job after a failed one could never start.)"""
    for name, fails in (("prep-ok", False), ("prep-bad", True)):
        overrides = ["+x=0", "+sleep=15", f"hydra.launcher.name={cluster}-{name}", "hydra.launcher.detach=true"]
        detached = _run(app, cluster, tmp_path / name, *overrides, *(["+fail=0"] if fails else []), tag=tag)
        assert detached.returncode == 0, detached.stdout[-2000:] + detached.stderr[-2000:]
    waiting = _start(app, cluster, tmp_path / "a", "+x=1", f"hydra.launcher.after=[{cluster}-prep-bad]", tag=tag)
    runs = _start(app, cluster, tmp_path / "b", "+x=1", f"hydra.launcher.after=[{cluster}-prep-ok]", tag=tag)
    waiting_output, runs_output = waiting.communicate(timeout=120)[0], runs.communicate(timeout=120)[0]
    assert waiting.returncode == 1, waiting_output[-3000:]
    found = results(tmp_path / "a")
    assert len(found) == 1, waiting_output[-3000:]
    [cancelled] = found
    line = f"job 0: cancelled: it runs after {cluster}-prep-bad-0, which ended FAILED (hydra.launcher.after)"
    assert cancelled["status"] == "CANCELLED" and cancelled["error"] == line, cancelled
    assert line in waiting_output
    assert runs.returncode == 0, runs_output[-3000:]
    [after] = results(tmp_path / "b")
    [before] = results(tmp_path / "prep-ok")
    assert after["status"] == "COMPLETED" and after["started_at"] >= before["ended_at"] - 1.0, (after, before)
    rows = _rows()
    assert (rows[cancelled["name"]]["state"], rows[after["name"]]["state"]) == ("CANCELLED", "COMPLETED")
    return after, before


@pytest.mark.slurm
def test_after_a_failing_job_ends_cancelled_in_one_line_and_after_a_completed_one_runs_on_slurm(
    slurm_cluster, tmp_path, tag
):
    after, before = _after_failing_and_completed(_app(tmp_path), "slurm", tmp_path, tag)
    script = next((tmp_path / "b" / ".submitit").glob("*/*_submission.sh")).read_text()
    assert f"#SBATCH --dependency=afterok:{before['scheduler_id']}" in script
    assert "#SBATCH --kill-on-invalid-dep=yes" in script


@pytest.mark.slurm
def test_mmt_stop_of_a_launch_cancels_every_task_of_a_thousand_job_sweep(slurm_cluster, tmp_path, tag):
    """A 1,000-job sweep goes out in one sbatch (submitted detached: the launcher returns once it is queued), and
    `mmt stop <launch>` cancels all of its tasks in one scancel, leaving nothing queued."""
    app = _app(tmp_path)
    before = _sdiag_submits()
    try:
        done = _run(
            app,
            "slurm",
            tmp_path / "sweep",
            "+x=range(1000)",
            "+sleep=600",  # none ends before the stop
            "hydra.launcher.max_parallel_jobs=2",
            "hydra.launcher.name=huge",
            "hydra.launcher.detach=true",
            tag=tag,
            timeout=300,
        )
        assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
        assert _sdiag_submits() - before == 1
        assert len(_squeue("mmt-huge-0-array")) == 1000
        rows = [row for name, row in _rows().items() if name.startswith("huge-")]
        assert len(rows) == 1000
        stopped = mmt("stop", "huge")
        assert stopped.returncode == 0, stopped.stderr
        assert re.search(r"1000 jobs: SLURM job\(s\) \d+_\[0-999\] cancelled", stopped.stdout), stopped.stdout
        wait_until(lambda: _squeue("mmt-huge-0-array") == [], 60, "every task gone from the queue")
        rows = [row for name, row in _rows().items() if name.startswith("huge-")]
        assert {row["status"] for row in rows} == {"Stopped"}, {row["status"] for row in rows}
    finally:
        subprocess.run(["scancel", "--name", "mmt-huge-0-array"], capture_output=True)


# ------------------------------------------------------------------------------------------------------ local


def test_a_throttle_of_three_bounds_the_local_backend_too(tmp_path, tag):
    app = _app(tmp_path)
    done = _run(
        app,
        "local",
        tmp_path / "sweep",
        "+x=range(12)",
        "+sleep=1",
        "hydra.launcher.max_parallel_jobs=3",
        "hydra.launcher.max_parallel_ranks=12",
        tag=tag,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert [r["status"] for r in results(tmp_path / "sweep")] == ["COMPLETED"] * 12
    assert 2 <= _most_at_once(_spans(tmp_path / "sweep")) <= 3


def test_after_a_failing_job_ends_cancelled_and_after_a_completed_one_runs_on_the_local_backend(tmp_path, tag):
    _after_failing_and_completed(_app(tmp_path), "local", tmp_path, tag)


def _refused(done: subprocess.CompletedProcess) -> Optional[str]:
    lines = [line for line in (done.stdout + done.stderr).splitlines() if "hydra.launcher.after" in line]
    return lines[0] if len(lines) == 1 else None


@pytest.mark.parametrize("cluster", ["local", pytest.param("slurm", marks=pytest.mark.slurm)])
def test_a_dependency_on_a_job_that_does_not_exist_is_refused_before_anything_starts(request, cluster, tmp_path, tag):
    if cluster == "slurm":
        request.getfixturevalue("slurm_cluster")
    app = _app(tmp_path)
    done = _run(
        app,
        cluster,
        tmp_path / "sweep",
        "+x=0,1",
        "hydra.launcher.after=[no-such-job]",
        f"hydra.launcher.name=orphan{tag[:6]}",
        tag=tag,
    )
    assert done.returncode == 1
    assert _refused(done) == (
        "Invalid hydra.launcher.after='no-such-job': no registered job or launch has that name. HINT: `mmt list` "
        "shows the registered jobs; a launch's jobs are <hydra.launcher.name>-<n>"
    ), done.stdout + done.stderr
    assert results(tmp_path / "sweep") == []
    assert not any(name.startswith(f"orphan{tag[:6]}-") for name in _rows())
