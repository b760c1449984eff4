"""Launching over SSH, piece by piece (docs/remote.md): ``hydra.launcher.ssh``'s one-line refusals, what ssh's
failures are said as, which files come back (the rsync filters and the archive select the same ones, checked with
real rsync), the record of where each job lives, and the console's stream with the records' archive at its end
(mmt.remote.entry's follower, run here as a real process). The whole launch over a real sshd:
tests/e2e/test_remote_slurm.py."""

import io
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, List

import pytest
from omegaconf import OmegaConf

from mmt.core.errors import ConfigError
from mmt.remote import known, settings
from mmt.remote.connection import refusal
from mmt.remote.entry import ENDED
from mmt.remote.launch import RemoteLaunch, _Follower
from mmt.remote.records import brought, rsync_filters

KEY = "hydra.launcher.ssh"


def _of(**ssh: Any) -> Any:
    return settings.of(OmegaConf.create({"ssh": ssh}))


def test_a_target_is_read_with_its_defaults():
    target = _of(host="login", remote_root="~/mmt")
    assert (target.host, target.remote_root, target.python, target.grace_s) == ("login", "~/mmt", "python3", 600.0)
    assert target.label == "login"
    assert _of(host="login", remote_root="/scratch/me", user="me", port=2222).label == "me@login:2222"
    assert settings.of(OmegaConf.create({"ssh": {}})) is None  # an empty ssh: the launch runs here
    assert settings.SshTarget.of_dict(target.as_dict()) == target


@pytest.mark.parametrize(
    "given, key, says",
    [
        ({"remote_root": "~/mmt"}, f"{KEY}.host", "expected a non-empty line of text"),
        ({"host": "-oProxyCommand=x", "remote_root": "~/mmt"}, f"{KEY}.host", "no leading '-'"),
        ({"host": "login"}, f"{KEY}.remote_root", "expected a non-empty line"),
        ({"host": "login", "remote_root": "mmt"}, f"{KEY}.remote_root", "expected an absolute path"),
        ({"host": "login", "remote_root": "~/m", "port": 70000}, f"{KEY}.port", "expected a TCP port"),
        ({"host": "login", "remote_root": "~/m", "grace_s": -1}, f"{KEY}.grace_s", "expected seconds >= 0"),
        ({"host": "login", "remote_root": "~/m", "options": ["-v"]}, f"{KEY}.options", "as Name=value"),
        ({"host": "login", "remote_root": "~/m", "hosts": "x"}, f"{KEY}.hosts", "expected one of"),
    ],
)
def test_each_bad_value_is_one_line_naming_its_key(given, key, says):
    with pytest.raises(ConfigError) as caught:
        _of(**given)
    assert caught.value.key == key and says in str(caught.value) and "\n" not in str(caught.value)


@pytest.mark.parametrize(
    "said, key, says",
    [
        ("ssh: Could not resolve hostname nohost: Name or service not known", f"{KEY}.host", "no such host"),
        ("Host key verification failed.", f"{KEY}.host", "host key is not in known_hosts"),
        ("root@127.0.0.1: Permission denied (publickey).", f"{KEY}.identity_file", "refused the login"),
        ("ssh: connect to host 127.0.0.1 port 1: Connection refused", f"{KEY}.host", "cannot connect"),
    ],
)
def test_what_ssh_says_becomes_one_line_naming_the_setting(said, key, says):
    error = refusal(settings.SshTarget(host="login", remote_root="~/mmt"), said)
    assert error.key == key and says in str(error)


def _tree(root: Path) -> None:
    files = [
        "multirun.yaml",
        "summary.csv",
        "console-1-0.log",
        "0/result.json",
        "0/metrics.csv",
        "0/.hydra/config.yaml",
        "0/logs/node0.rank0.log",
        "0/logs/previous/a/node0.rank0.log",
        "0/checkpoints/last.ckpt",
        "0/metrics/node0.jsonl",
        "0/.mmt/attempts/x/return.pkl",
        "0/.mmt/attempts/x/job.pkl",
        ".submitit/1/1_0_log.out",
    ]
    for name in files:
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(name)
    os.chmod(root / "0" / ".mmt", 0o700)


@pytest.mark.skipif(shutil.which("rsync") is None, reason="rsync is not installed (apt-get install rsync)")
def test_the_rsync_filters_and_the_archive_bring_back_the_same_files(tmp_path):
    source, copy = tmp_path / "sweep", tmp_path / "copy"
    _tree(source)
    subprocess.run(["rsync", "-a", "--prune-empty-dirs", *rsync_filters(), f"{source}/", f"{copy}/"], check=True)
    by_rsync = sorted(str(p.relative_to(copy)) for p in copy.rglob("*") if p.is_file())
    assert by_rsync == sorted(brought(str(source)))
    assert by_rsync == [
        "0/.hydra/config.yaml",
        "0/.mmt/attempts/x/return.pkl",
        "0/metrics.csv",
        "0/result.json",
        "console-1-0.log",
        "summary.csv",
    ]


