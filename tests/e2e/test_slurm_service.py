"""SLURM jobs that outlive their launcher: detached, after a lost terminal, after a killed launcher; re-attached with
`mmt wait`, followed with `mmt list`/`mmt logs`, stopped with `mmt stop`. On the real SLURM test cluster."""

import json
import re
import signal
import sqlite3
import stat
import subprocess
import sys
import time
from contextlib import closing
from pathlib import Path
from typing import List

import pytest

from helpers.app import app_command, app_env, results, run_app
from helpers.paths import REPO
from helpers.processes import from_a_terminal, wait_until
from helpers.service import killed_at_submit, registered

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


def _in_queue(job_ids: List[str]) -> List[str]:
    """Those of ``job_ids`` that SLURM still queues or runs (other tests' jobs left aside)."""
    out = subprocess.run(["squeue", "-h", "-o", "%i"], capture_output=True, text=True).stdout.split()
    return [job_id for job_id in job_ids if job_id in out]


def test_a_detached_job_returns_at_once_and_concludes_itself(tmp_path, tag):
    started = time.monotonic()
    done = run_app(
        *PROBE,
        "recipe.hold_s=6",
        "hydra.launcher.detach=true",
        "hydra.launcher.name=far",
        "+env.SECRET_TOKEN=s3cr3t-sl",
        sweep_dir=tmp_path,
        tag=tag,
        timeout=60,
    )
    elapsed = time.monotonic() - started
    assert done.returncode == 0, done.stderr[-3000:]
    # returns soon after submission: waiting for the job would add its start and 6 s hold (4 s: a loaded CI host)
    assert elapsed < 4 + _startup_s(tmp_path), f"{elapsed:.1f} s"
    assert "mmt: detached job 0 far-0 (SLURM job" in done.stdout
    wait_until(lambda: _row("far-0").get("status") == "Running", 60, "Running")
    wait_until(lambda: _row("far-0").get("status") == "Completed", 90, "Completed")  # concluded inside the allocation
    row = _row("far-0")
    assert row["metric"].startswith("seconds_to_first_collective=")
    [result] = results(tmp_path)
    assert result["status"] == "COMPLETED" and result["return_value"]["all_reduce"] == 10.0
    # the node agents sampled their own node: node 0 and node 1 of the job on two distinct nodes of the cluster
    samples = [
        [json.loads(line) for line in (tmp_path / "0" / "metrics" / f"node{n}.jsonl").read_text().splitlines()]
        for n in (0, 1)
    ]
    sampled = [{s["host"] for s in node} for node in samples]
    hosts = [r["hostname"] for r in result["return_value"]["ranks"]]
    assert all(samples) and sampled == [{hosts[0]}, {hosts[-1]}] and hosts[0] != hosts[-1], (sampled, hosts)
    # submitit's pickles hold the job's config and env: the owner's only
    pickles = list((tmp_path / ".submitit").rglob("*.pkl"))
    assert pickles and all(stat.S_IMODE(p.stat().st_mode) == 0o600 for p in pickles)
    assert not any(b"s3cr3t-sl" in p.read_bytes() for p in tmp_path.rglob("*") if p.is_file() and p.suffix != ".pkl")


