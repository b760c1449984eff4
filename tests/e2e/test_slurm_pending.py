"""SLURM jobs that wait in the queue, on the real test cluster (scripts/slurm_cluster.sh: three nodes of 4 CPUs): a job
that can never start is cancelled at once and FAILED with one line (what it asks, what the partition offers) instead
of pending forever; one that waits for a reason that resolves shows the reason (the launcher's console, `mmt list`,
`mmt inspect`) and waits; one that sbatch refuses outright is one line, not a traceback. (The reasons, their
classification and the message, pure: tests/unit/test_slurm_pending.py.)"""

import json
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from helpers.app import app_command, app_env, results, run_app
from helpers.paths import REPO
from helpers.processes import from_a_terminal, wait_until

pytestmark = pytest.mark.slurm
MMT = str(Path(sys.executable).with_name("mmt"))
PROBE = ("cluster=slurm", "recipe=probe", "devices=1")


@pytest.fixture(autouse=True)
def _cluster(slurm_cluster):
    yield


def _in_queue(job_id: str) -> bool:
    out = subprocess.run(["squeue", "-h", "-o", "%i"], capture_output=True, text=True).stdout.split()
    return job_id in out


def _cluster_nodes() -> int:
    """The nodes of the default partition (sinfo marks it with *)."""
    out = subprocess.run(["sinfo", "-h", "-o", "%P %D"], capture_output=True, text=True, check=True).stdout
    return sum(int(count) for name, count in (line.split() for line in out.splitlines()) if name.endswith("*"))


