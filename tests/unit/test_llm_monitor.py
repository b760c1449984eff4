"""recipe=llm's figures in the views over a job dir: the progress line shows the job's tokens/s, the page's curves
keep every column of its metrics.csv, and summary.png draws tokens/s in a panel of its own. Files written here in
recipe=llm's layout (recipes.llm.METRICS); the recipe itself writing them is tests/e2e/test_llm.py."""

import json
from pathlib import Path

from mmt.dashboard.data import parse_curves
from mmt.monitor.plots import sweep_figure
from mmt.monitor.progress import _Job, last_step

RATE_TITLE = "throughput: tokens/s of the job"

HEADER = "step,epoch,train_loss,lr,tokens_per_s,tokens_per_s_device,mfu,data_wait_s,step_s\n"
ROWS = [
    "1,0,6.44,0,12870.2,3217.6,,0.01879,0.15913\n",
    "2,0,6.45,0.0006,17175.1,4293.8,,0.00059,0.11924\n",
]


def test_the_progress_line_shows_the_newest_tokens_per_s(tmp_path: Path) -> None:
    metrics = tmp_path / "metrics.csv"
    metrics.write_text(HEADER + "".join(ROWS))
    assert last_step(metrics) == (2, 6.45)  # what other callers read is unchanged
    job = _Job(num=0, name="job", total=60, metrics=metrics, state="RUNNING")
    job.read(now=1.0)
    assert job.tokens_per_s == 17175.1
    assert job.describe() == "#0 step 2/60 loss 6.45 17,175 tok/s"


def test_a_metrics_file_without_tokens_per_s_shows_none(tmp_path: Path) -> None:
    metrics = tmp_path / "metrics.csv"
    metrics.write_text("step,train_loss,val_loss\n1,2.5,\n")
    job = _Job(num=3, name="job", total=None, metrics=metrics, state="RUNNING")
    job.read(now=1.0)
    assert job.tokens_per_s is None and job.describe() == "#3 step 1 loss 2.5"


def test_the_page_gets_every_figure_as_a_series() -> None:
    curves = parse_curves(HEADER + "".join(ROWS))
    assert curves["step"] == [1.0, 2.0]
    assert curves["series"]["tokens_per_s"] == [12870.2, 17175.1]
    assert curves["series"]["data_wait_s"] == [0.01879, 0.00059]
    assert "mfu" not in curves["series"]  # a CPU machine has no peak: an empty column, not a line at zero


def _llm_job(sweep: Path, num: int, lr: str) -> None:
    job_dir = sweep / str(num)
    job_dir.mkdir(parents=True)
    record = {
        "job": num,
        "name": f"train-{num}",
        "attempt": "a",
        "overrides": ["recipe=llm", f"recipe.lr={lr}"],
        "status": "COMPLETED",
        "num_nodes": 2,
        "devices": 2,
        "world_size": 4,
        "machine": "cpu",
        "duration_s": 20.0,
        "stop_latency_s": None,
        "scheduler_id": None,
        "started_at": 0.0,
        "ended_at": 20.0,
        "summary_metric": "val_loss",
        "return_value": {"val_loss": 4.8, "tokens_per_s": 17000.0},
        "failure": None,
        "error": None,
    }
    (job_dir / "result.json").write_text(json.dumps(record))
    (job_dir / "metrics.csv").write_text(HEADER + "".join(ROWS))


def test_summary_png_draws_the_jobs_tokens_per_s_in_a_panel_of_its_own(tmp_path: Path) -> None:
    sweep = tmp_path / "sweep"
    _llm_job(sweep, 0, "1e-3")
    _llm_job(sweep, 1, "3e-3")
    figure = sweep_figure(sweep)
    assert figure is not None
    titles = [ax.get_title() for ax in figure.axes]
    assert titles == ["val_loss vs recipe.lr", "training curves: train_loss (line), val_loss (o)", RATE_TITLE]
    [rates] = [ax for ax in figure.axes if ax.get_title() == RATE_TITLE]
    assert [list(line.get_ydata()) for line in rates.get_lines()] == [[12870.2, 17175.1]] * 2
    assert rates.get_ylabel() == "tokens/s"


def test_summary_png_has_no_throughput_panel_without_the_column(tmp_path: Path) -> None:
    sweep = tmp_path / "sweep"
    _llm_job(sweep, 0, "1e-3")
    _llm_job(sweep, 1, "3e-3")
    for num in (0, 1):
        (sweep / str(num) / "metrics.csv").write_text("step,train_loss,val_loss\n1,2.5,\n2,2.4,2.3\n")
    figure = sweep_figure(sweep)
    assert figure is not None and RATE_TITLE not in [ax.get_title() for ax in figure.axes]
