"""Nothing lost, round 3 (issue 17, items 11, 14, 17, 18 and the lows): the `mmt` CLI and the SDK read logs by
byte range, say what they refuse in one line naming what the user typed, and speak Lightning's SDK where it means
something here. In-process: the CLI's ``main`` and the SDK over registry records and job dirs made by hand
(tests/helpers/jobs.py); the cases that need real processes (memory of a huge log, a read-only registry, a real
job whose dir was deleted) are in tests/e2e/test_service_cli.py."""

import json
import shutil
from pathlib import Path
from typing import Any, List

import pytest

from helpers.jobs import registered_job
from mmt.cli.main import main
from mmt.core.errors import ConfigError


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """This test's own registry ($MMT_HOME), and a cwd without a project conf/."""
    path = tmp_path / "home"
    path.mkdir()
    monkeypatch.setenv("MMT_HOME", str(path))
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)
    return path


def _cli(capsys: pytest.CaptureFixture, *argv: str) -> tuple:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def _log_files() -> Any:
    from mmt.service import logs  # imported here: the other tests also run (and fail) on code without it

    return logs


def _one_line(err: str) -> str:
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in err, err
    return lines[0]


# ---------------------------------------------------------------------------------------------- item 11: reading


@pytest.mark.parametrize("text", ["a\nb\nc\nd\n", "a\nb\nc\nd", "\n\n\n", "one line", "x\n" * 5000 + "end\n", ""])
@pytest.mark.parametrize("n", [1, 2, 3, 10])
def test_the_last_lines_are_found_seeking_back_in_blocks(tmp_path: Path, text: str, n: int) -> None:
    """Item 11: tail_offset, with blocks smaller than the text, gives the same lines as splitting all of it."""
    log_files = _log_files()
    path = tmp_path / "log"
    path.write_text(text)
    start = log_files.tail_offset(path, n, block=7)
    assert path.read_bytes()[start:].decode() == "".join(text.splitlines(keepends=True)[-n:])


