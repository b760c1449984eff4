"""Restarts and hang detection without a process: the engine's restart policy against the scriptable fake backend,
the settings' validation, the records, reading a real faulthandler dump, and the hang's one line."""

import faulthandler
import os
import time
from pathlib import Path
from typing import Any, Dict, Optional, Tuple

import pytest

from helpers.fake_backend import FakeBackend, FakeSettings, Script, launcher_cfg
from helpers.plans import local_plan
from helpers.sbatch import ATTEMPT, render, sbatch_plan, slurm_settings
from mmt.backends.slurm import backend as slurm_backend
from mmt.backends.slurm.backend import SlurmBackend
from mmt.core import rank_env, stacks
from mmt.core.errors import ConfigError
from mmt.core.jobdir import Attempt, JobDir
from mmt.core.states import JobState
from mmt.launching import engine
from mmt.launching.console import Console
from mmt.monitor import hangs
from mmt.planning.plan import JobPlan, Limits, plan_job
from mmt.records.outcome import first_failure
from mmt.records.payload import JobPayload
from mmt.records.registry import Registry
from mmt.records.schema import EarlierRun, ErrorRecord, ExitRecord, ResultRecord

# ------------------------------------------------------------------------------------------------ the engine's policy


@pytest.fixture
def registry(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Registry:
    monkeypatch.setenv("MMT_HOME", str(tmp_path / "home"))
    return Registry()


def _plan(sweep: Path, max_restarts: int = 0, **launcher: Any) -> JobPlan:
    cfg = launcher_cfg()
    cfg.max_restarts, cfg.restart_backoff_s = max_restarts, 0
    for key, value in launcher.items():
        cfg[key] = value
    return plan_job(
        cfg,
        num=0,
        name=f"restarting-{sweep.name}",
        job_id="fake-0",
        overrides=["x=0"],
        job_dir=str(sweep / "0"),
        limits=Limits(8, 8, 64, "test"),
        launcher_env={},
    )


def _launch(
    sweep: Path, plan: JobPlan, runs: Dict[Tuple[int, int], Script], registry: Registry, survives: bool = False
) -> Tuple[engine.LaunchReport, FakeBackend]:
    backend = FakeBackend(FakeSettings(runs=runs, survives_launcher=survives))
    job = engine.PreparedJob(
        JobPayload(plan=plan, callbacks=None, task_function=None, config=None, singleton_state=None)
    )
    console = Console()
    try:
        report = engine.launch([job], backend, engine.LaunchOptions(sweep_dir=sweep, registry=registry), console)
    finally:
        console.close()
    return report, backend


FAILS = Script(state=JobState.FAILED, failing_rank=3)
COMPLETES = Script(value={"loss": 0.5})


def test_a_failed_run_restarts_the_whole_job_in_its_dir_and_record(tmp_path: Path, registry: Registry) -> None:
    report, backend = _launch(tmp_path, _plan(tmp_path, 1), {(0, 0): FAILS, (0, 1): COMPLETES}, registry)
    [job] = report.jobs
    assert job.outcome.status == JobState.COMPLETED and job.record.restarts == 1
    # one attempt (its payload, its claim), run twice: the second with the count one higher and the time used
    first, second = backend.submitted
    assert first.attempt == second.attempt and first.submission.restart == 0 and second.submission.restart == 1
    assert second.submission.time_used_s == pytest.approx(1.5)
    [run] = job.record.earlier_runs
    assert run.restart == 0 and "rank 3 (node 0) raised ValueError: boom" in run.error
    record = registry.require(f"restarting-{tmp_path.name}")
    assert record.restarts == 1 and record.state == "COMPLETED" and record.attempt == first.attempt.id
    assert ResultRecord.from_dict(record.result or {}).earlier_runs == (run,)


def test_restarts_run_out_and_the_job_fails_naming_every_run(tmp_path: Path, registry: Registry) -> None:
    report, backend = _launch(tmp_path, _plan(tmp_path, 2), {(0, r): FAILS for r in range(3)}, registry)
    [job] = report.jobs
    assert len(backend.submitted) == 3 and job.outcome.status == JobState.FAILED
    assert [run.restart for run in job.record.earlier_runs] == [0, 1]
    head = (job.record.error or "").splitlines()[0]
    assert "(run 2, after 2 restart(s); earlier: run 0: " in head and "; run 1: " in head


@pytest.mark.parametrize("state", [JobState.TIMEOUT, JobState.INTERRUPTED, JobState.COMPLETED])
def test_only_a_failure_restarts(tmp_path: Path, registry: Registry, state: JobState) -> None:
    report, backend = _launch(tmp_path, _plan(tmp_path, 3), {(0, 0): Script(state=state, value=1)}, registry)
    assert len(backend.submitted) == 1 and report.jobs[0].outcome.status == state
    assert report.jobs[0].record.restarts == 0


def test_a_job_that_concludes_itself_is_its_schedulers_to_restart(tmp_path: Path, registry: Registry) -> None:
    report, backend = _launch(tmp_path, _plan(tmp_path, 3), {(0, 0): FAILS}, registry, survives=True)
    assert len(backend.submitted) == 1 and report.jobs[0].outcome.status == JobState.FAILED


# ------------------------------------------------------------------------------------------------ the settings


@pytest.mark.parametrize(
    "key, value, expected",
    [
        ("max_restarts", -1, "Invalid hydra.launcher.max_restarts=-1: expected a whole number >= 0"),
        ("max_restarts", 1001, "Invalid hydra.launcher.max_restarts=1001: expected a whole number <= 1,000"),
        ("restart_backoff_s", -2, "Invalid hydra.launcher.restart_backoff_s=-2.0: expected a number > 0"),
        ("hang_timeout_min", 0, "Invalid hydra.launcher.hang_timeout_min=0: expected a number > 0"),
    ],
)
def test_a_bad_restart_setting_is_one_line_naming_it(tmp_path: Path, key: str, value: Any, expected: str) -> None:
    with pytest.raises(ConfigError) as raised:
        _plan(tmp_path, **{key: value})
    assert str(raised.value).startswith(expected) and "HINT: " in str(raised.value)


def test_the_settings_reach_the_plan_and_every_rank(tmp_path: Path) -> None:
    plan = _plan(tmp_path, 2, hang_timeout_min=1.5)
    assert (plan.max_restarts, plan.restart_backoff_s, plan.hang_timeout_s) == (2, 0.0, 90.0)
    env = rank_env.contract_env(
        plan.place(1), per_node=False, master_addr="a", master_port=1, job_dir="d", job_id="j", restart=1,
        max_restarts=plan.max_restarts,
    )  # fmt: skip
    assert env["MMT_RESTART_COUNT"] == "1" and env["MMT_MAX_RESTARTS"] == "2"
    info = rank_env.RankInfo.from_env(env)
    assert (info.restart_count, info.max_restarts) == (1, 2)
    # a launch from inside a job: that job's heartbeat and stack file are not this one's
    kept = rank_env.scrubbed({"MMT_HEARTBEAT": "/x", "MMT_STACKS_FILE": "/y", "MMT_RESTART_COUNT": "4", "A": "1"})
    assert kept == {"A": "1"}


def test_slurm_restarts_inside_the_allocation_and_watches_hangs_where_an_agent_runs(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # SLURM's commands as if on PATH: the unit tier runs before CI starts the test cluster
    monkeypatch.setattr(slurm_backend.shutil, "which", lambda name: f"/usr/bin/{name}")
    watched = sbatch_plan(max_restarts=2, hang_timeout_s=600.0)
    assert SlurmBackend(slurm_settings()).problems(watched) == []  # each node's agent watches
    per_rank = SlurmBackend(slurm_settings(tasks="per_rank"))
    assert per_rank.problems(watched) == []  # no agent, no watch: said, never refused (a recipe may turn it on)
    assert (
        "  WARNING    hydra.launcher.hang_timeout_min=10 is not watched with hydra.launcher.tasks=per_rank"
        in "\n".join(per_rank.describe(watched))
    )
    plain = render(sbatch_plan(), slurm_settings())
    looped = render(sbatch_plan(max_restarts=2), slurm_settings())
    srun = next(line for line in plain.splitlines() if line.startswith("srun "))
    # the srun step, unchanged, inside a loop that only the restart step continues; the script ends with its status
    assert f"    {srun}" in looped.splitlines() and srun not in plain.replace(srun, "", 1)
    assert looped.replace(plain.split(srun)[0], "", 1).splitlines()[:2] == ["export MMT_RESTART_COUNT=0", "while :; do"]
    assert f'-m mmt.backends.slurm.restart {ATTEMPT.dir} "$rc" || break' in looped
    assert '[ "$rc" -ne 0 ] && [ -z "${MMT_BATCH_TERMINATED:-}" ] || break' in looped
    assert looped.rstrip().endswith('done\n(exit "$rc")')


# ------------------------------------------------------------------------------------------------ the records


def test_a_result_keeps_its_earlier_runs_and_an_older_one_has_none() -> None:
    runs = (EarlierRun(restart=0, error="rank 3 was killed by SIGKILL", started_at=1.0, ended_at=2.0, duration_s=1.0),)
    record = ResultRecord(status=JobState.COMPLETED, earlier_runs=runs)
    data = record.to_dict()
    assert data["restarts"] == 1 and ResultRecord.from_dict(data).earlier_runs == runs
    older = ResultRecord(status=JobState.COMPLETED).to_dict()
    assert "earlier_runs" not in older and ResultRecord.from_dict(older).restarts == 0


def test_a_runs_process_records_are_set_aside_and_its_payload_stays(tmp_path: Path) -> None:
    attempt = Attempt(tmp_path / "job" / ".mmt" / "attempts" / "a1").create()
    names = ["error.3.json", "exit.1.json", "done.0", "agent.1.json", "return.pkl", "heartbeat.2", "job.pkl"]
    for name in names:
        (attempt.dir / name).write_text(name)
    stacks = JobDir(tmp_path / "job").stacks
    stacks.mkdir()
    (stacks / "node0.rank0.txt").write_text("Current thread")
    aside = attempt.set_run_aside(0)
    assert sorted(p.name for p in aside.iterdir()) == sorted(names[:-1])
    assert sorted(p.name for p in attempt.dir.iterdir() if p.is_file()) == ["job.pkl"]
    # a hang's stacks stay, under the run's number
    assert (stacks / "run.0" / "node0.rank0.txt").read_text() == "Current thread" and not list(stacks.glob("*.txt"))


# ------------------------------------------------------------------------------------------------ hangs


def _dump_here(path: Path) -> str:
    """A real faulthandler dump of this process, taken inside a function of this file."""
    with open(path, "w") as handle:
        faulthandler.dump_traceback(file=handle, all_threads=True)
    return path.read_text()


def test_a_real_dump_says_where_the_main_thread_is(tmp_path: Path) -> None:
    found = stacks.where(_dump_here(tmp_path / "dump.txt"))
    assert found is not None and found.own is not None
    assert found.own.function == "_dump_here" and found.own.file == __file__
    assert found.place.startswith("test_restarts.py:") and found.inside is None


def test_the_innermost_frame_inside_a_library_is_named_apart_from_the_users_line() -> None:
    dump = (
        "Thread 0x00007f1 (most recent call first):\n"
        '  File "/usr/lib/python3.11/threading.py", line 320 in wait\n'
        "\n"
        "Current thread 0x00007f0 (most recent call first):\n"
        '  File "/venv/lib/python3.11/site-packages/torch/distributed/distributed_c10d.py", line 2501 in all_reduce\n'
        '  File "/home/me/train.py", line 88 in step\n'
        '  File "/home/me/train.py", line 120 in main\n'
    )
    found = stacks.where(dump)
    assert found is not None and found.place == "train.py:88 in step" and found.inside == "all_reduce"
    assert stacks.where("") is None


def test_a_hang_names_who_waits_together_and_who_never_arrived(tmp_path: Path) -> None:
    plan = local_plan(job_dir=str(tmp_path), hang_timeout_s=6.0)
    waiting = (
        '  File "/v/lib/python3.11/site-packages/torch/x.py", line 9 in all_reduce\n  File "/a/t.py", line 5 in s\n'
    )
    late = '  File "/a/t.py", line 7 in load\n'
    for index, frames in enumerate([waiting, waiting, waiting, late]):
        path = hangs.stack_files(plan)[index]
        path.parent.mkdir(exist_ok=True)
        path.write_text("Current thread 0x1 (most recent call first):\n" + frames)
    assert hangs.stacks_written(plan, [0, 1, 2, 3])
    assert hangs.describe(plan, 6.2, [0, 1, 2, 3]) == (
        "hung: no progress (output or training step) for 6 s, hydra.launcher.hang_timeout_min=0.1: "
        f"ranks 0, 1, 2 at t.py:5 in s (inside all_reduce); rank 3 at t.py:7 in load. Stacks: {tmp_path}/stacks/"
    )


def test_progress_is_any_change_to_a_log_or_heartbeat(tmp_path: Path) -> None:
    log, beat = tmp_path / "node0.rank0.log", tmp_path / "heartbeat.0"
    log.write_text("")
    watch = hangs.ProgressWatch(10.0, (log, beat), last_change=0.0)
    assert watch.stalled_for(5.0) == 0.0  # the first look sees files it has not seen
    assert watch.stalled_for(9.0) == 4.0
    beat.touch()
    assert watch.stalled_for(12.0) == 0.0
    log.write_text("a line\n")
    assert watch.stalled_for(12.5) == 0.5  # looked at most once a second
    assert watch.stalled_for(13.5) == 0.0


def test_a_rank_beats_and_arms_only_where_asked(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(stacks.HEARTBEAT_VAR, raising=False)
    stacks.beat()  # nothing asked: nothing written, nothing raised
    heartbeat = tmp_path / "heartbeat.0"
    monkeypatch.setenv(stacks.HEARTBEAT_VAR, str(heartbeat))
    stacks.beat()
    first = heartbeat.stat().st_mtime_ns
    time.sleep(0.01)
    stacks.beat()
    assert heartbeat.stat().st_mtime_ns > first
    assert not os.environ.get(stacks.STACKS_VAR) and stacks.arm() is False


def test_a_silent_death_is_the_cause_of_the_collective_errors_just_before_its_reap(tmp_path: Path) -> None:
    """The restart benchmark's SIGKILLed rank 3 was reported as rank 2's "Connection reset by peer": its peer raised
    before the agent reaped it."""
    plan = local_plan(job_dir=str(tmp_path / "job"), num_nodes=1, devices=4)
    attempt = JobDir(tmp_path / "job").attempt("a1").create()
    ErrorRecord(exception="RuntimeError: Connection reset by peer", time=100.0).write(attempt.error_file(2))
    ExitRecord(code=1, time=100.1).write(attempt.exit_file(2))
    ExitRecord(code=-15, stopped=True, time=100.4).write(attempt.exit_file(0))
    ExitRecord(code=-9, time=100.3).write(attempt.exit_file(3))
    failure = first_failure(plan, attempt)
    assert failure is not None and failure.rank == 3 and failure.signal == "SIGKILL"
    # a death long after the first error is not its cause
    ExitRecord(code=-9, time=110.0).write(attempt.exit_file(3))
    failure = first_failure(plan, attempt)
    assert failure is not None and failure.rank == 2 and failure.exception == "RuntimeError: Connection reset by peer"


def test_a_recipes_hang_timeout_is_not_a_commands_and_an_explicit_one_is(tmp_path: Path) -> None:
    def planned(command: Optional[str], explicit: Optional[float] = None) -> Optional[float]:
        cfg = launcher_cfg(hang_timeout_min=10, command=command)  # the top-level key: what recipe=lm sets
        if explicit is not None:
            cfg.hang_timeout_min = explicit  # hydra.launcher.hang_timeout_min=...
        plan = plan_job(
            cfg, num=0, name="n", job_id="j", overrides=[], job_dir=str(tmp_path), limits=Limits(8, 8, 64, "t"),
            launcher_env={},
        )  # fmt: skip
        return plan.hang_timeout_s

    assert planned(None) == 600.0  # the recipe runs: its own setting
    assert planned("sleep 3600") is None  # a silent command is not a silent training loop
    assert planned("sleep 3600", explicit=0.5) == 30.0


def test_a_new_attempt_sets_an_earlier_hangs_stacks_aside_with_its_logs(tmp_path: Path) -> None:
    job_dir = JobDir(tmp_path / "job")
    job_dir.logs.mkdir(parents=True)
    job_dir.stacks.mkdir()
    (job_dir.logs / "node0.rank0.log").write_text("hello\n")
    (job_dir.stacks / "node0.rank0.txt").write_text("Current thread")
    aside = job_dir.set_logs_aside("a1")
    assert aside is not None and (aside / "stacks" / "node0.rank0.txt").read_text() == "Current thread"
    assert not list(job_dir.stacks.glob("*.txt"))  # a new attempt's hang reads only its own
