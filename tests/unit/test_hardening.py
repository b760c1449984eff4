"""Nothing lost, round 3 (issue 17), the cases a pure function decides. The cases that need real processes are in
tests/e2e/test_hardening.py."""

import json
from pathlib import Path

from PIL import Image

from helpers.plots import plotted
from mmt.monitor import plots


def _result(sweep: Path, num: int, overrides: list, value: float) -> None:
    job_dir = sweep / str(num)
    job_dir.mkdir(parents=True)
    record = {
        "job": num,
        "name": f"t-{num}",
        "attempt": "a",
        "overrides": overrides,
        "status": "COMPLETED",
        "num_nodes": 1,
        "devices": 1,
        "world_size": 1,
        "machine": "cpu",
        "duration_s": 1.0,
        "summary_metric": "loss",
        "return_value": {"loss": value},
        "failure": None,
        "error": None,
    }
    (job_dir / "result.json").write_text(json.dumps(record))


def test_a_dollar_in_a_swept_value_is_drawn_as_literal_text(tmp_path: Path) -> None:
    """Item 10: '$x^^y$' is not mathtext (matplotlib raised ValueError, and the launch failed after its jobs)."""
    sweep = tmp_path / "sweep"
    for num, tag in enumerate(["$x^^y$", "plain", "a$b", "$$"]):
        _result(sweep, num, [f"+tag={tag}", f"command='echo {tag}'"], value=float(num))
    path = plots.write_sweep_plot(sweep)
    assert path is not None and Image.open(path).size[0] > 0
    labels = {job["label"] for job in plotted(path)["jobs"]}
    assert any("$x^^y$" in label for label in labels), labels


def test_a_plot_that_cannot_be_drawn_is_reported_not_raised(tmp_path: Path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """Item 10: whatever drawing raises reaches the launcher as the OSError it reports under the summary."""

    def broken(_sweep: Path) -> None:
        raise ValueError("a drawing bug")

    monkeypatch.setattr(plots, "write_sweep_plot", broken)
    monkeypatch.setattr(plots.Plotter, "current", None)
    try:
        plots.Plotter.draw(tmp_path)
    except OSError as exc:
        assert "could not be drawn" in str(exc) and "ValueError: a drawing bug" in str(exc)
    else:
        raise AssertionError("expected an OSError")


def test_a_launch_that_loses_a_name_race_deletes_only_its_own_rows(tmp_path: Path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """Item 1: between a launch's name check and its insert, another launch registers the same name; the loser's
    give-up deleted the winner's record by name, and the winner ran where no `mmt list` could reach it."""
    import pytest

    from helpers.fake_backend import FakeBackend, FakeSettings, launcher_cfg
    from mmt.core.errors import UsageError
    from mmt.launching import engine
    from mmt.launching.console import Console
    from mmt.planning.plan import Limits, plan_job
    from mmt.records.payload import JobPayload
    from mmt.records.registry import Registry

    monkeypatch.setenv("MMT_HOME", str(tmp_path / "home"))

    def job(sweep: Path) -> engine.PreparedJob:
        plan = plan_job(
            launcher_cfg(),
            num=0,
            name="same",
            job_id=f"id-{sweep.name}",
            overrides=[],
            job_dir=str(sweep / "0"),
            limits=Limits(8, 8, 64, "test"),
            launcher_env={},
        )
        return engine.PreparedJob(
            JobPayload(plan=plan, callbacks=None, task_function=None, config=None, singleton_state=None)
        )

    winner_registry = Registry()
    console = Console()
    try:
        engine.launch(
            [job(tmp_path / "winner")],
            FakeBackend(FakeSettings()),
            engine.LaunchOptions(sweep_dir=tmp_path / "winner", registry=winner_registry),
            console,
        )
        winner = winner_registry.require("same")

        class CheckedBeforeTheWinner(Registry):  # the loser's name check ran before the winner's insert
            def names_taken(self, names):  # type: ignore[no-untyped-def]
                return []

        loser_backend = FakeBackend(FakeSettings())
        with pytest.raises(UsageError, match="exists already"):
            engine.launch(
                [job(tmp_path / "loser")],
                loser_backend,
                engine.LaunchOptions(sweep_dir=tmp_path / "loser", registry=CheckedBeforeTheWinner()),
                console,
            )
    finally:
        console.close()
    assert loser_backend.submitted == []
    kept = Registry().get("same")
    assert kept is not None and kept.attempt == winner.attempt and kept.job_dir == winner.job_dir
