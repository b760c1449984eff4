"""summary.png of a sweep (mmt.monitor.plots), drawn from fake sweep dirs. (From real sweeps, and the module's light
import: tests/e2e/test_plots.py.)"""

import json
import os
from pathlib import Path
from typing import Optional

from PIL import Image

from helpers.plots import PNG_SIGNATURE, axis_labels, plotted, plotted_jobs
from mmt.monitor.plots import sweep_figure, write_sweep_plot

# Lightning's CSVLogger: a row per logged step, validation on rows of its own (the other cells empty)
LIGHTNING_CSV = "epoch,step,train_loss,val_loss\n0,0,9.2,\n0,1,9.0,\n0,1,,8.8\n0,2,8.7,\n0,3,8.5,\n0,3,,8.4\n"
# mmt's own recipes: a row per validation; an empty and a non-numeric cell must be skipped, not fatal
MMT_CSV = "step,train_loss,val_loss\n20,7.9,7.7\n40,7.1,\n60,oops,6.9\n"


def _job(
    sweep: Path,
    num: int,
    overrides,
    status="COMPLETED",
    value=None,
    metrics: Optional[str] = None,
    summary_metric: Optional[str] = "val_loss",
) -> None:
    job_dir = sweep / str(num)
    job_dir.mkdir(parents=True)
    record = {
        "job": num,
        "name": f"train-{num}",
        "attempt": "a",
        "overrides": overrides,
        "status": status,
        "num_nodes": 1,
        "devices": 2,
        "world_size": 2,
        "machine": "cpu",
        "duration_s": 1.0,
        "stop_latency_s": None,
        "scheduler_id": None,
        "started_at": 0.0,
        "ended_at": 1.0,
        "summary_metric": summary_metric,
        "return_value": value,
        "failure": None if status == "COMPLETED" else {"rank": 1},
        "error": None if status == "COMPLETED" else "job 2: rank 1 raised RuntimeError",
    }
    (job_dir / "result.json").write_text(json.dumps(record))
    if metrics is not None:
        (job_dir / "metrics.csv").write_text(metrics)


def _sweep(tmp_path: Path) -> Path:
    """3 jobs sweeping num_nodes (numeric) and recipe.optim (categorical), job 2 FAILED; unreadable dirs."""
    sweep = tmp_path / "sweep"
    # the first numeric value is samples_per_s: the metric is the named val_loss; env values differ (ignored)
    _job(
        sweep,
        0,
        ["recipe=lm", "num_nodes=1", "recipe.optim=sgd", "+env.RUN=a"],
        value={"samples_per_s": 100.0, "val_loss": 6.5},
        metrics=LIGHTNING_CSV,
    )
    _job(
        sweep,
        1,
        ["recipe=lm", "num_nodes=2", "recipe.optim=adam", "+env.RUN=b"],
        value={"samples_per_s": 180.0, "val_loss": 6.3},
        metrics=MMT_CSV,
    )
    _job(sweep, 2, ["recipe=lm", "num_nodes=4", "recipe.optim=adam", "+env.RUN=c"], status="FAILED")
    (sweep / "3").mkdir()
    (sweep / "3" / "result.json").write_text('{"job": 3, "status": "COMPL')  # cut short
    (sweep / "4").mkdir()
    (sweep / "4" / "result.json").write_text("[1, 2]")  # JSON, but not a record
    (sweep / "notes").mkdir()  # not a job dir
    (sweep / "notes" / "result.json").write_text(json.dumps({"job": 9, "status": "COMPLETED"}))
    return sweep


LABELS = ["num_nodes=1 recipe.optim=sgd", "num_nodes=2 recipe.optim=adam", "num_nodes=4 recipe.optim=adam"]


def _line(ax, label: str):
    [line] = [line for line in ax.get_lines() if line.get_label() == label]
    return line