def test_mmt_logs_of_rank_3_shows_rank_3s_own_output(tmp_path, tag):
    name = f"echo-{tag[:6]}"
    done = subprocess.run(
        [
            MMT,
            "run",
            "--name",
            name,
            "--cluster",
            "slurm",
            "--num-machines",
            "2",
            "--devices",
            "2",
            "--command-mode",
            "per_rank",
            "--command",
            'echo "from $RANK"',
            "--detach",
            "--set",
            f"hydra.sweep.dir={tmp_path}",
        ],
        cwd=REPO,
        env=app_env(tag),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    wait_until(lambda: _row(name).get("status") == "Completed", 90, "Completed")
    assert mmt("logs", name, "--rank", "3").stdout == "from 3\n"
    assert mmt("logs", name, "--rank", "2").stdout == "from 2\n"


def _startup_s(tmp_path) -> float:
    """What the same launch costs up to the submission: Hydra, composing, planning, validating (a dry run)."""
    started = time.monotonic()
    dry = run_app(*PROBE, "recipe.hold_s=6", "hydra.launcher.dry_run=true", sweep_dir=tmp_path / "dry")
    assert dry.returncode == 0, dry.stderr[-2000:]
    return time.monotonic() - started


def test_mmt_stop_cancels_a_detached_job_and_nothing_stays_queued(tmp_path, tag):
    done = run_app(
        *PROBE,
        "recipe.hold_s=120",
        "hydra.launcher.detach=true",
        "hydra.launcher.name=halt",
        sweep_dir=tmp_path,
        tag=tag,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    wait_until(lambda: _row("halt-0").get("status") == "Running", 60, "Running")
    stopped = mmt("stop", "halt-0")
    assert stopped.returncode == 0 and "cancelled" in stopped.stdout
    wait_until(lambda: _squeue() == "", 30, "the queue to empty")
    wait_until(lambda: (tmp_path / "0" / "result.json").exists(), 30, "the job's own result")
    assert results(tmp_path)[0]["status"] == "INTERRUPTED"
    assert mmt("wait", "halt-0").returncode == 1
    assert _row("halt-0")["status"] == "Stopped"


def _summary(output: str, sweep_dir: Path) -> List[List[str]]:
    """The summary table an mmt run printed, as lists of cells: its header, then each job's number, overrides, status
    and nodes x devices (its duration and metric differ run to run); then its notes (a failed job's reason), with
    the sweep dir they name as <sweep>."""
    text = output[output.index(f"mmt summary ({sweep_dir})") :].replace(str(sweep_dir), "<sweep>")
    lines = text.split("\n\n")[0].splitlines()[1:]
    rows = [line for line in lines[2:] if not line.startswith("  job ")]
    notes = [[line] for line in lines[2:] if line.startswith("  job ")]
    return [re.split(r"\s{2,}", lines[0])] + [re.split(r"\s{2,}", row)[:4] for row in rows] + notes


@pytest.mark.parametrize(
    "job, code", [(("recipe.hold_s=3",), 0), (("recipe.fail_rank=3",), 1)], ids=["completing", "failing"]
)
def test_an_attached_sweep_that_loses_its_terminal_runs_on_and_mmt_wait_reattaches(job, code, tmp_path, tag):
    attached = run_app(*PROBE, *job, sweep_dir=tmp_path / "attached", tag=tag, timeout=180)  # the same job, watched
    assert attached.returncode == code, attached.stdout[-3000:] + attached.stderr[-3000:]
    name = f"hup-{tag[:6]}"
    launcher = subprocess.Popen(
        app_command(*PROBE, *job, f"hydra.launcher.name={name}", sweep_dir=tmp_path / "hup"),
        cwd=REPO,
        env=app_env(tag),
        preexec_fn=from_a_terminal,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    seen = ""
    while "submitted as SLURM job" not in seen:  # printed from its watch loop: the jobs are submitted and watched
        line = launcher.stdout.readline()
        assert line, seen
        seen += line
    launcher.send_signal(signal.SIGHUP)  # the terminal goes before the job can have ended
    output, _ = launcher.communicate(timeout=30)
    assert f"1 job(s) run on, detached: {name}-0" in output
    if code == 0:  # (the failing one may have failed already)
        assert _in_queue([registered(name)[f"{name}-0"]["scheduler_id"]]), "the job keeps running"
    waited = mmt("wait", f"{name}-0", timeout=120)
    # the exit status and the summary the attached run had
    assert waited.returncode == code, waited.stdout + waited.stderr
    assert _summary(waited.stdout, tmp_path / "hup") == _summary(attached.stdout, tmp_path / "attached")
    assert [r["status"] for r in results(tmp_path / "hup")] == [r["status"] for r in results(tmp_path / "attached")]


def test_sigterm_to_an_attached_launcher_cancels_its_jobs_like_ctrl_c(tmp_path, tag):
    launcher = subprocess.Popen(
        app_command(*PROBE, "recipe.hold_s=120", sweep_dir=tmp_path),
        cwd=REPO,
        env=app_env(tag),
        preexec_fn=from_a_terminal,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    wait_until(lambda: (tmp_path / "0" / "logs").exists(), 90, "the job to run")
    job_id = json.loads((tmp_path / "0" / ".mmt" / "owner.json").read_text())["scheduler_id"]
    launcher.send_signal(signal.SIGTERM)
    output, _ = launcher.communicate(timeout=60)
    assert launcher.returncode == 128 + signal.SIGTERM, output[-3000:]
    assert "SIGTERM received; every rank of every job was stopped" in output
    assert results(tmp_path)[0]["status"] == "INTERRUPTED"
    wait_until(lambda: _in_queue([job_id]) == [], 30, "the job to leave the queue")
    state = subprocess.run(
        ["sacct", "-X", "-n", "-P", "-j", job_id, "-o", "State"], capture_output=True, text=True
    ).stdout
    assert state.startswith("CANCELLED"), state


def test_a_launcher_killed_mid_submit_leaves_no_job_pending_forever(tmp_path, tag):
    """Three submissions (jobs 0-1 alike: one job array; job 2 of 2 nodes, job 3 of 3: one job each); the launcher
    is killed as it is about to make the third."""
    prefix = f"cut-{tag[:6]}"
    killed_at_submit(
        app_command(
            "cluster=slurm",
            "recipe=probe",
            "num_nodes=1,1,2,3",
            "devices=1",
            f"hydra.launcher.name={prefix}",
            sweep_dir=tmp_path,
        ),
        2,
        tag,
        backend="mmt.backends.slurm.backend:SlurmBackend",
        method="_submit_group",
    )
    listed = mmt("list", "--json")
    assert listed.returncode == 0, listed.stderr
    records = registered(prefix)
    submitted = {name: r["scheduler_id"] for name, r in records.items() if r["scheduler_id"]}
    cut_off = sorted(set(records) - set(submitted))
    assert len(records) == 4 and len(submitted) == 3 and cut_off == [f"{prefix}-3"], records
    assert submitted[f"{prefix}-0"].endswith("_0") and submitted[f"{prefix}-1"].endswith("_1")
    # every SLURM job of the launch is one the registry knows (SLURM's job names: the array's, then job 2's)
    names = f"mmt-{prefix}-0-array,mmt-{prefix}-2,mmt-{prefix}-3"
    named = subprocess.run(
        ["squeue", "-h", "-r", "-t", "all", "-n", names, "-o", "%i"], capture_output=True, text=True
    ).stdout.split()
    assert sorted(named) == sorted(submitted.values())
    rows = {row["name"]: row for row in json.loads(listed.stdout)}
    for name in cut_off:
        assert rows[name]["status"] == "Failed"
        assert "ended before the job was submitted" in records[name]["result"]["error"]
    for name in submitted:  # they run on, unwatched, and conclude themselves
        wait_until(lambda name=name: _row(name).get("status") == "Completed", 120, f"{name} to complete")
    assert "has already ended (FAILED)" in mmt("stop", cut_off[0]).stdout
    assert mmt("wait", cut_off[0]).returncode == 1
    for name in records:
        assert mmt("delete", name).returncode == 0
    assert registered(prefix) == {} and _in_queue(list(submitted.values())) == []


def test_a_job_submitted_just_before_its_launcher_died_is_found_again(tmp_path, tag):
    prefix = f"lost-{tag[:6]}"
    done = run_app(
        "cluster=slurm",
        "recipe=probe",
        "num_nodes=1,1,2",  # jobs 0-1: a job array's tasks; job 2: a job of its own
        "devices=1",
        "recipe.hold_s=5",
        "hydra.launcher.detach=true",
        f"hydra.launcher.name={prefix}",
        sweep_dir=tmp_path,
        tag=tag,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    ids = {name: record["scheduler_id"] for name, record in registered(prefix).items()}
    assert len(ids) == 3 and all(ids.values())
    # what a launcher killed between sbatch and saving the id leaves: no id in the registry; for jobs 1 and 2, none
    # in the job dir's owner.json either (killed before it wrote that too)
    from mmt.records.registry import Registry

    with closing(sqlite3.connect(Registry().path, timeout=30)) as db, db:
        db.execute("UPDATE jobs SET scheduler_id = NULL WHERE name LIKE ?", (prefix + "%",))
    for job in (1, 2):
        owner = tmp_path / str(job) / ".mmt" / "owner.json"
        owner.write_text(json.dumps({k: v for k, v in json.loads(owner.read_text()).items() if k != "scheduler_id"}))
    rows = {row["name"]: row for row in json.loads(mmt("list", "--json").stdout)}
    assert {name: rows[name]["scheduler_id"] for name in ids} == ids
    assert {rows[name]["status"] for name in ids} <= {"Pending", "Running"}
    for name in ids:
        wait_until(lambda name=name: _row(name).get("status") == "Completed", 90, f"{name} to complete")


def test_a_rerun_after_a_killed_launcher_never_reads_the_old_jobs_files(tmp_path, tag):
    launcher = subprocess.Popen(
        app_command(*PROBE, "recipe.hold_s=15", sweep_dir=tmp_path),
        cwd=REPO,
        env=app_env(tag),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
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


def test_a_detached_job_cancelled_while_it_waits_in_the_queue_is_listed_as_ended(tmp_path, tag):
    # it never starts, so its own last step never runs: `mmt list` concludes it from what SLURM says
    done = run_app(
        *PROBE,
        "hydra.launcher.detach=true",
        f"hydra.launcher.name=queued-{tag[:6]}",
        "+hydra.launcher.sbatch_extra.begin=now+600",
        sweep_dir=tmp_path,
        tag=tag,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    name = f"queued-{tag[:6]}-0"
    wait_until(lambda: _row(name).get("status") == "Pending", 30, "Pending")
    job_id = _row(name)["scheduler_id"]
    subprocess.run(["scancel", job_id], check=True)
    wait_until(lambda: _row(name).get("status") == "Stopped", 30, "Stopped")
    [result] = results(tmp_path)
    assert result["status"] == "INTERRUPTED" and "cancelled outside the launcher" in result["error"]
    assert not (tmp_path / "0" / ".mmt" / "attempts" / result["attempt"] / "job.pkl").exists()  # its payload went
    assert mmt("delete", name).returncode == 0