def mmt(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([MMT, *args], cwd=REPO, env=app_env(), capture_output=True, text=True, timeout=120)


def _row(name: str) -> dict:
    rows = {row["name"]: row for row in json.loads(mmt("list", "--json").stdout)}
    return rows.get(name, {})


def test_a_job_that_can_never_start_fails_at_once_with_one_line(tmp_path, tag):
    nodes = _cluster_nodes()
    name = f"never-{tag[:6]}"
    started = time.monotonic()
    done = run_app(
        *PROBE, f"num_nodes={nodes + 1}", f"hydra.launcher.name={name}", sweep_dir=tmp_path, tag=tag, timeout=120
    )
    elapsed = time.monotonic() - started
    assert done.returncode == 1, done.stdout[-3000:] + done.stderr[-3000:]
    assert elapsed < 40, f"{elapsed:.1f} s"  # the app's own start included; the job itself went within seconds
    [result] = results(tmp_path)
    assert result["status"] == "FAILED" and result["duration_s"] < 15
    job_id = result["scheduler_id"]
    line = result["error"].split(": ", 1)[1]  # after the job's label
    # what the job asks and what the partition offers, on one line; the reason is SLURM's own: more CPUs than the
    # partition has in all (PartitionConfig) or more nodes (PartitionNodeLimit), whichever slurmctld checks first
    assert "\n" not in line
    assert re.match(rf"SLURM job {job_id} can never start, so mmt cancelled it: Partition(Config|NodeLimit) \(", line)
    assert f"it asks {nodes + 1} nodes, {4 * (nodes + 1)} CPUs ({nodes + 1} tasks x 4 CPUs)" in line
    assert re.search(rf"; partition \S+ offers {nodes} nodes? \(\S+\) of \d+ CPUs and \d+ MB", line)
    assert line in done.stderr and line in done.stdout  # the summary, and Hydra's error
    assert "Traceback" not in done.stderr
    assert not _in_queue(job_id)  # cancelled, not left pending
    row = _row(f"{name}-0")
    assert row["status"] == "Failed" and re.fullmatch("Partition(Config|NodeLimit)", row["reason"])
    assert row["note"] == f"can never start: {row['reason']}"
    assert f"Failed (can never start: {row['reason']})" in mmt("list").stdout
    inspect = mmt("inspect", f"{name}-0").stdout
    assert re.search(rf"^error +job 0: SLURM job {job_id} can never start, so mmt cancelled it", inspect, re.M)


def test_a_job_waiting_for_a_reason_that_resolves_shows_it_and_waits(tmp_path, tag):
    name = f"later-{tag[:6]}"
    # begin in ten minutes: SLURM's BeginTime, which resolves by waiting
    command = app_command(
        *PROBE,
        "num_nodes=1",
        "+hydra.launcher.sbatch_extra.begin=now+600",
        f"hydra.launcher.name={name}",
        sweep_dir=tmp_path,
    )
    launcher = subprocess.Popen(
        command,
        cwd=REPO,
        env=app_env(tag),
        preexec_fn=from_a_terminal,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:

        def waiting() -> dict:
            time.sleep(0.5)
            row = _row(f"{name}-0")
            return row if row.get("reason") == "BeginTime" else {}

        row = wait_until(waiting, 60, "mmt list to show the job waiting for its BeginTime")
        assert (row["status"], row["note"]) == ("Pending", "BeginTime")
        assert "Pending (BeginTime)" in mmt("list").stdout
        inspect = mmt("inspect", f"{name}-0").stdout
        assert re.search(
            r"scheduler +waits in the queue since \d\d:\d\d: BeginTime \(its start time has not come "
            r"yet\)",
            inspect,
        ), inspect
        job_id = row["scheduler_id"]
        time.sleep(3)
        assert _in_queue(job_id) and launcher.poll() is None  # still waiting: a reason that resolves is not fatal
    finally:
        launcher.send_signal(signal.SIGINT)
        output, _ = launcher.communicate(timeout=60)
    assert launcher.returncode == 130, output[-3000:]
    assert (
        f"mmt: job 0 ({name}-0) waits in SLURM's queue (job {job_id}): BeginTime (its start time has not come "
        "yet)" in output
    )
    assert results(tmp_path)[0]["status"] == "INTERRUPTED"
    wait_until(lambda: not _in_queue(job_id), 30, "the cancelled job to leave the queue")


def test_a_job_sbatch_refuses_is_one_line_naming_the_request_and_the_partition(tmp_path, tag):
    # a machine of 8 CPUs on nodes of 4: sbatch itself refuses it ("CPU count per node can not be satisfied")
    done = run_app(*PROBE, "num_nodes=1", "machine=cpu_x_8", sweep_dir=tmp_path, tag=tag, timeout=120)
    assert done.returncode == 1
    assert "Traceback" not in done.stderr, done.stderr[-3000:]
    [line] = [text for text in done.stderr.splitlines() if "sbatch refused it" in text]
    assert "Requested node configuration is not available" in line
    assert "it asks 1 node(s) x 1 task(s) x 8 CPUs (machine cpu_x_8)" in line
    assert re.search(r"partition \S+ offers \d+ nodes? \(\S+\) of 4 CPUs", line)


def test_a_partition_the_cluster_lacks_is_one_line_naming_the_key_and_the_partitions_it_has(tmp_path, tag):
    done = run_app(*PROBE, "num_nodes=1", "hydra.launcher.partition=nope", sweep_dir=tmp_path, tag=tag, timeout=120)
    assert done.returncode == 1 and "Traceback" not in done.stderr, done.stderr[-3000:]
    [line] = [text for text in done.stderr.splitlines() if "sbatch refused it" in text]
    assert re.search(r"no partition nope on this cluster \(hydra\.launcher\.partition=nope; it has: \w+", line), line


def test_a_mixed_sweep_whose_second_job_sbatch_refuses_cancels_the_first_saying_why(tmp_path, tag):
    """machine=cpu,a100 on a cluster without GPUs: job 0 is submitted, sbatch refuses job 1. A launch is all or
    nothing: job 0 is cancelled, the console says so and why, and job 0's record says why (not "cancelled outside
    the launcher")."""
    name = f"mixed-{tag[:6]}"
    done = run_app(
        *PROBE,
        "num_nodes=1",
        "machine=cpu,a100",
        f"hydra.launcher.name={name}",
        sweep_dir=tmp_path,
        tag=tag,
        timeout=120,
    )
    assert done.returncode == 1 and "Traceback" not in done.stderr, done.stderr[-3000:]
    why = "the launch failed: job 1: sbatch refused it: Invalid generic resource (gres) specification"
    assert f"mmt: cancelled the job(s) this launch had submitted, #0 ({name}-0): {why}" in done.stdout, done.stdout

    def stopped() -> dict:
        time.sleep(0.5)
        row = _row(f"{name}-0")
        return row if row.get("status") == "Stopped" else {}

    row = wait_until(stopped, 60, "job 0 to be listed Stopped")
    job_id = row["scheduler_id"]
    wait_until(lambda: not _in_queue(job_id), 60, "the job to leave the queue")
    inspect = mmt("inspect", f"{name}-0").stdout
    assert re.search(rf"^error +job 0: stopped: {re.escape(why)}", inspect, re.M), inspect
    assert "outside the launcher" not in inspect
    assert f"{name}-1" not in mmt("list").stdout  # refused: never registered
