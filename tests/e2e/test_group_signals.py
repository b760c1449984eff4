"""A signal to the launcher's whole process group (`kill -TERM -- -PGID`: what `timeout`, a CI runner or a terminal's
hang-up sends) ends an attached job as the same signal to the launcher alone does (docs/failures.md): exit 128 +
the signal, the job's result written naming it, nothing left running, no traceback. The host agent used to be in
that group: it went first, and the launcher died on the broken connection (exit 1, no result.json)."""

import json
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

from helpers.app import app_command, app_env
from helpers.paths import REPO
from helpers.processes import wait_gone, wait_until

STARTED = "command='echo started; sleep 60'"


def _launch_and_signal(tmp_path: Path, tag: str, signum: int, *overrides: str) -> subprocess.CompletedProcess:
    sweep = tmp_path / "sweep"
    process = subprocess.Popen(
        app_command(*overrides, STARTED, sweep_dir=sweep),
        cwd=REPO,
        env=app_env(tag),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,  # its own process group, as a shell's job or a CI runner's step is
    )
    logs = sweep / "0" / "logs"
    wait_until(
        lambda: process.poll() is not None or any("started" in p.read_text() for p in logs.glob("node*.log")),
        180,
        "the job's command",
    )
    assert process.poll() is None, process.communicate()[0][-3000:]
    time.sleep(0.5)
    os.killpg(process.pid, signum)
    out, _ = process.communicate(timeout=120)
    return subprocess.CompletedProcess(process.args, process.returncode, out, "")


@pytest.mark.parametrize(
    "signum, overrides",
    [
        (signal.SIGTERM, ("num_nodes=2",)),
        (signal.SIGINT, ("num_nodes=2",)),
        (signal.SIGHUP, ("num_nodes=2",)),
        (signal.SIGTERM, ("num_nodes=2:3",)),
    ],
    ids=["term", "int", "hup", "term-elastic"],
)
def test_a_signal_to_the_launchers_process_group_ends_the_job_as_it_would_the_launcher_alone(
    tmp_path, tag, signum, overrides
):
    done = _launch_and_signal(tmp_path, tag, signum, "recipe=probe", *overrides)
    name = signal.Signals(signum).name
    assert done.returncode == 128 + signum, done.stdout[-3000:]
    assert "Traceback" not in done.stdout, done.stdout[-3000:]
    result = json.loads((tmp_path / "sweep" / "0" / "result.json").read_text())
    assert result["status"] == "INTERRUPTED" and name in result["error"], result
    assert wait_gone(tag) == []


@pytest.mark.slurm
def test_a_sigterm_to_the_launchers_process_group_ends_a_slurm_job_with_its_result(slurm_cluster, tmp_path, tag):
    done = _launch_and_signal(
        tmp_path,
        tag,
        signal.SIGTERM,
        "cluster=slurm",
        "recipe=probe",
        "num_nodes=2",
        "hydra.launcher.poll_interval_s=0.5",
    )
    assert done.returncode == 143, done.stdout[-3000:]
    assert "Traceback" not in done.stdout
    result = json.loads((tmp_path / "sweep" / "0" / "result.json").read_text())
    assert result["status"] == "INTERRUPTED" and "SIGTERM" in result["error"], result
