"""Liveness, without launching a job: what says a launch is alive and takes its stop requests (the run dir, out of the
job's reach), an orphan's conclusion in its job dir, pickles read under any umask, the sweep dir's claim, logs never
opened through a symlink, and a descendant that dropped its tag. (The same with real launches, supervisors and
ranks: tests/e2e/test_liveness.py.)"""

import errno
import json
import os
import pickle
import shutil
import subprocess
import sys
import time
from pathlib import Path

import cloudpickle
import pytest

from mmt.core.jobdir import JobDir, SweepDir, make_private_dir, write_atomic
from mmt.core.states import JobState
from mmt.records import ownership
from mmt.records.registry import JobRecord, Registry
from mmt.records.schema import OwnerRecord


def _record(job_dir: Path, name: str, attempt: str, **facts) -> JobRecord:
    values = dict(
        name=name,
        job_id=f"{name}-id",
        backend="local",
        job_dir=str(job_dir),
        sweep_dir=str(job_dir.parent),
        attempt=attempt,
        num_nodes=2,
        devices=2,
        machine="cpu",
        command="sleep 60",
        command_mode="per_node",
        overrides=["num_nodes=2"],
        state=JobState.RUNNING.value,
        supervisor_pid=os.getpid(),
        supervisor_host=None,
        created_at=time.time(),
        started_at=time.time() - 5,
    )
    return JobRecord(**{**values, **facts})


# ------------------------------------------------------------------------------------------------ 2. under any umask


class _Accepting:
    """What engine.launch does for the supervisor's launcher, minus the jobs: say they were accepted."""

    def __init__(self) -> None:
        self.options = None

    def __call__(self, jobs, backend, options, console, accepted=None, **_):
        self.options = options
        accepted([])


@pytest.mark.parametrize("umask", [0o002, 0o000])
def test_the_detached_supervisor_reads_its_jobs_from_a_sweep_dir_the_umask_made_group_writable(
    tmp_path, umask, monkeypatch
):
    from helpers.fake_backend import FakeBackend, FakeSettings
    from mmt.launching import engine, supervisor

    before = os.umask(umask)
    try:
        sweep = SweepDir(tmp_path / "sweep")
        sweep.root.mkdir()  # as Hydra makes it, under the user's umask: drwxrwxr-x under 002
        make_private_dir(sweep.private)
        spec = sweep.supervisor_spec("launch")
        inner = cloudpickle.dumps(
            {
                "jobs": [],
                "backend": FakeBackend,
                "settings": FakeSettings(),
                "options": engine.LaunchOptions(sweep_dir=sweep.root),
            }
        )
        write_atomic(spec, pickle.dumps({"sys_path": list(sys.path), "inner": inner}), private=True)
    finally:
        os.umask(before)
    assert sweep.root.stat().st_mode & 0o777 == 0o777 & ~umask
    assert (sweep.private.stat().st_mode & 0o777, spec.stat().st_mode & 0o777) == (0o700, 0o600)
    launch = _Accepting()
    monkeypatch.setattr(supervisor.engine, "launch", launch)
    read_end, write_end = os.pipe()
    assert supervisor.main([str(spec), str(write_end)]) == 0
    with os.fdopen(read_end) as answer:
        assert json.loads(answer.read()) == {"attempts": []}
    assert launch.options is not None and not spec.exists()


def test_a_pickle_is_read_only_from_a_private_dir_of_this_user_checked_by_its_descriptor(tmp_path):
    from mmt.records.payload import UnsafePayloadError, open_private

    shared = tmp_path / "shared"
    shared.mkdir(mode=0o777)
    os.chmod(shared, 0o777)  # the dir above: anyone's to write; the private dir below is what keeps others out
    private = make_private_dir(shared / ".mmt")
    write_atomic(private / "job.pkl", pickle.dumps("the payload"), private=True)
    with open_private(private / "job.pkl") as handle:
        assert pickle.load(handle) == "the payload"
    os.chmod(private, 0o770)
    with pytest.raises(UnsafePayloadError, match="writable by others"):
        open_private(private / "job.pkl")
    os.chmod(private, 0o700)
    os.chmod(private / "job.pkl", 0o620)
    with pytest.raises(UnsafePayloadError, match="writable by others"):
        open_private(private / "job.pkl")
    os.chmod(private / "job.pkl", 0o600)
    # a symlink, to the dir or in it, is never followed: it may lead to a dir that others write
    (shared / "link").symlink_to(private)
    with pytest.raises(UnsafePayloadError, match="symlink"):
        open_private(shared / "link" / "job.pkl")
    (private / "linked.pkl").symlink_to(private / "job.pkl")
    with pytest.raises(UnsafePayloadError, match="symlink"):
        open_private(private / "linked.pkl")
    with pytest.raises(FileNotFoundError):
        open_private(private / "missing.pkl")