def test_lines_are_read_in_bounded_pieces_and_decoded_across_chunks(tmp_path: Path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """Item 11: a character split between two chunks stays whole; a line longer than the piece size comes out in
    pieces instead of being held whole."""
    log_files = _log_files()
    monkeypatch.setattr(log_files, "CHUNK", 5)
    monkeypatch.setattr(log_files, "MAX_PIECE", 8)
    path = tmp_path / "log"
    path.write_text("héllo wörld\n" + "z" * 30 + "\nend")
    pieces = list(log_files.text_blocks(path))
    assert "".join(pieces) == path.read_text()
    assert all(len(p) <= 8 + 5 + 1 for p in pieces), pieces
    assert log_files.split_lines("a\r\nb\rc\n\nend") == ["a\r\n", "b\rc\n", "\n", "end"]


def test_the_sdk_tail_does_not_read_the_whole_log(home: Path, tmp_path: Path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """Item 11: ``job.logs(tail=2)`` reads the end of the file only (before: read_text of all of it)."""
    import builtins

    from mmt import Job

    registered_job(home, "tailed", tmp_path / "job", logs={0: "".join(f"line {i}\n" for i in range(100_000))})
    read: List[int] = []
    real_open = builtins.open

    class Counting:
        def __init__(self, handle: Any) -> None:
            self.handle = handle

        def __enter__(self) -> "Counting":
            return self

        def __exit__(self, *exc: Any) -> None:
            self.handle.close()

        def read(self, size: int = -1) -> Any:
            data = self.handle.read(size)
            read.append(len(data))
            return data

        def __getattr__(self, name: str) -> Any:
            return getattr(self.handle, name)

    def counting_open(file: Any, *args: Any, **kwargs: Any) -> Any:
        handle = real_open(file, *args, **kwargs)
        return Counting(handle) if str(file).endswith(".log") else handle

    monkeypatch.setattr(builtins, "open", counting_open)
    monkeypatch.setattr(Path, "read_text", lambda *a, **k: pytest.fail("the whole log was read"))
    assert Job.get("tailed").logs(tail=2) == "line 99998\nline 99999\n"
    assert 0 < sum(read) <= 2 * 64 * 1024, read


def test_machine_logs_hold_at_most_a_bounded_end_and_say_so(home: Path, tmp_path: Path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """Item 11: ``job.machines[i].logs`` is bounded (MACHINE_LOG_BYTES) and says what it left out, and where."""
    from mmt import Job
    from mmt.service import handle

    monkeypatch.setattr(handle, "MACHINE_LOG_BYTES", 1000, raising=False)
    registered_job(home, "long", tmp_path / "job", logs={0: "".join(f"line {i}\n" for i in range(10_000))})
    text = Job.get("long").machines[0].logs
    assert len(text) < 1300 and text.endswith("line 9999\n")
    first, second = text.splitlines()[:2]
    assert first.startswith("[mmt] the first ") and "node0.rank0.log are not shown here" in first
    assert second.startswith("line ")  # whole lines only


def test_logs_show_what_the_console_shows_and_raw_gives_the_bytes(home: Path, tmp_path: Path, capsys) -> None:  # type: ignore[no-untyped-def]
    """Low: control sequences from a rank (a title, BEL, a cursor move) do not reach the terminal; --raw keeps
    them. Before: passed raw."""
    registered_job(home, "ansi", tmp_path / "job", logs={0: "a\x1b]0;title\x07b\x1b[2K\n50%\r100%\nplain\n"})
    code, out, _ = _cli(capsys, "logs", "ansi")
    assert code == 0 and out == "ab\n100%\nplain\n"
    code, out, _ = _cli(capsys, "logs", "ansi", "--tail", "1")
    assert out == "plain\n"
    code, out, _ = _cli(capsys, "logs", "ansi", "--raw")
    assert code == 0 and out == "a\x1b]0;title\x07b\x1b[2K\n50%\r100%\nplain\n"


def test_follow_from_the_last_lines_ends_with_the_job(home: Path, tmp_path: Path, capsys) -> None:  # type: ignore[no-untyped-def]
    """Item 11: ``-f --tail 2`` of an ended job prints its last two lines and returns."""
    registered_job(home, "ended", tmp_path / "job", logs={0: "1\n2\n3\nno newline"})
    code, out, _ = _cli(capsys, "logs", "ended", "-f", "--tail", "2")
    assert code == 0 and out == "3\nno newline"


# ---------------------------------------------------------------------------------------- item 14: --rank, --tail


@pytest.mark.parametrize("rank", ["4", "-1", "100"])
def test_a_rank_the_job_does_not_have_is_one_line_naming_what_it_has(
    home: Path,
    tmp_path: Path,
    capsys,  # type: ignore[no-untyped-def]
    rank: str,
) -> None:
    """Item 14: before, nothing was printed and the exit status was 0."""
    registered_job(home, "two-by-two", tmp_path / "job", num_nodes=2, devices=2, logs={r: f"r{r}\n" for r in range(4)})
    code, out, err = _cli(capsys, "logs", "two-by-two", "--rank", rank)
    assert code == 2 and out == ""
    assert _one_line(err) == f"mmt: Invalid --rank {rank}: expected one of ranks 0-3 of this 2 x 2 job."
    assert _cli(capsys, "logs", "two-by-two", "--rank", "3")[1] == "r3\n"


def test_a_per_node_command_job_names_its_machines(home: Path, tmp_path: Path, capsys) -> None:  # type: ignore[no-untyped-def]
    registered_job(
        home, "per-node", tmp_path / "job", num_nodes=2, devices=4, command_mode="per_node", logs={0: "n0\n", 1: "n1\n"}
    )
    code, _, err = _cli(capsys, "logs", "per-node", "--rank", "2")
    assert code == 2 and "Invalid --rank 2: expected one of machines 0-1 of this 2-machine job" in _one_line(err)
    assert _cli(capsys, "logs", "per-node", "--rank", "1")[1] == "n1\n"


@pytest.mark.parametrize("tail", ["0", "-1"])
def test_a_tail_below_one_is_one_line(home: Path, tmp_path: Path, capsys, tail: str) -> None:  # type: ignore[no-untyped-def]
    """Item 14: before, --tail 0 printed the whole log and --tail -1 all but its first line."""
    registered_job(home, "tails", tmp_path / "job", logs={0: "a\nb\n"})
    code, out, err = _cli(capsys, "logs", "tails", "--tail", tail)
    assert code == 2 and out == ""
    assert _one_line(err) == (
        f"mmt: Invalid --tail {tail}: expected a whole number >= 1. HINT: leave it out for the whole log"
    )


def test_the_sdk_refuses_the_same_rank_and_tail(home: Path, tmp_path: Path) -> None:
    from mmt import Job

    registered_job(home, "sdk-checks", tmp_path / "job", num_nodes=1, devices=2, logs={0: "a\n", 1: "b\n"})
    job = Job.get("sdk-checks")
    with pytest.raises(ConfigError, match=r"Invalid rank=2: expected one of ranks 0-1 of this 1 x 2 job"):
        job.logs(rank=2)
    with pytest.raises(ConfigError, match=r"Invalid tail=0: expected a whole number >= 1"):
        job.logs(tail=0)
    assert job.logs(rank=1, tail=1) == "b\n"


# ------------------------------------------------------------------------------------- item 17: Lightning parity


@pytest.fixture
def submitted(monkeypatch: pytest.MonkeyPatch) -> List[Any]:
    """Job.run's RunSpecs, captured instead of submitted."""
    from types import SimpleNamespace

    from mmt import sdk

    specs: List[Any] = []

    def fake_run(spec: Any) -> List[Any]:
        specs.append(spec)
        return [SimpleNamespace(plan=SimpleNamespace(name=spec.name or "generated"))]

    monkeypatch.setattr(sdk, "run", fake_run)
    return specs


def test_lightning_defaults_are_accepted(submitted: List[Any]) -> None:
    """Item 17: a Lightning user passes Lightning's defaults explicitly (interruptible=False was refused)."""
    from mmt import MMT, Job

    Job.run(
        command="true",
        name="a",
        interruptible=False,
        studio=None,
        teamspace=None,
        cloud=None,
        cloud_account_auth=False,
        reuse_snapshot=True,
        entrypoint="sh -c",
        max_run_attempts=1,
        tags=[],
        path_mappings={},
        keep_minutes=None,
    )
    MMT.run(command="true", name="b", num_machines=2, interruptible=False)
    assert [s.name for s in submitted] == ["a", "b"] and submitted[1].num_machines == 2


def test_lightnings_positional_order_is_kept(submitted: List[Any]) -> None:
    """Item 17: ``Job.run(name, machine, cloud, command, ...)``, ``MMT.run(name, num_machines, machine, ...)``."""
    from mmt import MMT, Job, Machine

    Job.run("pos-job", Machine.T4, None, "echo hi")
    MMT.run("pos-mmt", 3, "A100_X_8", None, "echo hi")
    assert [(s.name, s.machine, s.command, s.num_machines) for s in submitted] == [
        ("pos-job", "t4", "echo hi", 1),
        ("pos-mmt", "A100_X_8", "echo hi", 3),
    ]


@pytest.mark.parametrize(
    "given, minutes",
    [
        (3600, 60),
        (90.0, 1.5),
        ("1h", 60),
        ("90m", 90),
        ("3600s", 60),
        ("1h30m", 90),
        (" 2 h ", 120),
        ("45", 0.75),
        ("1d", 1440),
    ],
)
def test_max_runtime_takes_seconds_or_a_duration(submitted: List[Any], given: Any, minutes: float) -> None:
    """Item 17: max_runtime="1h" leaked a TypeError."""
    from mmt import Job

    Job.run(command="true", max_runtime=given)
    assert submitted[0].timeout_min == pytest.approx(minutes)


@pytest.mark.parametrize("given", ["soon", "1 hour", "-5", 0, -3, True, "", "inf", float("nan")])
def test_a_max_runtime_that_is_no_duration_is_one_clear_line(submitted: List[Any], given: Any) -> None:
    from mmt import Job

    with pytest.raises(
        ConfigError,
        match=r"^Invalid max_runtime=.*: expected a duration > 0: seconds \(3600\), or "
        r"with units: 90s, 90m, 1h, 1h30m, 2d\.$",
    ):
        Job.run(command="true", max_runtime=given)
    assert submitted == []


@pytest.mark.parametrize(
    "key, value, hint",
    [
        ("cloud_account", "acct", "mmt runs on this host or on SLURM: use cluster="),
        ("interruptible", True, "preemption is SLURM's"),
        ("studio", "s", "mmt runs in this environment"),
    ],
)
def test_lightning_parameters_with_a_meaning_elsewhere_are_refused_with_the_equivalent(
    submitted: List[Any], key: str, value: Any, hint: str
) -> None:
    """Item 17: cloud_account= was a bare TypeError."""
    from mmt import Job

    with pytest.raises(ConfigError) as raised:
        Job.run(command="true", **{key: value})
    assert f"Invalid {key}={value!r}: a Lightning AI parameter that mmt does not have. HINT: " in str(raised.value)
    assert hint in str(raised.value) and submitted == []


def test_max_run_attempts_has_lightnings_meaning_attempts_are_restarts_plus_one(submitted: List[Any]) -> None:
    from mmt import Job

    Job.run(command="true", max_run_attempts=3)
    Job.run(command="true")
    assert [spec.max_restarts for spec in submitted] == [2, None]
    for bad in (0, True, "3", 1.5):
        with pytest.raises(ConfigError, match=r"^Invalid max_run_attempts=.*: expected a whole number >= 1\. HINT: "):
            Job.run(command="true", max_run_attempts=bad)
    assert len(submitted) == 2


def test_an_unknown_parameter_names_what_there_is(submitted: List[Any]) -> None:
    from mmt import Job

    with pytest.raises(TypeError, match=r"Job.run\(\) got an unexpected keyword argument 'colour' \(mmt's: name, "):
        Job.run(command="true", colour="red")


def test_machine_names_and_from_str_are_lightnings() -> None:
    """Item 17: Machine.from_str and a machine's .name raised AttributeError."""
    from mmt import Machine

    assert Machine.A100_X_8.name == "A100_X_8" and Machine.A100_X_8 == "a100_x_8" and str(Machine.T4) == "t4"
    assert f"{Machine.CPU}" == "cpu"
    for text, name in [
        ("A100_X_8", "A100_X_8"),
        ("a100-x-8", "A100_X_8"),
        ("lit-a100-8", "A100_X_8"),
        ("cpu-4", "CPU"),
        ("cpu-2", "CPU_SMALL"),
        ("lit-t4-1-small", "T4_SMALL"),
        ("lit-rtx-6000-pro-2", "RTXP_6000_X_2"),
        ("lit-h200x-8", "H200_X_8"),
        ("p4d.24xlarge", "A100_X_8"),
        (Machine.L4, "L4"),
    ]:
        assert Machine.from_str(text).name == name, text
    site = Machine.from_str("my_site_box")  # Lightning: an ad-hoc machine; here a site's conf/machine/ entry
    assert (site.name, site.value, isinstance(site, Machine)) == ("MY_SITE_BOX", "my_site_box", True)
    assert Machine.H100_X_8.accelerator_count == 8 and Machine.CPU.is_cpu() and not Machine.T4.is_cpu()


def test_the_handle_has_link_json_dict_and_a_lightning_machine(home: Path, tmp_path: Path) -> None:
    """Item 17: job.link, job.json() and job.machine.name raised AttributeError."""
    from mmt import Job

    registered_job(home, "facts", tmp_path / "job", num_nodes=2, devices=1, machine="a100_x_8")
    job = Job.get("facts")
    assert job.link == (tmp_path / "job").as_uri()
    facts = json.loads(job.json())
    assert (facts["name"], facts["status"], facts["topology"], facts["dir_exists"]) == (
        "facts",
        "Completed",
        "2 x 1",
        True,
    )
    assert job.dict() == facts
    assert job.machine.name == "A100_X_8" and job.machine == "a100_x_8"


def test_a_lightning_flag_is_not_taken_for_a_longer_one(home: Path, capsys) -> None:  # type: ignore[no-untyped-def]
    """Item 17: argparse's prefix matching read --cloud-account as --cloud-account-auth, with that flag's hint."""
    code, _, err = _cli(capsys, "run", "--command", "true", "--cloud-account", "acct")
    assert code == 2 and _one_line(err) == (
        "mmt: --cloud-account is a Lightning AI flag that mmt does not have. HINT: "
        "mmt runs on this host or on SLURM: use --cluster local|slurm|ray|<site "
        "config>"
    )
    code, _, err = _cli(capsys, "run", "--command", "true", "--interruptible")  # Lightning's is a flag, no value
    assert code == 2 and "--interruptible is a Lightning AI flag" in _one_line(err)
    code, _, err = _cli(capsys, "run", "--command", "true", "--num-machine", "2")  # a prefix is no flag either
    assert code == 2 and _one_line(err).startswith(
        "mmt run: unknown flag --num-machine. HINT: did you mean --num-machines"
    )


# --------------------------------------------------------------------------------- item 18: a deleted job dir


def test_a_deleted_job_dir_is_said_not_shown_as_empty_logs(home: Path, tmp_path: Path, capsys) -> None:  # type: ignore[no-untyped-def]
    """Item 18: before, Completed with empty logs and no word that the files are gone."""
    from mmt import Job
    from mmt.core.errors import UsageError

    job_dir = tmp_path / "job"
    registered_job(home, "gone", job_dir, num_nodes=2, devices=1, logs={0: "a\n", 1: "b\n"})
    shutil.rmtree(job_dir)
    job = Job.get("gone")
    assert job.status.value == "Completed"  # what was recorded
    for read in (lambda: job.logs(), lambda: job.logs(tail=1), lambda: job.machines[1].logs):
        with pytest.raises(
            UsageError,
            match=f"the job dir {job_dir} of gone was deleted: its logs and files are "
            "gone \\(the registry still records it as Completed\\)",
        ):
            read()
    code, out, err = _cli(capsys, "logs", "gone")
    assert code == 2 and out == "" and "was deleted" in _one_line(err)
    code, out, _ = _cli(capsys, "inspect", "gone")
    assert code == 0 and f"files         the job dir {job_dir} of gone was deleted" in out
    code, out, _ = _cli(capsys, "inspect", "gone", "--json")
    assert json.loads(out)["dir_exists"] is False


# -------------------------------------------------------------------------------------------------------- lows


def test_a_corrupt_registry_is_one_line_saying_what_to_do(home: Path, capsys) -> None:  # type: ignore[no-untyped-def]
    """Low: a damaged registry file gave sqlite3's traceback in every verb."""
    (home / "registry.sqlite").write_bytes(b"this is not SQLite\n" * 300)
    for argv in (["list"], ["inspect", "x"], ["logs", "x"], ["stop", "x"], ["wait", "x"], ["delete", "x"]):
        code, _, err = _cli(capsys, *argv)
        line = _one_line(err)
        assert code == 2 and line.startswith(
            f"mmt: the job registry {home / 'registry.sqlite'} cannot be used: "
            "file is not a database. HINT: the file is damaged: move it aside"
        ), argv


def test_planner_errors_name_the_flag_that_was_typed(home: Path, capsys) -> None:  # type: ignore[no-untyped-def]
    """Low: --num-machines 0 was reported as num_nodes, --max-runtime -5 in minutes of hydra.launcher.timeout_min."""
    code, _, err = _cli(capsys, "run", "--command", "true", "--num-machines", "0", "--dry-run")
    assert code == 2 and _one_line(err) == (
        "mmt: Invalid --num-machines 0: expected a whole number >= 1. HINT: machines per job, e.g. --num-machines 2"
    )
    code, _, err = _cli(capsys, "run", "--command", "true", "--max-runtime", "-5", "--dry-run")
    assert code == 2 and _one_line(err).startswith("mmt: Invalid --max-runtime -5: expected a duration > 0")
    code, _, err = _cli(capsys, "run", "--command", "true", "--devices", "0", "--dry-run")
    assert code == 2 and _one_line(err).startswith("mmt: Invalid --devices 0: expected a whole number >= 1")
    # a key the user typed as a Hydra override stays as typed
    code, _, err = _cli(capsys, "run", "--command", "true", "--set", "num_nodes=0", "--dry-run")
    assert code == 2 and _one_line(err).startswith("mmt: Invalid num_nodes=0:")
    code, out, _ = _cli(capsys, "run", "--command", "true", "--max-runtime", "1h30m", "--dry-run")
    assert code == 0 and "time limit 90 min" in out


@pytest.mark.parametrize(
    "flag, typed, listed, close",
    [("--machine", "A100X8", "a100, a100_x_2", "a100_x_8"), ("--cluster", "slrum", "local, ray, slurm", "slurm")],
)
def test_a_mistyped_machine_or_cluster_is_one_line_listing_what_exists(
    home: Path,
    capsys,
    flag: str,  # type: ignore[no-untyped-def]
    typed: str,
    listed: str,
    close: str,
) -> None:
    """Low: a 47-line Hydra dump before."""
    code, _, err = _cli(capsys, "run", "--command", "true", flag, typed, "--dry-run")
    line = _one_line(err)
    assert code == 2 and line.startswith(f"mmt: Invalid {flag} {typed.lower()}: there is no such ")
    assert f"there are: {listed}" in line and f"did you mean {close}" in line


def test_the_sdk_names_a_mistyped_machine_in_its_terms(home: Path) -> None:
    from mmt import Job

    with pytest.raises(ConfigError, match=r"^Invalid machine='a100x8': there is no such machine; there are: a100, "):
        Job.run(command="true", machine="A100X8")


def test_a_dashboard_port_out_of_range_is_one_line(capsys) -> None:  # type: ignore[no-untyped-def]
    """Low: --port 99999 was an OverflowError traceback."""
    for port in ("99999", "-1"):
        code, _, err = _cli(capsys, "dashboard", "--port", port)
        assert code == 2 and _one_line(err) == (
            f"mmt dashboard: Invalid --port {port}: expected a port 0-65535 (0: any free port)"
        )


def test_detach_with_dashboard_is_refused_not_dropped(home: Path, capsys, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """Low: --detach --dashboard submitted the job and silently served no page."""
    from mmt.launching import prepare
    from mmt.service import submit

    def no_backend(*_a: Any, **_k: Any) -> None:
        raise AssertionError("a job was about to be submitted")

    monkeypatch.setattr(prepare, "make_backend", no_backend)
    code, _, err = _cli(capsys, "run", "--command", "true", "--detach", "--dashboard")
    assert code == 2 and _one_line(err).startswith(
        "mmt: --dashboard serves the live page for as long as an attached "
        "run lasts, and --detach returns at once. HINT: leave --dashboard "
        "out, and run `mmt dashboard`"
    )
    with pytest.raises(
        ConfigError,
        match=r"Invalid hydra.launcher.dashboard=True: the live page lasts as long as an "
        r"attached run",
    ):
        submit.run(submit.RunSpec(command="true", detach=True, overrides=["hydra.launcher.dashboard=true"]))


def test_a_piped_list_is_one_line_per_job_however_wide(home: Path, tmp_path: Path, capsys) -> None:  # type: ignore[no-untyped-def]
    """CI: piped, `mmt list` wrapped its rows at 250 columns once a Ray job id widened the table, so a status with its
    note was cut across two lines and a script's grep (or a test's) missed it."""
    long_name = "n" * 300
    registered_job(home, long_name, tmp_path / "long")
    registered_job(home, "short", tmp_path / "short", state="FAILED")
    code, out, _ = _cli(capsys, "list")
    lines = out.splitlines()
    assert code == 0 and len(lines) == 3, out  # the header and one line per job
    assert any(line.split()[:2] == [long_name, "Completed"] for line in lines), out
    assert any(line.split()[:2] == ["short", "Failed"] for line in lines), out