def test_where_each_job_lives_is_remembered_by_name_and_by_launch(tmp_path, monkeypatch):
    monkeypatch.setenv("MMT_HOME", str(tmp_path / "home"))
    target = settings.SshTarget(host="login", remote_root="~/mmt")
    jobs = [known.RemoteJob(f"far-{n}", target.as_dict(), "/r", f"/r/s/{n}", f"/l/{n}", "/r/s", "/l") for n in (0, 1)]
    known.remember(jobs)
    (tmp_path / "home" / "remote" / "half.json").write_text('{"name": ')  # never a traceback
    assert [j.name for j in known.named("far-1")] == ["far-1"]
    assert [j.name for j in known.named("far")] == ["far-0", "far-1"]
    assert known.named("fa") == [] and known.named("far-0")[0].ssh == target
    assert oct((tmp_path / "home" / "remote" / "far-0.json").stat().st_mode & 0o777) == "0o600"
    known.forget("far-0")
    assert [j.name for j in known.named("far")] == ["far-1"]


class _Here:
    """A connection whose commands run here: the follower's protocol, without ssh."""

    def popen(self, argv: List[str], **kwargs: Any) -> subprocess.Popen:
        return subprocess.Popen([sys.executable if argv[0] == "python3" else argv[0], *argv[1:]], **kwargs)


def _follower(tmp_path: Path, pid: int) -> _Follower:
    launch = RemoteLaunch(settings.SshTarget(host="here", remote_root=str(tmp_path)), "slurm")
    launch.connection = _Here()  # type: ignore[assignment]
    (tmp_path / "local").mkdir()
    return _Follower(launch, pid, str(tmp_path / "sweep" / "console.log"), str(tmp_path / "sweep"), tmp_path / "local")


def test_the_console_streams_to_its_end_and_the_records_follow_on_the_same_stream(tmp_path, capfdbinary):
    sweep = tmp_path / "sweep"
    _tree(sweep)
    (tmp_path / "rest").write_bytes(b"".join(f"[#0 n0 r0] line {i}\n".encode() for i in range(8000))[100_000:])
    # a console longer than one read, its last line split across two writes, as the launch's process writes it
    body = b"".join(f"[#0 n0 r0] line {i}\n".encode() for i in range(8000))
    (sweep / "console.log").write_bytes(body[:100_000])
    writer = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sys, time; rest, end = open(sys.argv[1], 'rb').read(), sys.argv[2].encode()\n"
            "f = open(sys.argv[3], 'ab')\n"
            "time.sleep(0.3); f.write(rest); f.flush(); time.sleep(0.3); f.write(end[:5]); f.flush(); time.sleep(0.3)\n"
            "f.write(end[5:]); f.flush(); time.sleep(5)",
            str(tmp_path / "rest"),
            ENDED.decode(),
            str(sweep / "console.log"),
        ]
    )
    try:
        follower = _follower(tmp_path, writer.pid)
        assert follower._stream() == 0  # ended at its last line, not when the process went (it sleeps on)
        assert writer.poll() is None
    finally:
        writer.kill()
    shown = capfdbinary.readouterr().out
    assert shown == body  # every line, and not the end mark
    local = tmp_path / "local"
    assert (local / "0" / "result.json").read_text() == "0/result.json"
    assert (local / "0" / ".mmt" / "attempts" / "x" / "return.pkl").exists()
    assert not (local / "0" / "logs").exists() and not (local / "0" / ".mmt" / "attempts" / "x" / "job.pkl").exists()
    assert oct((local / "0" / ".mmt").stat().st_mode & 0o777) == "0o700"  # private here as there


def test_a_launch_process_gone_without_its_last_line_ends_the_stream_too(tmp_path, capfdbinary):
    sweep = tmp_path / "sweep"
    _tree(sweep)
    (sweep / "console.log").write_bytes(b"killed before its last line\n")
    gone = subprocess.Popen(["true"])
    gone.wait()
    follower = _follower(tmp_path, gone.pid)
    started = time.monotonic()
    assert follower._stream() == 0 and time.monotonic() - started < 10
    assert capfdbinary.readouterr().out == b"killed before its last line\n"
    assert (tmp_path / "local" / "summary.csv").exists()