def test_a_panel_per_swept_parameter_and_one_of_training_curves(tmp_path):
    fig = sweep_figure(_sweep(tmp_path))
    nodes, optim, curves = fig.axes  # +env.RUN differs between jobs but is no axis; recipe=lm is not swept
    assert fig.get_suptitle() == "mmt sweep sweep: 3 jobs (2 COMPLETED, 1 FAILED)"
    for ax in (nodes, optim):
        assert ax.get_ylabel() == "val_loss"
        assert set(LABELS) <= axis_labels(ax), "every job, failed or not, is in every metric panel"

    # numeric: a line through the completed jobs sorted by value, the metric named by summary_metric
    assert nodes.get_title() == "val_loss vs num_nodes" and nodes.get_xlabel() == "num_nodes"
    assert list(_line(nodes, LABELS[1]).get_ydata()) == [6.3]
    assert [t.get_text() for t in nodes.get_xticklabels()] == ["1", "2", "4"]
    # the failed job: a marker at its x, at the bottom, named by its status
    assert list(_line(nodes, LABELS[2]).get_xdata()) == [4.0]
    assert "FAILED" in [text.get_text() for text in nodes.texts]

    # categorical: bars, one per completed job; the failed one marked
    assert optim.get_title() == "val_loss vs recipe.optim"
    assert [t.get_text() for t in optim.get_xticklabels()] == ["sgd", "adam"]
    bars = {container.get_label(): container for container in optim.containers}
    assert set(bars) == set(LABELS[:2])
    assert bars[LABELS[0]].patches[0].get_height() == 6.5
    assert "FAILED" in [text.get_text() for text in optim.texts]

    # curves: both CSV styles read, empty and non-numeric cells skipped; the failed job has no metrics.csv
    assert curves.get_xlabel() == "step" and "train_loss" in curves.get_title()
    assert set(LABELS[:2]) <= axis_labels(curves) and LABELS[2] not in axis_labels(curves)
    assert list(_line(curves, LABELS[0]).get_xdata()) == [0, 1, 2, 3]
    assert list(_line(curves, LABELS[1]).get_ydata()) == [7.9, 7.1]  # "oops" skipped
    val = [line for line in curves.get_lines() if line.get_linestyle() == "None"]
    assert sorted(len(line.get_xdata()) for line in val) == [2, 2], "val_loss as markers, one series per job"


def test_the_png_is_written_atomically_and_is_a_png(tmp_path):
    sweep = _sweep(tmp_path)
    path = write_sweep_plot(sweep)
    assert path == sweep / "summary.png"
    data = path.read_bytes()
    assert data[:8] == PNG_SIGNATURE and len(data) > 1000
    assert not [p.name for p in sweep.iterdir() if p.name.startswith(".")], "no temp file left behind"
    assert write_sweep_plot(sweep) == path and path.read_bytes()[:8] == PNG_SIGNATURE  # replaced in place
    assert plotted_jobs(path) == [
        ("0", LABELS[0], "COMPLETED"),
        ("1", LABELS[1], "COMPLETED"),
        ("2", LABELS[2], "FAILED"),
    ]
    assert plotted(path)["metric"] == "val_loss"
    assert [job["curves"] for job in plotted(path)["jobs"]] == [["train_loss", "val_loss"]] * 2 + [[]]
    with Image.open(path) as image:  # and in words, for any PNG viewer
        assert all(label in image.text["Description"] for label in LABELS)
    if os.environ.get("MMT_KEEP_PLOT"):  # to look at it: MMT_KEEP_PLOT=/tmp/x.png pytest tests/unit/test_plots.py
        Path(os.environ["MMT_KEEP_PLOT"]).write_bytes(data)


def test_a_plot_drawn_before_the_last_job_ended_says_so(tmp_path):
    sweep = _sweep(tmp_path)
    last = json.loads((sweep / "2" / "result.json").read_text())
    (sweep / "2" / "result.json").unlink()  # job 2 still running
    path = write_sweep_plot(sweep)
    assert [job[0] for job in plotted_jobs(path)] == ["0", "1"]
    (sweep / "2" / "result.json").write_text(json.dumps(last))
    write_sweep_plot(sweep)
    assert [job[0] for job in plotted_jobs(path)] == ["0", "1", "2"]