# ------------------------------------------------------------------------------------- 3. a job that deletes its dir


def test_a_job_that_deleted_its_own_dir_is_running_while_its_supervisor_lives_and_can_be_stopped(tmp_path):
    from mmt.backends.local import records
    from mmt.service import status

    registry = Registry(tmp_path / "registry.sqlite")
    job_dir = JobDir(tmp_path / "sweep" / "0")
    attempt = "20260101T000000-aaaaaa"
    held = ownership.claim(
        job_dir,
        OwnerRecord.of_this_process(attempt=attempt, name="self-deleting", backend="local", job_id="self-deleting-id"),
        lambda owner: False,
    )
    try:
        record = _record(job_dir.root, "self-deleting", attempt)
        registry.add([record])
        job_dir.attempt(attempt).create()
        job_dir.logs.mkdir()
        shutil.rmtree(job_dir.root)  # rm -rf "$MMT_JOB_DIR", git clean -fdx ...: the job dir's lock goes with it
        for _ in range(2):  # not once by luck: every refresh says so
            record = records.refresh(registry.require("self-deleting"), registry)
            assert record.state == JobState.RUNNING.value, record.result
        assert not job_dir.root.exists()  # and nothing was written into a dir the job deleted
        said = status.stop(record)
        assert "asked its supervisor" in said, said
        assert held.stop_requested()  # what the supervisor's watch loop looks at every half second
    finally:
        held.release()
    # its supervisor concluded it and let go (the registry first): nothing of it is left in the run dir
    from mmt.records import liveness

    assert liveness.beacon_held("self-deleting-id", attempt) is None
    assert not any(liveness.run_dir().root.glob("self-deleting-id.*"))


def test_without_a_beacon_the_supervisor_is_judged_by_its_pid_and_start_time(tmp_path):
    """An attempt with no entry in the run dir (an older mmt's, a run dir that could not be written)."""
    from mmt.core import proctree
    from mmt.records import liveness

    child = subprocess.Popen(["sleep", "30"])
    try:
        started = proctree.start_time(child.pid)
        alive = _record(tmp_path / "0", "pid-judged", "a1", supervisor_pid=child.pid, supervisor_start=started)
        assert liveness.supervisor_alive(alive)
        # the same pid with another start time: another process that reused the number
        assert not liveness.supervisor_alive(
            _record(tmp_path / "0", "pid-judged", "a1", supervisor_pid=child.pid, supervisor_start=started + 1)
        )
    finally:
        child.kill()
        child.wait()
    assert not liveness.supervisor_alive(alive)


# ----------------------------------------------------------------------------- 8. an orphan, in its job dir too


