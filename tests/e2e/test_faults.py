"""Faults: a rank that raises, exits 137, or hangs; Ctrl-C, SIGTERM and SIGKILL to the launcher.

Every test runs under the ``tag`` fixture, which fails if any process of the test is left in the process table.
"""

import signal
import subprocess
import time

import pytest

from helpers.app import app_command, app_env, results, run_app
from helpers.paths import REPO
from helpers.processes import from_a_terminal, tagged_pids, wait_gone

PROBE_2X2 = ("recipe=probe", "num_nodes=2", "devices=2")


def _failed(tmp_path):
    [result] = results(tmp_path)
    assert result["status"] == "FAILED"
    return result


def test_a_rank_that_raises_fails_the_job_with_its_exception_and_traceback(tmp_path, tag):
    done = run_app(*PROBE_2X2, "recipe.fail_rank=2", sweep_dir=tmp_path, tag=tag)
    assert done.returncode == 1
    result = _failed(tmp_path)
    failure = result["failure"]
    assert (failure["rank"], failure["node_rank"]) == (2, 1)
    assert failure["exception"] == "ProbeFault: injected failure on rank 2"
    assert 'raise ProbeFault(f"injected failure on rank {rank.rank}")' in failure["traceback"]
    assert failure["log"].endswith("logs/node1.rank2.log")
    # the others were blocked joining the process group: stopped by the launcher, promptly
    assert result["stop_latency_s"] < 2.0
    assert "rank 2 (node 1) raised ProbeFault: injected failure on rank 2" in done.stderr
    assert "FAILED" in done.stdout


def test_a_rank_that_exits_137_fails_the_job_naming_it(tmp_path, tag):
    done = run_app(
        *PROBE_2X2, "recipe.fail_rank=1", "recipe.fail_mode=exit", "recipe.exit_code=137", sweep_dir=tmp_path, tag=tag
    )
    assert done.returncode == 1
    failure = _failed(tmp_path)["failure"]
    assert (failure["rank"], failure["exit_code"], failure["exception"]) == (1, 137, None)
    assert "rank 1 (node 0) exited with code 137" in done.stderr
    assert _failed(tmp_path)["stop_latency_s"] < 2.0


def test_a_rank_that_hangs_past_the_time_limit_is_named_and_stopped(tmp_path, tag):
    started = time.monotonic()
    done = run_app(
        *PROBE_2X2,
        "recipe.fail_rank=3",
        "recipe.fail_mode=hang",
        "recipe.fail_at=end",
        # long enough for ranks 0-2 to reach the end on a loaded CI host (6 s was not, once)
        "hydra.launcher.timeout_min=0.25",
        sweep_dir=tmp_path,
        tag=tag,
    )
    elapsed = time.monotonic() - started
    assert done.returncode == 1
    result = results(tmp_path)[0]
    assert result["status"] == "TIMEOUT"
    assert "timed out after 15 s; still running at the limit: rank 3 (node 1)" in result["error"]
    assert result["stop_latency_s"] < 2.0
    assert elapsed < 15 + 15, "the time limit was not enforced"


def test_one_failing_job_does_not_stop_the_other_jobs_of_the_sweep(tmp_path, tag):
    done = run_app(*PROBE_2X2, "recipe.fail_rank=null,0", sweep_dir=tmp_path, tag=tag)
    assert done.returncode == 1  # Hydra's sweeper re-raises the failed job's error after the batch
    good, bad = results(tmp_path)
    assert good["status"] == "COMPLETED" and good["return_value"]["all_reduce"] == 10.0
    assert bad["status"] == "FAILED" and bad["failure"]["rank"] == 0
    assert "ProbeFault" in bad["failure"]["exception"]


def _start_holding_sweep(tmp_path, tag):
    """Two concurrent 2x2 jobs whose ranks stay alive for a minute; returns once all 8 ranks run."""
    command = app_command(
        *PROBE_2X2[:1],
        "num_nodes=2",
        "devices=2,1",
        "recipe.hold_s=60",
        "hydra.launcher.max_parallel_ranks=8",
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
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        # launcher + agent + 4 + 2 ranks
        if len(tagged_pids(tag)) >= 8 and all((tmp_path / str(j) / "logs").exists() for j in (0, 1)):
            time.sleep(1.0)  # let the ranks get into their collectives
            return launcher
        time.sleep(0.2)
    launcher.kill()
    pytest.fail(f"the ranks did not start: {launcher.communicate()[0]}")


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_ctrl_c_or_sigterm_to_the_launcher_stops_every_rank_of_every_job(sig, tmp_path, tag):
    launcher = _start_holding_sweep(tmp_path, tag)
    launcher.send_signal(sig)
    output, _ = launcher.communicate(timeout=30)
    assert launcher.returncode != 0
    assert wait_gone(tag, timeout_s=5) == []
    statuses = [r["status"] for r in results(tmp_path)]
    assert statuses == ["INTERRUPTED", "INTERRUPTED"], output
    assert f"the launcher received {sig.name}" in results(tmp_path)[0]["error"]


def test_a_killed_launcher_leaves_no_rank_behind(tmp_path, tag):
    launcher = _start_holding_sweep(tmp_path, tag)
    launcher.kill()  # SIGKILL: no handler runs; the agent sees its socket close and kills every rank
    launcher.communicate(timeout=30)
    assert wait_gone(tag, timeout_s=5) == []
