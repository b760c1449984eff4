"""Issue 17, round 3: what the console and the summary say. A rerun into the same dir shows only its own output
(item 7), a returned number is labelled with the key it is (item 15), a strategy that spawns its own processes is
refused when the job is planned (item 16); notes without terminal control sequences, a bounded overrides column, and
every line the console did not show counted. The engine runs against the fake backend (tests/helpers/fake_backend.py):
no process is started."""

import csv
import dataclasses
import io
import threading
from pathlib import Path
from typing import Any, List, Optional

import pytest
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

from helpers.fake_backend import FakeBackend, FakeJob, FakeSettings, Script, launcher_cfg
from helpers.paths import REPO
from helpers.plots import plotted
from mmt.backends.base import Submission
from mmt.core.errors import ConfigError, RankFailure
from mmt.core.jobdir import JobDir, SweepDir, read_json
from mmt.core.states import JobState
from mmt.launching import console as console_module
from mmt.launching import engine
from mmt.launching.console import Console, LogFollower
from mmt.launching.report import MAX_OVERRIDES
from mmt.monitor.plots import write_sweep_plot
from mmt.planning.conflicts import check_strategies
from mmt.planning.plan import JobPlan, Limits, plan_job
from mmt.records.outcome import JobOutcome
from mmt.records.payload import JobPayload
from mmt.records.registry import Registry
from mmt.service.handle import RegisteredJob

THIRD_PARTY_CONFIGS = REPO / "examples" / "third_party_app" / "configs"