def test_an_orphan_is_concluded_in_its_job_dir_too_and_the_live_page_says_failed(tmp_path):
    from mmt.backends.local import records
    from mmt.dashboard import data

    registry = Registry(tmp_path / "registry.sqlite")
    root = tmp_path / "sweep" / "0"
    attempt = "20260101T000000-bbbbbb"
    gone = subprocess.Popen(["true"])
    gone.wait()  # the supervisor, SIGKILLed: it held its locks, which the kernel let go
    owner = OwnerRecord(
        host="box",
        pid=gone.pid,
        started=time.time() - 5,
        attempt=attempt,
        name="orphan-0",
        backend="local",
        job_id="orphan-id",
    )
    owner.write(JobDir(root).owner)
    JobDir(root).logs.mkdir(parents=True)
    # an earlier attempt's result says nothing of this one
    (root / "result.json").write_text(json.dumps({"schema": 1, "attempt": "older", "status": "COMPLETED"}))
    assert data.job_summary(data.opaque_id(root), root)["status"] == "RUNNING"
    registry.add([_record(root, "orphan-0", attempt, job_id="orphan-id", supervisor_pid=gone.pid)])

    record = records.refresh(registry.require("orphan-0"), registry)
    assert record.state == JobState.FAILED.value
    written = json.loads((root / "result.json").read_text())
    assert (written["status"], written["attempt"], written["name"]) == ("FAILED", attempt, "orphan-0")
    assert "ended without concluding it (killed?)" in written["error"]
    assert written["error"] == record.result["error"]
    summary = data.job_summary(data.opaque_id(root), root)
    assert (summary["status"], summary["num_nodes"], summary["devices"]) == ("FAILED", 2, 2)
    assert "ended without concluding it" in data.job_detail(data.opaque_id(root), root)["error"]
    # a refresh after that changes nothing, and a result of this attempt is never replaced
    again = records.refresh(registry.require("orphan-0"), registry)
    assert again.state == JobState.FAILED.value and json.loads((root / "result.json").read_text()) == written


def test_an_orphan_whose_dir_is_gone_is_concluded_in_the_registry_alone(tmp_path):
    from mmt.backends.local import records

    registry = Registry(tmp_path / "registry.sqlite")
    gone = subprocess.Popen(["true"])
    gone.wait()
    root = tmp_path / "sweep" / "0"
    registry.add([_record(root, "vanished-0", "a1", supervisor_pid=gone.pid)])
    assert records.refresh(registry.require("vanished-0"), registry).state == JobState.FAILED.value
    assert not root.exists()


# ------------------------------------------------------------------------------------------ 12. the sweep dir's claim


def test_a_sweep_dir_is_claimed_at_once_and_a_second_launch_is_refused_naming_the_first(tmp_path):
    from mmt.core.errors import UsageError

    sweep = tmp_path / "sweep"
    code = (
        "import sys, time\nfrom pathlib import Path\nfrom mmt.records import ownership\n"
        "ownership.claim_sweep(Path(sys.argv[1]), lambda owner: False)\nprint('held', flush=True)\n"
        "time.sleep(60)\n"
    )
    holder = subprocess.Popen([sys.executable, "-c", code, str(sweep)], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline() == "held\n"
        with pytest.raises(
            UsageError,
            match=rf"hydra.sweep.dir {sweep} is in use by a live launch \(pid "
            rf"{holder.pid} on ",
        ):
            ownership.claim_sweep(sweep, lambda owner: False)
    finally:
        holder.kill()
        holder.wait()
    mine = ownership.claim_sweep(sweep, lambda owner: False)  # the kernel let it go with its holder
    again = ownership.claim_sweep(sweep, lambda owner: False)  # this process again: the later launch takes it over
    assert mine.fd == -1 and again.fd >= 0
    again.release()
    assert not (sweep / ".mmt").exists()  # a sweep dir is not a job dir: the live page must not take it for one


# ------------------------------------------------------------------------------------------------------- lows


def test_a_log_is_never_opened_through_a_symlink(tmp_path):
    from mmt.core.jobdir import open_for_append

    logs = tmp_path / "logs"
    logs.mkdir()
    victim = tmp_path / "elsewhere" / "victim.log"
    victim.parent.mkdir()
    (logs / "node0.rank0.log").symlink_to(victim)
    with pytest.raises(OSError) as refused:
        open_for_append(logs / "node0.rank0.log")
    assert refused.value.errno == errno.ELOOP and not victim.exists()
    (tmp_path / "linked-logs").symlink_to(victim.parent)  # nor through a linked dir
    with pytest.raises(OSError):
        open_for_append(tmp_path / "linked-logs" / "node0.rank1.log")
    assert not (victim.parent / "node0.rank1.log").exists()
    fd = open_for_append(logs / "node0.rank1.log")
    os.write(fd, b"mine\n")
    os.close(fd)
    assert (logs / "node0.rank1.log").read_text() == "mine\n"
