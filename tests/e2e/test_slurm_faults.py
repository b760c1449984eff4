"""SLURM when the cluster itself acts (issue 21), on the real test cluster (three nodes: a 2-node job and a spare): a
node lost mid-job, a requeue SLURM starts itself, a rank the OOM killer SIGKILLs, USR2 sent to the whole job (batch
shell included) again and again, a slurmctld that does not answer."""

import contextlib
import json
import os
import re
import signal
import subprocess
import time
from pathlib import Path
from typing import List, Optional

import pytest

from helpers.app import app_command, app_env, results
from helpers.paths import REPO
from helpers.processes import from_a_terminal, tagged_pids, wait_gone, wait_until
from helpers.restarts import SMALL_LM
from helpers.slurm import cluster_nodes, lose_node, revive_node
from mmt.core.jobdir import JobDir

pytestmark = pytest.mark.slurm
PROBE = ("cluster=slurm", "recipe=probe")
MMT = str(Path(os.environ.get("VIRTUAL_ENV", REPO / ".venv")) / "bin" / "mmt")


@pytest.fixture(autouse=True)
def _cluster(slurm_cluster):
    yield


def _launch(tmp_path: Path, tag: str, *overrides: str, probe: bool = True) -> subprocess.Popen:
    return subprocess.Popen(
        app_command(*(PROBE if probe else ("cluster=slurm",)), *overrides, sweep_dir=tmp_path),
        cwd=REPO,
        env=app_env(tag),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _job_id(tmp_path: Path, timeout_s: float = 60) -> str:
    found: List[str] = []

    def running() -> bool:
        record = next(iter((tmp_path / "0" / ".mmt" / "attempts").glob("*/scheduler.json")), None)
        if record is None:
            return False
        view = json.loads(record.read_text())
        found[:] = [str(view.get("scheduler_id") or "")]
        return bool(found[0]) and view.get("state") == "RUNNING"

    wait_until(running, timeout_s, "the job to run")
    return found[0]


def _cancel(launcher: subprocess.Popen, job_id: Optional[str]) -> None:
    """However the test ended: no launcher left, nothing left in SLURM's queue."""
    if launcher.poll() is None:
        launcher.kill()
        launcher.communicate(timeout=30)
    if job_id:
        subprocess.run(["scancel", job_id])
        wait_until(lambda: not _in_queue(job_id), 60, "the job to leave the queue")


def _in_queue(job_id: str) -> bool:
    out = subprocess.run(["squeue", "-h", "-o", "%i"], capture_output=True, text=True).stdout.split()
    return job_id in out


def _rank_pid(tmp_path: Path, tag: str, node: int, rank: int) -> Optional[int]:
    """The pid of rank ``rank``'s process: the one whose stdout is that rank's log."""
    log = str(JobDir(tmp_path / "0").log(node, rank, False))
    for pid in tagged_pids(tag):
        try:
            if os.readlink(f"/proc/{pid}/fd/1") == log and os.readlink(f"/proc/{pid}/fd/2") == log:
                return pid
        except OSError:
            continue
    return None


def _batch_stderr(tmp_path: Path, job_id: str) -> str:
    return "".join(p.read_text(errors="replace") for p in (tmp_path / ".submitit").rglob(f"{job_id}_0_log.err"))


def _row(name: str) -> dict:
    done = subprocess.run([MMT, "list", "--json"], cwd=REPO, env=app_env(), capture_output=True, text=True, timeout=60)
    rows = {row["name"]: row for row in json.loads(done.stdout or "[]")}
    return rows.get(name, {})


def _status(name: str) -> str:
    return _row(name).get("status", "")


def _detach_running(tmp_path: Path, tag: str, name: str, *overrides: str) -> str:
    """A probe job launched detached as ``name``, once ``mmt list`` shows it Running: its SLURM job id."""
    done = subprocess.run(
        app_command(
            *PROBE, *overrides, "hydra.launcher.detach=true", f"hydra.launcher.name={name}", sweep_dir=tmp_path
        ),
        cwd=REPO,
        env=app_env(tag),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    wait_until(lambda: _status(f"{name}-0") == "Running", 60, "Running")
    return str(_row(f"{name}-0")["scheduler_id"])


def test_a_requeue_slurm_starts_itself_resumes_the_job_and_it_completes(tmp_path, tag):
    name = f"rq{os.getpid()}"
    job_id = _detach_running(tmp_path, tag, name, "num_nodes=1", "devices=2", "recipe.hold_s=12")
    try:
        time.sleep(3)  # mid-run: the ranks hold
        requeued = subprocess.run(["scontrol", "requeue", job_id], capture_output=True, text=True)
        assert requeued.returncode == 0, requeued.stderr
        seen = []
        deadline = time.monotonic() + 150
        while time.monotonic() < deadline:
            seen.append(_status(f"{name}-0"))
            if seen[-1] in ("Completed", "Failed", "Stopped") and not _in_queue(job_id):
                break
            time.sleep(0.5)
        assert "Stopped" not in seen and seen[-1] == "Completed", seen
        [result] = results(tmp_path)
        assert result["status"] == "COMPLETED", result
        err = _batch_stderr(tmp_path, job_id)
        why = f"SLURM requeued job {job_id} (scontrol requeue, preemption or a node failure)"
        assert f"mmt: {why} (restart 1); its next run concludes it" in err, err[-3000:]
        assert [(r["restart"], r["why"]) for r in result["requeues"]] == [(0, why)], result
        inspect = subprocess.run([MMT, "inspect", f"{name}-0"], cwd=REPO, env=app_env(), capture_output=True, text=True)
        assert f"requeued      run 0: {why}\n" in inspect.stdout, inspect.stdout
        assert "concluded inside the allocation: COMPLETED" in err, err[-3000:]
    finally:
        subprocess.run(["scancel", job_id])
        wait_until(lambda: not _in_queue(job_id), 60, "the job to leave the queue")
    assert wait_gone(tag, timeout_s=15) == []


@pytest.mark.parametrize("node, rank", [(0, 1), (1, 2)], ids=["node0", "node1"])
def test_a_sigkilled_rank_of_a_2x2_job_is_named_by_the_launcher_and_the_allocation(node, rank, tmp_path, tag):
    launcher = _launch(tmp_path, tag, "num_nodes=2", "devices=2", "recipe.hold_s=60")
    job_id = None
    try:
        job_id = _job_id(tmp_path)
        pid: List[int] = []
        wait_until(lambda: pid.append(_rank_pid(tmp_path, tag, node, rank) or 0) or pid[-1], 60, "the rank")
        time.sleep(1)
        os.kill(pid[-1], signal.SIGKILL)  # what the OOM killer does
        out, err = launcher.communicate(timeout=120)
    finally:
        _cancel(launcher, job_id)
    assert launcher.returncode == 1, err[-3000:]
    [result] = results(tmp_path)
    assert result["status"] == "FAILED", result
    assert (result["failure"]["rank"], result["failure"]["node_rank"], result["failure"]["signal"]) == (
        rank,
        node,
        "SIGKILL",
    ), result
    assert "concluded inside the allocation: FAILED" in _batch_stderr(tmp_path, job_id)
    assert wait_gone(tag, timeout_s=15) == []


def test_usr2_sent_to_the_whole_job_twice_20_times_reaches_each_rank_once_and_the_job_completes(tmp_path, tag):
    launcher = _launch(tmp_path, tag, "num_nodes=2", "devices=2", "recipe.hold_s=15")
    job_id = None
    try:
        job_id = _job_id(tmp_path)
        wait_until(lambda: all(_rank_pid(tmp_path, tag, r // 2, r) for r in range(4)), 60, "every rank")
        time.sleep(1)
        for _ in range(20):  # the batch shell, srun and every task's processes: `scancel --full`
            for _ in range(2):
                subprocess.run(["scancel", "--signal=USR2", "--full", job_id], check=True)
            time.sleep(0.1)
        out, err = launcher.communicate(timeout=120)
    finally:
        _cancel(launcher, job_id)
    assert launcher.returncode == 0, err[-3000:]
    [result] = results(tmp_path)
    assert result["status"] == "COMPLETED", result
    for r in range(4):
        log = JobDir(tmp_path / "0").log(r // 2, r, False).read_text(errors="replace")
        assert log.count("mmt: received SIGUSR2") == 1, (r, log[-2000:])
        assert "reentrant" not in log
    assert wait_gone(tag, timeout_s=15) == []


def test_max_requeues_0_makes_slurm_refuse_a_requeue(tmp_path, tag):
    launcher = _launch(tmp_path, tag, "num_nodes=1", "devices=1", "recipe.hold_s=4", "hydra.launcher.max_requeues=0")
    job_id = None
    try:
        job_id = _job_id(tmp_path)
        refused = subprocess.run(["scontrol", "requeue", job_id], capture_output=True, text=True)
        out, err = launcher.communicate(timeout=120)
    finally:
        _cancel(launcher, job_id)
    assert refused.returncode != 0, refused
    assert launcher.returncode == 0, err[-3000:]
    assert results(tmp_path)[0]["status"] == "COMPLETED"
    assert wait_gone(tag, timeout_s=15) == []


# ------------------------------------------------------------------------------------------------ a node lost


@pytest.fixture
def spare_node():
    """A 2-node job's second node (node2), to be lost; node3 is the spare SLURM requeues onto. node2 is started
    again however the test ends."""
    if cluster_nodes() < 3:
        pytest.skip("losing a node needs a spare: a test cluster of 3 nodes (MMT_SLURM_NODES=3, the default)")
    yield "node2"
    revive_node("node2")


def _run_nodes(job_id: str) -> List[str]:
    """Every run of the job, as accounting lists them: ``STATE NODELIST``."""
    out = subprocess.run(
        ["sacct", "-X", "-n", "-P", "-D", "-j", job_id, "-o", "State,NodeList"], capture_output=True, text=True
    ).stdout
    return [line.replace("|", " ") for line in out.splitlines() if line]


def _metrics_rows(sweep_dir: Path) -> int:
    metrics = sweep_dir / "0" / "metrics.csv"
    return max(0, len(metrics.read_text().splitlines()) - 1) if metrics.exists() else 0


def test_a_lost_node_is_named_and_the_requeued_lm_job_resumes_from_its_checkpoint_on_the_spare(
    tmp_path, tag, spare_node
):
    """2 x 2 LM, max_requeues at its default (3). After the first epoch (28 steps: its checkpoint is written), node2's
    slurmd and every process on it are SIGKILLed. SLURM finds it DOWN, ends the run NODE_FAIL and requeues the job
    onto node1 and the spare node3; the requeued run resumes from the epoch's checkpoint and ends with the weights of
    an uninterrupted run (the 40 steps, the same val_loss)."""
    straight = tmp_path / "straight"
    done = subprocess.run(
        app_command("cluster=slurm", *SMALL_LM, sweep_dir=straight), cwd=REPO, env=app_env(tag), capture_output=True
    )
    assert done.returncode == 0, done.stderr[-3000:]
    expected = results(straight)[0]["return_value"]
    lost = tmp_path / "lost"
    launcher = _launch(lost, tag, *SMALL_LM, "hydra.launcher.poll_interval_s=0.5", probe=False)
    job_id = None
    try:
        job_id = _job_id(lost)
        wait_until(lambda: _metrics_rows(lost) >= 31, 180, "the first epoch's end (step 28) and a few steps more")
        assert (lost / "0" / "checkpoints" / "last.ckpt").exists()
        lose_node(spare_node)
        out, err = launcher.communicate(timeout=240)
        # the job's own last step ends it in SLURM's books (not the scancel below)
        wait_until(lambda: not _in_queue(str(job_id)) and len(_run_nodes(str(job_id))) == 2, 60, "accounting")
    finally:
        _cancel(launcher, job_id)
    assert launcher.returncode == 0, out[-3000:] + err[-3000:]
    named = f"SLURM job {job_id} lost node2 (not responding since "
    notice = next((line for line in out.splitlines() if named in line), "")
    assert notice.endswith(f"node 1 of the job, ranks 2-3; SLURM requeued it (restart 1); it resumes in {lost / '0'}")
    [result] = results(lost)
    assert result["status"] == "COMPLETED", result
    [requeue] = result["requeues"]
    assert requeue["restart"] == 0 and requeue["why"].startswith(named), requeue
    assert requeue["why"].endswith("node 1 of the job, ranks 2-3; SLURM requeued it"), requeue
    # the same job and attempt, on node1 and the spare
    assert _run_nodes(job_id) == ["NODE_FAIL node[1-2]", "COMPLETED node[1,3]"]
    assert [p.name for p in (lost / "0" / ".mmt" / "attempts").iterdir()] == [result["attempt"]]
    value = result["return_value"]
    assert value["resumed_from_checkpoint"] is True and value["steps"] == expected["steps"] == 40
    assert value["val_loss"] == expected["val_loss"] and value["weight_digests"] == expected["weight_digests"]
    assert wait_gone(tag, timeout_s=15) == []


def test_a_lost_node_with_max_requeues_0_fails_the_job_naming_the_node(tmp_path, tag, spare_node):
    name = f"nodeloss{os.getpid()}"
    overrides = ("num_nodes=2", "devices=2", "recipe.hold_s=120", "hydra.launcher.max_requeues=0")
    job_id = _detach_running(tmp_path, tag, name, *overrides)
    try:
        wait_until(lambda: all(_rank_pid(tmp_path, tag, r // 2, r) for r in range(4)), 60, "every rank")
        lose_node(spare_node)
        wait_until(lambda: _status(f"{name}-0") in ("Failed", "Completed", "Stopped"), 120, "the job to end")
    finally:
        subprocess.run(["scancel", job_id])
    row = _row(f"{name}-0")
    assert row["status"] == "Failed", row
    [result] = results(tmp_path)
    assert result["status"] == "FAILED", result
    assert f"SLURM job {job_id} lost node2 (not responding since " in result["error"], result
    # the allocation's own last step concludes it ("for it"), or, when it had no time to, whoever sees NODE_FAIL
    assert re.search(r"node 1 of the job, ranks 2-3; SLURM ended the job (for it|NODE_FAIL)$", result["error"]), result
    assert _run_nodes(job_id) == ["NODE_FAIL node[1-2]"]  # never requeued
    assert "requeues" not in result
    # the job may still be COMPLETING for a moment (its lost node DOWN): the same bound as after every SLURM test
    wait_until(lambda: not _in_queue(job_id), 15, "the job to leave the queue")
    assert wait_gone(tag, timeout_s=15) == []


# ------------------------------------------------------------------------------------------------ slurmctld down


@contextlib.contextmanager
def _slurmctld_stopped():
    """SIGSTOP the test cluster's slurmctld (a controller that accepts connections and never answers, the worst
    case); it is continued however the test ends."""
    pid = int(
        subprocess.run(["pgrep", "-x", "slurmctld"], capture_output=True, text=True, check=True).stdout.split()[0]
    )
    os.kill(pid, signal.SIGSTOP)
    resume = lambda: os.kill(pid, signal.SIGCONT)  # noqa: E731
    try:
        yield resume
    finally:
        resume()


def test_ctrl_c_while_slurmctld_does_not_answer_ends_the_launcher_and_the_stop_is_asked_again_once_it_does(
    tmp_path, tag
):
    """A signal is obeyed whatever the cluster does: the launcher says the stop was asked and not confirmed, and ends
    in seconds, non-zero; `mmt stop` meanwhile exits non-zero; once slurmctld answers, `mmt list` asks again, and the
    job ends INTERRUPTED, saying why."""
    launcher = subprocess.Popen(
        app_command(
            "cluster=slurm", "command='sleep 300'", "hydra.launcher.poll_interval_s=0.5", "hydra.launcher.name=" + tag,
            sweep_dir=tmp_path,
        ),
        cwd=REPO, env=app_env(tag), preexec_fn=from_a_terminal, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
        text=True,
    )  # fmt: skip
    job_id = None
    try:
        job_id = _job_id(tmp_path)
        with _slurmctld_stopped():
            launcher.send_signal(signal.SIGINT)  # Ctrl-C
            signalled = time.monotonic()
            output, _ = launcher.communicate(timeout=60)
            # scancel's own timeout (5 s), then the few seconds a stop is waited for: not scancel's minute of retries
            assert time.monotonic() - signalled < 15, output[-3000:]
            assert launcher.returncode == 128 + signal.SIGINT, output[-3000:]
            assert "did not take the cancel of SLURM job" in output and "could not be confirmed" in output, output
            assert _in_queue_when_answering(job_id) is None  # nothing decided yet
            stop = subprocess.run(
                [MMT, "stop", f"{tag}-0"], cwd=REPO, env=app_env(), capture_output=True, text=True, timeout=60
            )
            assert stop.returncode == 1 and "slurmctld did not take the cancel" in stop.stderr, stop
        listed = subprocess.run([MMT, "list"], cwd=REPO, env=app_env(), capture_output=True, text=True, timeout=120)
        assert listed.returncode == 0, listed.stderr  # it asks again: slurmctld answers now
        wait_until(lambda: not _in_queue(job_id), 60, "the job to leave the queue")
        wait_until(lambda: bool(results(tmp_path)), 60, "the job's own last step to conclude it")
        [result] = results(tmp_path)
        assert result["status"] == "INTERRUPTED" and "the launcher received SIGINT" in result["error"], result
    finally:
        _cancel(launcher, job_id)


def _in_queue_when_answering(job_id: str) -> Optional[bool]:
    """None while slurmctld does not answer (squeue fails within 3 s), else whether the job is queued."""
    try:
        done = subprocess.run(["squeue", "-h", "-o", "%i"], capture_output=True, text=True, timeout=3)
    except subprocess.TimeoutExpired:
        return None
    return job_id in done.stdout.split() if done.returncode == 0 else None


def test_a_job_that_concluded_itself_is_reported_while_slurmctld_does_not_answer(tmp_path, tag):
    launcher = _launch(tmp_path, tag, "command='sleep 8; exit 3'", "hydra.launcher.poll_interval_s=0.5")
    job_id = None
    try:
        job_id = _job_id(tmp_path)
        # its command runs (its step made): SLURM says RUNNING once the batch script starts, and a step asked for
        # while slurmctld is stopped never starts (a loaded CI host was that slow once)
        timeline = tmp_path / "0" / "timeline.jsonl"
        wait_until(lambda: timeline.exists() and '"task_start"' in timeline.read_text(), 60, "the job's command")
        with _slurmctld_stopped():
            # the job fails and its own last step writes result.json inside the allocation; the launcher reads it
            output, _ = launcher.communicate(timeout=90)
        assert launcher.returncode != 0
        assert "slurmctld is not answering" in output and "the job concluded itself inside its allocation: FAILED" in (
            output
        ), output[-3000:]
        result = results(tmp_path)[0]
        assert result["status"] == "FAILED" and (result["failure"] or {}).get("exit_code") == 3, result
    finally:
        _cancel(launcher, job_id)


def _sbatch_running(ancestor: int) -> bool:
    """An sbatch among ``ancestor``'s descendants."""
    for status in Path("/proc").glob("[0-9]*/status"):
        try:
            fields = dict(line.split(":\t", 1) for line in status.read_text().splitlines() if ":\t" in line)
        except OSError:
            continue
        if fields.get("Name", "").strip() != "sbatch":
            continue
        pid = int(status.parent.name)
        while pid > 1:
            try:
                pid = int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, ValueError, IndexError):
                break
            if pid == ancestor:
                return True
    return False


def test_a_submission_whose_sbatch_times_out_leaves_no_unknown_job(tmp_path, tag):
    name = f"lost{os.getpid()}"
    with _slurmctld_stopped():
        launcher = _launch(tmp_path, tag, "command='sleep 300'", f"hydra.launcher.name={name}")
        # the app's start takes seconds (more on a busy host): hold slurmctld from when sbatch asks it
        wait_until(lambda: _sbatch_running(launcher.pid), 120, "the launcher's sbatch")
        time.sleep(15)  # sbatch gives up after slurmctld's MessageTimeout (10 s); the request stays in its socket
    # slurmctld catches up and creates the job; the launcher finds it by its name and cancels it
    output, errors = launcher.communicate(timeout=180)
    assert launcher.returncode != 0, errors[-3000:]
    line = next(
        (line for line in errors.splitlines() if "sbatch gave up waiting for slurmctld" in line), errors[-3000:]
    )
    assert "was cancelled, nothing is left queued. HINT: submit again" in line, errors[-3000:]
    assert "Traceback" not in errors
    queued = subprocess.run(["squeue", "-h", "-n", f"mmt-{name}-0", "-o", "%i %T"], capture_output=True, text=True)
    wait_until(
        lambda: subprocess.run(["squeue", "-h", "-n", f"mmt-{name}-0"], capture_output=True, text=True).stdout == "",
        60,
        f"the job to leave the queue: {queued.stdout}",
    )
    assert _row(f"{name}-0") == {}  # never registered: nothing anyone could stop or wait for