def test_nothing_to_plot_gives_none(tmp_path):
    assert sweep_figure(tmp_path) is None and write_sweep_plot(tmp_path) is None
    assert write_sweep_plot(tmp_path / "missing") is None
    (tmp_path / "0").mkdir()  # a job that has not finished yet
    (tmp_path / "1").mkdir()
    (tmp_path / "1" / "result.json").write_text("not json")
    assert write_sweep_plot(tmp_path) is None
    assert not (tmp_path / "summary.png").exists()


def test_a_single_job_shows_its_value(tmp_path):
    _job(tmp_path, 0, ["num_nodes=2"], value=0.25, summary_metric=None, metrics="step,train_loss\n1,2.0\n2,1.5\n")
    fig = sweep_figure(tmp_path)
    metric, curves = fig.axes
    [bars] = metric.containers  # a non-dict number is the metric itself
    assert bars.get_label() == "job 0" and bars.patches[0].get_height() == 0.25
    assert metric.get_ylabel() == "result" and "job 0" in axis_labels(curves)


def test_the_metric_named_in_summary_csv_when_result_json_does_not_say(tmp_path):
    # result.json carries no summary_metric; summary.csv's metric column is what the console summary showed
    for num, lr in enumerate(["0.1", "1.0"]):
        _job(tmp_path, num, [f"recipe.lr={lr}"], value={"steps": 40, "val_loss": 7.0 - num}, summary_metric=None)
    header = "job,name,overrides,status,num_nodes,devices,duration_s,val_loss,note\n"
    (tmp_path / "summary.csv").write_text(header)
    [ax] = sweep_figure(tmp_path).axes
    assert ax.get_ylabel() == "val_loss" and list(_line(ax, "recipe.lr=1.0").get_ydata()) == [6.0]
    (tmp_path / "summary.csv").unlink()  # else the first number of the dict, as the engine's summary does
    [ax] = sweep_figure(tmp_path).axes
    assert ax.get_ylabel() == "steps"


def test_odd_records_and_files_are_skipped_not_fatal(tmp_path):
    odd = [
        {"job": "zero", "overrides": "num_nodes=1", "status": None, "return_value": [1, 2]},  # wrong types
        {
            "overrides": ["num_nodes=inf", 3, "~trainer.logger"],
            "status": "COMPLETED",
            "return_value": {"val_loss": "6.1", "flag": True},
            "summary_metric": 7,
        },  # no number anywhere
        {"job": 2, "overrides": ["num_nodes=2"], "status": "COMPLETED", "return_value": {"val_loss": 6.0}},
    ]
    for num, record in enumerate(odd):
        (tmp_path / str(num)).mkdir()
        (tmp_path / str(num) / "result.json").write_text(json.dumps(record))
    (tmp_path / "0" / "metrics.csv").write_bytes(b"\xff\xfe\x00binary")
    (tmp_path / "1" / "metrics.csv").mkdir()  # not a file
    (tmp_path / "2" / "metrics.csv").write_text("step,train_loss\n")  # a header only
    (tmp_path / "5").write_text("a file named like a job dir")
    path = write_sweep_plot(tmp_path)
    assert path is not None and path.read_bytes()[:8] == PNG_SIGNATURE
    ax, deleted = sweep_figure(tmp_path).axes  # no curves; num_nodes is categorical ("inf", unset)
    assert deleted.get_title() == "val_loss vs ~trainer.logger"  # a deletion override is a value of its own
    assert {"(unset)", "inf", "2"} <= {t.get_text() for t in ax.get_xticklabels()}
    assert [c.patches[0].get_height() for c in ax.containers] == [6.0]
    assert {"UNKNOWN", "no metric"} <= {t.get_text() for t in ax.texts}  # why each job has no value


def test_a_sweep_dir_removed_while_its_plot_is_drawn_is_not_reported(tmp_path, monkeypatch):
    """A test's tmp dir (or a sweep dir the user removed) gone before the drawing is written: no file, no error, as
    for a sweep dir with nothing to plot (a write that fails in a sweep dir still there is reported: test_hardening)."""
    import shutil

    from mmt.monitor import plots

    sweep = _sweep(tmp_path)
    drawn = plots._draw
    monkeypatch.setattr(plots, "_draw", lambda *args: (drawn(*args), shutil.rmtree(sweep))[0])
    assert write_sweep_plot(sweep) is None and not sweep.exists()