def test_a_stream_that_stops_short_counts_as_a_lost_connection_and_resumes_where_it_stopped(tmp_path, capfdbinary):
    sweep = tmp_path / "sweep"
    _tree(sweep)
    (sweep / "console.log").write_bytes(b"first part\n")
    follower = _follower(tmp_path, os.getpid())

    class _Cut(_Here):
        def popen(self, argv: List[str], **kwargs: Any) -> subprocess.Popen:
            # the link drops after what was written so far: ssh's exit status 255
            return subprocess.Popen(["sh", "-c", 'cat "$0"; exit 255', str(sweep / "console.log")], **kwargs)

    follower.launch.connection = _Cut()  # type: ignore[assignment]
    assert follower._stream() == 255 and follower.offset == len(b"first part\n")
    with open(sweep / "console.log", "ab") as console:
        console.write(b"second part\n" + ENDED)
    follower.launch.connection = _Here()  # type: ignore[assignment]
    assert follower._stream() == 0
    assert capfdbinary.readouterr().out == b"first part\nsecond part\n"  # nothing twice, nothing lost


def test_the_archive_reader_takes_the_bytes_read_with_the_end_mark_first(tmp_path):
    import tarfile

    data = io.BytesIO()
    with tarfile.open(fileobj=data, mode="w|") as archive:
        info = tarfile.TarInfo("a/result.json")
        info.size = 2
        archive.addfile(info, io.BytesIO(b"{}"))
    raw = data.getvalue()
    follower = _follower(tmp_path, os.getpid())
    assert follower._unpack(raw[:700], io.BufferedReader(io.BytesIO(raw[700:])))  # type: ignore[arg-type]
    assert (tmp_path / "local" / "a" / "result.json").read_text() == "{}"


def test_the_clusters_side_refuses_another_version_and_a_root_it_cannot_write(tmp_path):
    from mmt.core.version import VERSION
    from mmt.remote import entry

    other = entry._check(str(tmp_path / "root"), "0.0.1")
    assert other["key"] == "python" and f"the cluster's mmt is {VERSION}, the launcher's 0.0.1" in other["error"]
    (tmp_path / "file").write_text("not a folder")
    blocked = entry._check(str(tmp_path / "file" / "root"), VERSION)
    assert blocked["key"] == "remote_root" and "cannot write there" in blocked["error"]
    fine = entry._check(str(tmp_path / "root"), VERSION)
    assert fine["root"] == str(tmp_path / "root") and {p.name for p in (tmp_path / "root").iterdir()} == {
        "home",
        "code",
        "sweeps",
    }


def test_a_login_shell_without_slurm_is_said_as_such(monkeypatch):
    from mmt.remote import entry

    monkeypatch.setenv("PATH", "/nonexistent")
    assert "not on the PATH" in str(entry._cluster_problem("slurm"))


def test_a_result_of_an_earlier_run_into_the_same_dir_is_not_this_runs(tmp_path):
    """A rerun into the same sweep dir: until this run's records come back, the job has not ended here."""
    import json as json_module

    from mmt.core.jobdir import Attempt
    from mmt.launching.jobs import Submitted

    follower = _follower(tmp_path, os.getpid())
    job_dir = tmp_path / "local" / "0"
    job_dir.mkdir(parents=True)
    (job_dir / "result.json").write_text(
        json_module.dumps({"schema": 1, "job": 0, "name": "j-0", "status": "COMPLETED", "attempt": "earlier"})
    )
    plan: Any = type("Plan", (), {"num": 0, "name": "j-0"})()
    this_run = Submitted(plan=plan, attempt=Attempt(job_dir / ".mmt" / "attempts" / "this"), backend="slurm")
    assert follower._report(this_run) is None
    earlier = Submitted(plan=plan, attempt=Attempt(job_dir / ".mmt" / "attempts" / "earlier"), backend="slurm")
    assert follower._report(earlier) is not None


def test_two_launches_that_synced_one_new_snapshot_at_once_leave_one_copy(tmp_path):
    from mmt.remote.entry import _place

    final = tmp_path / "code" / "abc"
    for n in (1, 2):
        partial = tmp_path / "code" / f".abc.{n}.partial"
        (partial / "pkg").mkdir(parents=True)
        (partial / "pkg" / "a.py").write_text(f"copy {n}")
    _place(tmp_path / "code" / ".abc.1.partial", final)
    _place(tmp_path / "code" / ".abc.2.partial", final)  # the second finds it placed: its own copy goes
    _place(tmp_path / "code" / ".abc.3.partial", final)  # a later batch of the launch: nothing to place
    assert (final / "pkg" / "a.py").read_text() == "copy 1"
    assert sorted(p.name for p in (tmp_path / "code").iterdir()) == ["abc"]