@pytest.fixture
def registry(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Registry:
    monkeypatch.setenv("MMT_HOME", str(tmp_path / "home"))
    return Registry()


def _plan(sweep: Path, num: int, name: str, overrides: Optional[List[str]] = None, **app: Any) -> JobPlan:
    return plan_job(
        launcher_cfg(**app),
        num=num,
        name=name,
        job_id=f"{name}-id",
        overrides=overrides or [f"x={num}"],
        job_dir=str(sweep / str(num)),
        limits=Limits(8, 8, 64, "test"),
        launcher_env={},
    )


def _job(plan: JobPlan) -> engine.PreparedJob:
    return engine.PreparedJob(
        JobPayload(plan=plan, callbacks=None, task_function=None, config=None, singleton_state=None)
    )


def _launch(sweep: Path, plans: List[JobPlan], backend: FakeBackend, registry: Optional[Registry] = None) -> str:
    """Launch on the fake backend; what the console printed."""
    out = io.StringIO()
    console = Console(out)
    try:
        engine.launch(
            [_job(p) for p in plans], backend, engine.LaunchOptions(sweep_dir=sweep, registry=registry), console
        )
    finally:
        console.close()
    return out.getvalue()


class WritingBackend(FakeBackend):
    """The fake backend, whose ranks write their logs as mmt's do (appending to logs/node<n>.rank<r>.log), and whose
    failing rank's failure names its real log."""

    def __init__(self, settings: FakeSettings, lines: List[str]) -> None:
        super().__init__(settings)
        self.lines = lines

    def submit(self, submission: Submission) -> FakeJob:
        job = super().submit(submission)
        job_dir = JobDir(Path(submission.plan.job_dir))
        job_dir.logs.mkdir(parents=True, exist_ok=True)
        for rank in range(submission.plan.world_size):
            with open(job_dir.log(0, rank, False), "a") as log:
                log.writelines(f"rank {rank}: {line}\n" for line in self.lines)
        return job

    def _end(self, handle: FakeJob) -> JobOutcome:
        outcome = super()._end(handle)
        if outcome.failure is not None:
            failure = outcome.failure
            log = JobDir(Path(handle.plan.job_dir)).log(0, failure.rank, False)
            outcome.failure = RankFailure(
                rank=failure.rank,
                node_rank=0,
                exit_code=failure.exit_code,
                signal=None,
                exception=failure.exception,
                traceback=None,
                log=str(log),
            )
        return outcome


# ------------------------------------------------------------------------------ 7. a rerun into the same dir


EARLIER = [
    "Traceback (most recent call last):",
    '  File "train.py", line 9, in main',
    "EarlierRunError: the earlier run's own failure",
]


def test_a_rerun_into_the_same_dir_shows_only_its_own_output_and_its_own_failure(
    tmp_path: Path, registry: Registry
) -> None:
    first = WritingBackend(FakeSettings(scripts={0: Script(state=JobState.FAILED, failing_rank=1)}), EARLIER)
    _launch(tmp_path, [_plan(tmp_path, 0, "first")], first, registry)
    earlier_attempt = read_json(JobDir(tmp_path / "0").result)["attempt"]

    # the same job dir again (a fixed hydra.sweep.dir, a name reused after `mmt delete`, a resume from last.ckpt):
    # this run's failing rank writes two lines and no traceback
    second = WritingBackend(
        FakeSettings(scripts={0: Script(state=JobState.FAILED, failing_rank=1)}),
        ["this run's own line", "this run's last line"],
    )
    shown = _launch(tmp_path, [_plan(tmp_path, 0, "second")], second, registry)

    assert "EarlierRunError" not in shown and "Traceback" not in shown, shown  # neither followed nor in the tail
    assert "rank 0: this run's own line" in shown  # rank 0, followed from this attempt's start
    tail = shown[shown.index("--- last lines of") :]
    assert "rank 1: this run's last line" in tail
    # the earlier run's logs are set aside, whole, under its attempt; logs/ holds this attempt's only
    logs = JobDir(tmp_path / "0").logs
    assert (logs / "node0.rank1.log").read_text() == "rank 1: this run's own line\nrank 1: this run's last line\n"
    aside = logs / "previous" / earlier_attempt
    assert (aside / "node0.rank1.log").read_text() == "".join(f"rank 1: {line}\n" for line in EARLIER)
    assert f"the earlier run's logs are in {aside}" in shown
    # `mmt logs` of each registered job reads its own attempt's log
    assert "EarlierRunError" in RegisteredJob("first", registry).logs(rank=1)
    assert RegisteredJob("second", registry).logs(rank=1).endswith("this run's last line\n")
    assert "EarlierRunError" in RegisteredJob("first", registry).machines[0].logs


def test_a_job_dir_without_earlier_logs_sets_nothing_aside(tmp_path: Path) -> None:
    shown = _launch(tmp_path, [_plan(tmp_path, 0, "only")], WritingBackend(FakeSettings(), ["hello"]))
    assert "rank 0: hello" in shown and "earlier run" not in shown
    assert not (JobDir(tmp_path / "0").logs / "previous").exists()


# ------------------------------------------------------------------------- 15. the metric's label is its key


def test_a_returned_number_is_labelled_with_the_key_it_is_everywhere(tmp_path: Path) -> None:
    # lightning-hydra-template: optimized_metric: val/acc_best, and its task returns that metric's float; the
    # launcher's summary_metric (launcher_cfg sets "loss") names a key of a dict the job never returned
    plans = [
        _plan(tmp_path, num, f"tpl-{num}", overrides=[f"model.lr={num + 1}"], optimized_metric="val/acc_best")
        for num in range(2)
    ]
    backend = FakeBackend(FakeSettings(scripts={0: Script(value=0.875), 1: Script(value=0.9)}))
    shown = _launch(tmp_path, plans, backend)

    header = next(line for line in shown.splitlines() if line.startswith("#  overrides"))
    assert header.split()[-1] == "val/acc_best" and "loss" not in header, shown
    with open(SweepDir(tmp_path).summary_csv, newline="") as handle:
        rows = list(csv.reader(handle))
    assert rows[0][7] == "val/acc_best" and rows[1][7] == "0.875"
    assert read_json(JobDir(tmp_path / "0").result)["summary_metric"] == "val/acc_best"
    png = write_sweep_plot(tmp_path)
    assert png is not None and plotted(png)["metric"] == "val/acc_best"


def test_a_returned_dict_keeps_the_summary_metric_and_a_bare_number_is_the_result(tmp_path: Path) -> None:
    plans = [_plan(tmp_path / "dict", 0, "d-0", optimized_metric="val/acc_best")]
    shown = _launch(tmp_path / "dict", plans, FakeBackend(FakeSettings(scripts={0: Script(value={"loss": 0.5})})))
    assert next(line for line in shown.splitlines() if line.startswith("#  overrides")).split()[-1] == "loss"
    # a number, and no key the app names for it: not the recipe's dict key
    plans = [_plan(tmp_path / "bare", 0, "b-0")]
    shown = _launch(tmp_path / "bare", plans, FakeBackend(FakeSettings(scripts={0: Script(value=0.5)})))
    assert next(line for line in shown.splitlines() if line.startswith("#  overrides")).split()[-1] == "result"
    assert read_json(JobDir(tmp_path / "bare" / "0").result)["summary_metric"] is None


# ---------------------------------------------------------------- 16. strategies that start their own processes


def _third_party(*overrides: str) -> Any:
    with initialize_config_dir(config_dir=str(THIRD_PARTY_CONFIGS), job_name="train_app", version_base="1.3"):
        return compose("train", overrides=list(overrides), return_hydra_config=True)


@pytest.mark.parametrize(
    "override, key, value",
    [
        ("trainer.strategy=ddp_spawn", "trainer.strategy", "ddp_spawn"),
        ("trainer.strategy=ddp_notebook", "trainer.strategy", "ddp_notebook"),
        (
            "trainer.strategy=ddp_fork_find_unused_parameters_true",
            "trainer.strategy",
            "ddp_fork_find_unused_parameters_true",
        ),
        (
            "trainer.strategy={_target_:lightning.pytorch.strategies.DDPStrategy,start_method:spawn}",
            "trainer.strategy.start_method",
            "spawn",
        ),
    ],
)
def test_a_strategy_that_starts_its_own_processes_is_refused_in_one_line(override: str, key: str, value: str) -> None:
    config = _third_party(override)  # the job's composed config, as the launcher plans it
    with pytest.raises(ConfigError) as refused:
        check_strategies(config)
    message = str(refused.value)
    assert (refused.value.key, refused.value.value) == (key, value)
    assert "\n" not in message and value in message and "trainer.strategy=ddp" in message
    assert "mmt starts the processes" in message


def test_the_templates_ddp_sim_and_a_fabric_are_refused_and_plain_ddp_is_not() -> None:
    ddp_sim = OmegaConf.create(
        {
            "trainer": {
                "_target_": "lightning.pytorch.trainer.Trainer",
                "accelerator": "cpu",
                "devices": 2,
                "strategy": "ddp_spawn",
            }
        }
    )
    with pytest.raises(ConfigError, match=r"Invalid trainer.strategy='ddp_spawn'"):
        check_strategies(ddp_sim)
    fabric = OmegaConf.create({"recipe": {"fabric": {"_target_": "lightning.fabric.Fabric", "strategy": "ddp_fork"}}})
    with pytest.raises(ConfigError, match=r"recipe.fabric.strategy='ddp_fork'"):
        check_strategies(fabric)
    strategy_group = OmegaConf.create({"strategy": "ddp_spawn", "trainer": {"strategy": "${strategy}"}})
    with pytest.raises(ConfigError, match=r"trainer.strategy='ddp_spawn'"):
        check_strategies(strategy_group)
    # what runs under mmt: ddp, auto, a DDPStrategy without a spawning start method; a strategy outside a
    # trainer; the hydra node; an interpolation that does not resolve here (the rank names it)
    for fine in (
        _third_party(),
        _third_party("trainer=ddp"),
        _third_party("trainer.strategy=auto"),
        OmegaConf.create(
            {
                "trainer": {
                    "strategy": {"_target_": "lightning.pytorch.strategies.DDPStrategy", "find_unused_parameters": True}
                }
            }
        ),
        OmegaConf.create({"search": {"strategy": "spawn_many"}}),
        OmegaConf.create({"trainer": {"strategy": "${oc.env:MMT_TEST_NOT_SET_ANYWHERE}"}}),
    ):
        check_strategies(fine)


# --------------------------------------------------------------------------------------------------- lows


def test_control_sequences_of_an_exception_never_reach_the_summary(tmp_path: Path) -> None:
    class Colourful(FakeBackend):
        def _end(self, handle: FakeJob) -> JobOutcome:
            failure = RankFailure(
                rank=1,
                node_rank=0,
                exit_code=1,
                signal=None,
                log="/dev/null",
                exception="\x1b[1;31mValueError\x1b[0m: \x1b]0;pwned\x07bad \x1b[4mvalue\x1b[0m\x07",
                traceback=None,
            )
            return JobOutcome(JobState.FAILED, 1.0, failure=failure)

    shown = _launch(tmp_path, [_plan(tmp_path, 0, "ansi")], Colourful(FakeSettings()))
    summary = shown[shown.index("mmt summary") :]
    assert "\x1b" not in summary and "\x07" not in summary, repr(summary)
    assert "raised ValueError: bad value" in summary
    note = list(csv.DictReader(io.StringIO(SweepDir(tmp_path).summary_csv.read_text())))[0]["note"]
    assert "\x1b" not in note and "ValueError: bad value" in note


def test_the_overrides_column_stays_one_short_line_and_summary_csv_keeps_them_whole(tmp_path: Path) -> None:
    long = ["num_nodes=1", f"command='python train.py {'--flag ' * 60}\nsecond line'", "+x=last"]
    shown = _launch(tmp_path, [_plan(tmp_path, 0, "long", overrides=long)], FakeBackend(FakeSettings()))
    summary = shown[shown.index("mmt summary") :].split("\n\n")[0].splitlines()
    row = next(line for line in summary if line.startswith("0  "))
    cells = row.split("  ")
    assert cells[1].startswith("num_nodes=1 command=") and cells[1].endswith("+x=last") and " ... " in cells[1]
    assert len(cells[1]) <= MAX_OVERRIDES and len(row) < MAX_OVERRIDES + 60, row
    with open(SweepDir(tmp_path).summary_csv, newline="") as handle:
        assert next(csv.DictReader(handle))["overrides"] == " ".join(long)  # every character, the newline too


def test_a_fast_writer_cut_off_at_the_end_of_its_job_is_counted_not_dropped_silently(tmp_path: Path) -> None:
    log = tmp_path / "node0.rank0.log"
    log.write_text("".join(f"line {i}\n" for i in range(200_000)) + "unfinished")
    out = io.StringIO()
    console = Console(out)
    follower = LogFollower(log, "[#0 n0 r0] ", console)
    follower.finish(budget_s=0.0)  # the job ended; the console gets no time at all to catch up
    console.close()
    shown = out.getvalue().splitlines()
    note = [line for line in shown if "not shown" in line]
    assert len(note) == 1 and str(log) in note[0], shown[-3:]
    printed = sum(1 for line in shown if line.startswith("[#0 n0 r0] line ") or line == "[#0 n0 r0] unfinished")
    counted = int(note[0].split("[mmt] ")[1].split()[0].rstrip("+"))
    assert printed + counted == 200_001  # every line is either shown or counted


def test_lines_the_console_dropped_are_counted_even_when_nothing_is_written_after_them(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(console_module, "_QUEUE", 8)
    release = threading.Event()

    class Stuck(io.StringIO):
        def write(self, text: str) -> int:
            release.wait(10)  # a stdout nobody reads, for now
            return super().write(text)

    out = Stuck()
    console = Console(out)
    for i in range(50):
        console.write(f"line {i}\n")
    assert console.dropped > 0
    release.set()
    console.close()
    assert "line(s) not shown: the console could not keep up" in out.getvalue(), out.getvalue()[-300:]


# -------------------------------------------------- one summary metric: the console, summary.png and the page


@pytest.mark.parametrize(
    "returned, key, name",
    [
        ([{"loss": 0.5, "val_loss": 0.25}, {"loss": 0.4, "val_loss": 0.125}], None, "loss"),  # a dict: its first number
        ([{"loss": 0.5, "val_loss": 0.25}, {"loss": 0.4, "val_loss": 0.125}], "val_loss", "val_loss"),  # the recipe's
        ([0.75, 0.5], None, "result"),  # a bare number the app names no key for
        ([0.75, 0.5], "val/acc_best", "val/acc_best"),  # a bare number under the key the app optimises
    ],
)
def test_the_console_summary_png_and_the_page_show_the_same_metric_and_value(
    tmp_path: Path, returned: List[Any], key: Optional[str], name: str
) -> None:
    from mmt.dashboard import data

    app = {"optimized_metric": key} if isinstance(returned[0], float) and key else {}
    plans = [_plan(tmp_path, num, f"m-{num}", overrides=[f"lr={num + 1}"], **app) for num in range(2)]
    if isinstance(returned[0], dict):  # the recipe's summary_metric (launcher_cfg sets "loss"): set or cleared
        plans = [dataclasses.replace(plan, summary_metric=key) for plan in plans]
    scripts = {num: Script(value=value) for num, value in enumerate(returned)}
    shown = _launch(tmp_path, plans, FakeBackend(FakeSettings(scripts=scripts)))
    expected = [
        value[name] if isinstance(value, dict) else value for value in returned
    ]  # what each job produced under that name

    # the console: the column's name, and each job's number in its row
    lines = shown.splitlines()
    header = next(line for line in lines if line.startswith("#  overrides"))
    assert header.split()[-1] == name, shown
    rows = [next(line for line in lines if line.startswith(f"{num}  ")) for num in range(2)]
    assert [float(row.split()[-1]) for row in rows] == expected, shown
    # summary.png: its metric's label, and each job's number
    png = write_sweep_plot(tmp_path)
    assert png is not None and plotted(png)["metric"] == name
    assert [job["metric"] for job in plotted(png)["jobs"]] == expected
    # the page: each job's metric and its name, and the sweep chart's
    jobs = [data.job_summary(str(num), (tmp_path / str(num)).resolve()) for num in range(2)]
    assert [(job["metric_name"], job["metric"]) for job in jobs] == [(name, value) for value in expected]
    assert data.swept_parameters(jobs)["metric_name"] == name
