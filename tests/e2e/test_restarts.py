"""Restarts after a failure and hang detection on the local backend (hydra.launcher.max_restarts, hang_timeout_min),
with real processes: the LM recipe killed mid-training ends with the uninterrupted weights, every rank of a run reads
one restart count, exhausted restarts name every run's failure, a stop never restarts, a deadlocked rank is found
and named with its stack."""

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

from helpers.app import app_command, app_env, results, run_app
from helpers.paths import REPO
from helpers.processes import from_a_terminal, wait_gone, wait_until
from helpers.restarts import SMALL_LM, epoch_length

MMT = str(Path(sys.executable).with_name("mmt"))


def mmt(*args: str, cwd: Path, tag: str, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run([MMT, *args], cwd=cwd, env=app_env(tag), capture_output=True, text=True, timeout=timeout)


def _listed(cwd: Path, name: str, tag: str) -> dict:
    done = mmt("list", "--json", cwd=cwd, tag=tag)
    assert done.returncode == 0, done.stderr
    return {row["name"]: row for row in json.loads(done.stdout)}.get(name, {})


def test_an_lm_job_whose_rank_dies_once_restarts_and_ends_with_the_uninterrupted_weights(tmp_path, tag):
    straight = run_app(*SMALL_LM, sweep_dir=tmp_path / "straight", tag=tag)
    assert straight.returncode == 0, straight.stderr[-3000:]
    expected = results(tmp_path / "straight")[0]["return_value"]
    epoch = epoch_length(tmp_path / "straight" / "0" / "metrics.csv")
    assert epoch + 2 < 40, f"an epoch of {epoch} steps leaves no room to fail after its checkpoint"
    # rank 3 is SIGKILLed (the OOM killer) two steps after the first epoch's checkpoint, on the first run only
    done = run_app(
        *SMALL_LM,
        "recipe.fail_rank=3",
        f"recipe.fail_step={epoch + 2}",
        "hydra.launcher.name=restarted",
        sweep_dir=tmp_path / "restarted",
        tag=tag,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "restart 1 of 1, every rank" in done.stdout
    result = results(tmp_path / "restarted")[0]
    value = result["return_value"]
    assert result["status"] == "COMPLETED" and result["restarts"] == 1
    [run] = result["earlier_runs"]
    assert run["restart"] == 0 and "rank 3 (node 1) was killed by SIGKILL" in run["error"]
    assert value["resumed_from_checkpoint"] is True and expected["resumed_from_checkpoint"] is False
    # bit for bit: the restart resumed at the epoch's end with its data order, RNG states and DDP buckets
    assert value["steps"] == expected["steps"] == 40
    assert value["weight_digests"] == expected["weight_digests"] and len(set(value["weight_digests"])) == 1
    assert value["val_loss"] == expected["val_loss"]
    # the curves keep the first run's steps: the second run's rows follow them
    rows = [line.split(",") for line in (tmp_path / "restarted" / "0" / "metrics.csv").read_text().split()[1:]]
    steps = [int(step) for _, step, train_loss, _ in rows if train_loss]
    first_run = next(i for i in range(1, len(steps)) if steps[i] < steps[i - 1])
    assert first_run > epoch and steps == list(range(first_run)) + list(range(epoch, 40))
    assert _listed(REPO, "restarted-0", tag)["restarts"] == 1  # mmt list's count
    assert wait_gone(tag) == []


# every rank of a run notes the run's count, then rank 3 fails on runs 0 and 1 once all four have noted it
COUNTING = (
    'echo "$MMT_RESTART_COUNT $RANK $MMT_MAX_RESTARTS" >> {notes}; '
    'if [ "$RANK" = 3 ] && [ "$MMT_RESTART_COUNT" -lt 2 ]; then '
    'while [ "$(grep -c "^$MMT_RESTART_COUNT " {notes})" -lt 4 ]; do sleep 0.05; done; exit 3; fi'
)


def test_every_rank_of_a_run_reads_the_same_restart_count(tmp_path, tag):
    notes = tmp_path / "notes"
    done = mmt(
        "run",
        "--name",
        f"counted-{tag[:6]}",
        "--num-machines",
        "2",
        "--devices",
        "2",
        "--command-mode",
        "per_rank",
        "--max-restarts",
        "2",
        "--set",
        "hydra.launcher.restart_backoff_s=0",
        "--command",
        COUNTING.format(notes=notes),
        cwd=tmp_path,
        tag=tag,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    seen = sorted(tuple(map(int, line.split())) for line in notes.read_text().splitlines())
    # three runs, each of all four ranks, each rank reading its run's count: one count per run, never per node
    assert seen == [(count, rank, 2) for count in range(3) for rank in range(4)]
    assert _listed(tmp_path, f"counted-{tag[:6]}", tag)["restarts"] == 2


def test_exhausted_restarts_fail_naming_every_runs_failure(tmp_path, tag):
    command = 'if [ "$RANK" = 1 ]; then echo "run $MMT_RESTART_COUNT gives up" >&2; exit $((7 + MMT_RESTART_COUNT)); fi'
    done = run_app(
        f"command='{command}'",
        "command_mode=per_rank",
        "devices=2",
        "hydra.launcher.max_restarts=1",
        "hydra.launcher.restart_backoff_s=0",
        sweep_dir=tmp_path,
        tag=tag,
    )
    assert done.returncode != 0
    result = results(tmp_path)[0]
    assert result["status"] == "FAILED" and result["restarts"] == 1
    assert result["failure"]["rank"] == 1 and result["failure"]["exit_code"] == 8  # the last run's
    assert "exited with code 7" in result["earlier_runs"][0]["error"]
    # the one line every front end shows names both runs' failures
    first = result["error"].splitlines()[0]
    assert "exited with code 8" in first and "after 1 restart(s)" in first and "run 0: " in first
    assert "exited with code 7" in first
    assert wait_gone(tag) == []


def test_a_time_limit_never_restarts(tmp_path, tag):
    done = mmt(
        "run", "--name", f"limited-{tag[:6]}", "--max-restarts", "3", "--max-runtime", "2", "--command", "sleep 60",
        cwd=tmp_path, tag=tag,
    )  # fmt: skip
    assert done.returncode != 0 and "restart" not in done.stdout
    row = _listed(tmp_path, f"limited-{tag[:6]}", tag)
    assert row["state"] == "TIMEOUT" and row["restarts"] == 0


def test_mmt_stop_never_restarts_a_job_sdk_max_run_attempts(tmp_path, tag):
    name = f"stopped-{tag[:6]}"
    notes = tmp_path / "notes"
    script = (
        "from mmt import Job\n"
        f"Job.run(name={name!r}, num_machines=2, max_run_attempts=3, "
        f"command='echo $MMT_RESTART_COUNT $MMT_MAX_RESTARTS >> {notes}; sleep 120')\n"
    )
    started = subprocess.run(
        [sys.executable, "-c", script], cwd=tmp_path, env=app_env(tag), capture_output=True, text=True, timeout=120
    )
    assert started.returncode == 0, started.stderr[-3000:]
    wait_until(lambda: notes.exists() and len(notes.read_text().split("\n")) > 2, 60, "both nodes' commands")
    stopped = mmt("stop", name, cwd=tmp_path, tag=tag)
    assert stopped.returncode == 0, stopped.stderr
    wait_until(lambda: _listed(tmp_path, name, tag).get("status") == "Stopped", 60, "the job to stop")
    assert wait_gone(tag, timeout_s=20) == []
    assert notes.read_text().split("\n")[:2] == ["0 2", "0 2"]  # attempts = restarts + 1, Lightning's meaning
    assert _listed(tmp_path, name, tag)["restarts"] == 0


def test_ctrl_c_never_restarts_not_even_during_the_back_off(tmp_path, tag):
    # the first run fails at once; Ctrl-C comes during the 60 s back-off: the job stays failed, never restarted
    launcher = subprocess.Popen(
        app_command(
            "command='echo run $MMT_RESTART_COUNT; exit 5'",
            "hydra.launcher.max_restarts=2",
            "hydra.launcher.restart_backoff_s=60",
            sweep_dir=tmp_path,
        ),
        cwd=REPO,
        env=app_env(tag),
        preexec_fn=from_a_terminal,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    lines = []
    while not any("restart 1 of 2" in line for line in lines):
        line = launcher.stdout.readline()
        assert line, "".join(lines)
        lines.append(line)
    launcher.send_signal(signal.SIGINT)
    output = "".join(lines) + launcher.communicate(timeout=60)[0]
    assert launcher.returncode != 0
    assert "run 1" not in output  # the restart never started
    result = results(tmp_path)[0]
    assert result["status"] == "FAILED" and "exited with code 5" in result["error"]
    assert "earlier_runs" not in result  # the run that failed is the job's last


def test_a_bad_max_restarts_is_one_line_before_anything_starts(tmp_path, tag):
    done = mmt("run", "--name", "never", "--max-restarts", "-1", "--command", "true", cwd=tmp_path, tag=tag)
    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr.strip() == (
        "mmt: Invalid --max-restarts -1: expected a whole number >= 0. HINT: restarts after a failure, "
        "e.g. --max-restarts 3"
    )
    assert not (tmp_path / "outputs").exists() and _listed(tmp_path, "never", tag) == {}


def test_a_deadlocked_rank_is_found_named_with_its_stack_and_restarted(tmp_path, tag):
    # rank 3 never joins the process group (probe's fail_mode=hang before it forms): ranks 0-2 wait for it there
    started = time.monotonic()
    done = run_app(
        "recipe=probe",
        "num_nodes=2",
        "devices=2",
        "recipe.fail_rank=3",
        "recipe.fail_mode=hang",
        "recipe.fail_at=start",
        "hydra.launcher.hang_timeout_min=0.1",  # 6 s
        "hydra.launcher.max_restarts=1",
        "hydra.launcher.restart_backoff_s=0",
        sweep_dir=tmp_path,
        tag=tag,
        timeout=120,
    )
    took = time.monotonic() - started
    assert done.returncode != 0
    result = results(tmp_path)[0]
    assert result["status"] == "FAILED" and result["restarts"] == 1  # a hang counts as a failure: it restarts
    for error in (result["earlier_runs"][0]["error"], result["error"].splitlines()[0]):
        assert "hung: no progress (output or training step) for 6 s" in error, error
        # the three that wait, together, where they wait; the one that never arrived, apart, at its line
        assert "ranks 0, 1, 2 at probe.py:81 in probe (inside " in error, error  # probe.py:81: init_process_group
        assert "; rank 3 at probe.py:35 in _inject. Stacks: " in error, error  # time.sleep: C, no frame of its own
    # within the timeout plus a few seconds (the stacks, the stop), each run
    assert result["earlier_runs"][0]["duration_s"] < 6 + 8, result["earlier_runs"][0]
    assert result["duration_s"] < 6 + 8 and took < 2 * (6 + 8) + 20
    # the last run's stacks in stacks/, the first run's kept under its number
    stacks = tmp_path / "0" / "stacks"
    names = ["node0.rank0.txt", "node0.rank1.txt", "node1.rank2.txt", "node1.rank3.txt"]
    assert sorted(p.name for p in stacks.iterdir()) == [*names, "run.0"]
    assert sorted(p.name for p in (stacks / "run.0").iterdir()) == names
    for run in (stacks, stacks / "run.0"):
        assert 'probe.py", line 35 in _inject' in (run / "node1.rank3.txt").read_text()
        assert "init_process_group" in (run / "node0.rank0.txt").read_text()
    assert wait_gone(tag) == []


def test_a_rank_that_keeps_talking_is_not_hung(tmp_path, tag):
    # 12 s of work with a line every second, and a 6 s hang timeout: progress, not a hang
    done = run_app(
        "command='for i in $(seq 12); do echo tick $i; sleep 1; done'",
        "hydra.launcher.hang_timeout_min=0.1",
        sweep_dir=tmp_path,
        tag=tag,
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    assert results(tmp_path)[0]["status"] == "COMPLETED"


def test_a_job_in_its_restart_back_off_says_so_and_a_stop_then_keeps_the_run_that_failed(tmp_path, tag):
    """Issue 30, item 1: `mmt run --detach --num-machines 2 --max-restarts 3` with a 20 s back-off, node 1's command
    exiting 5 after a second. During the back-off `mmt list`, `mmt inspect`, the SDK and the page say it is
    restarting, which run failed and why; a stop then never restarts it (as Ctrl-C: the failed run is its last, and
    its failure the job's), and says why it failed."""
    from mmt.dashboard import data
    from mmt.sdk import Job
    from mmt.service.handle import Status

    (tmp_path / "fail.sh").write_text('sleep 1; if [ "$NODE_RANK" = 1 ]; then exit 5; fi; sleep 60\n')
    name = f"rs{tag[:8]}"
    launched = mmt(
        "run", "--detach", "--name", name, "--num-machines", "2", "--max-restarts", "3",
        "--set", "hydra.launcher.restart_backoff_s=20", "--command", "bash fail.sh",
        cwd=tmp_path, tag=tag,
    )  # fmt: skip
    assert launched.returncode == 0, launched.stderr
    wait_until(lambda: _listed(tmp_path, name, tag).get("status") == "Restarting", 60, "the back-off")
    row = _listed(tmp_path, name, tag)
    assert row["restarts"] == 1, row
    assert row["note"].startswith("run 1 failed: node 1 exited with code 5; run 2 in "), row
    listed = mmt("list", cwd=tmp_path, tag=tag).stdout
    assert "Restarting (run 1 failed: node 1 exited with code 5; run 2 in " in listed, listed
    facts = json.loads(mmt("inspect", name, "--json", cwd=tmp_path, tag=tag).stdout)
    [run] = facts["earlier_runs"]  # recorded when it failed, not when the next run starts
    assert run["restart"] == 0 and "exited with code 5" in run["error"], facts
    assert facts["status"] == "Restarting" and facts["note"].startswith("run 1 failed:"), facts
    assert Job(name).status == Status.Restarting
    page = data.job_summary("x", Path(row["dir"]).resolve())
    assert page["status"] == "RESTARTING" and page["note"].startswith("run 1 failed: node 1 exited with code 5"), page

    stopped = mmt("stop", name, cwd=tmp_path, tag=tag)
    assert stopped.returncode == 0, stopped.stderr
    wait_until(lambda: _listed(tmp_path, name, tag).get("status") == "Failed", 30, "the stop")
    said = mmt("inspect", name, cwd=tmp_path, tag=tag).stdout
    assert "the command on node 1 raised CommandFailedError: command 'bash fail.sh' exited with code 5" in said, said
    assert _listed(tmp_path, name, tag)["restarts"] == 0  # never restarted
    assert wait_gone(tag) == []


def test_a_supervisor_killed_in_the_back_off_leaves_the_run_that_failed_on_record(tmp_path, tag):
    """The failed run is recorded when it fails: a detached job's supervisor SIGKILLed during the back-off is
    concluded by `mmt list` as an orphan, and its result still names the run that failed and why."""
    import os

    from helpers.service import registered

    (tmp_path / "fail.sh").write_text('sleep 1; if [ "$NODE_RANK" = 1 ]; then exit 5; fi; sleep 60\n')
    name = f"rk{tag[:8]}"
    launched = mmt(
        "run", "--detach", "--name", name, "--num-machines", "2", "--max-restarts", "3",
        "--set", "hydra.launcher.restart_backoff_s=60", "--command", "bash fail.sh",
        cwd=tmp_path, tag=tag,
    )  # fmt: skip
    assert launched.returncode == 0, launched.stderr
    wait_until(lambda: _listed(tmp_path, name, tag).get("status") == "Restarting", 60, "the back-off")
    os.kill(registered(name)[name]["supervisor_pid"], signal.SIGKILL)
    wait_until(lambda: _listed(tmp_path, name, tag).get("status") == "Failed", 30, "the orphan's conclusion")
    facts = json.loads(mmt("inspect", name, "--json", cwd=tmp_path, tag=tag).stdout)
    [run] = facts["earlier_runs"]
    assert run["restart"] == 0 and "exited with code 5" in run["error"], facts
    assert "ended without concluding it" in facts["result"]["error"], facts
    assert wait_gone(tag) == []
