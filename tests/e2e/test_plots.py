"""summary.png of real sweeps (a probe sweep, the README's sweep), and mmt.monitor.plots imported in a fresh
interpreter without matplotlib. (Drawing from fake sweep dirs: tests/unit/test_plots.py.)"""

import subprocess
import sys

from helpers.app import results, run_app
from helpers.paths import REPO
from helpers.plots import PNG_SIGNATURE, axis_labels, plotted, plotted_jobs
from mmt.monitor.plots import sweep_figure


def test_importing_the_module_does_not_import_matplotlib():
    code = "import sys, mmt.monitor.plots; assert 'matplotlib' not in sys.modules, 'matplotlib imported'"
    done = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr


def test_a_real_probe_sweep_is_plotted(tmp_path, tag):
    done = run_app("recipe=probe", "num_nodes=1,2", "devices=2", sweep_dir=tmp_path, tag=tag)
    assert done.returncode == 0, done.stderr[-3000:]
    assert [r["status"] for r in results(tmp_path)] == ["COMPLETED", "COMPLETED"]
    # the engine wrote it at the end of the sweep
    assert (tmp_path / "summary.png").read_bytes()[:8] == PNG_SIGNATURE
    # the file on disk plots both jobs, each with its metric
    assert plotted_jobs(tmp_path / "summary.png") == [
        ("0", "num_nodes=1", "COMPLETED"),
        ("1", "num_nodes=2", "COMPLETED"),
    ]
    assert plotted(tmp_path / "summary.png")["metric"] == "seconds_to_first_collective"
    assert all(isinstance(job["metric"], float) for job in plotted(tmp_path / "summary.png")["jobs"])
    [ax] = sweep_figure(tmp_path).axes  # the probe writes no metrics.csv: no curves panel
    assert {"num_nodes=1", "num_nodes=2"} <= axis_labels(ax)
    assert ax.get_ylabel() == "seconds_to_first_collective"


def test_the_readme_sweep_is_plotted_with_both_jobs_and_their_curves(tmp_path, tag):
    # the README's main job (`python train.py -m num_nodes=1,2 devices=2`), shortened
    done = run_app(
        "num_nodes=1,2", "devices=2", "recipe.max_steps=6", "recipe.val_check_interval=3", sweep_dir=tmp_path, tag=tag
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert (tmp_path / "summary.png").read_bytes()[:8] == PNG_SIGNATURE
    # the file the engine wrote at the end plots both jobs: their metric and their curves
    assert plotted_jobs(tmp_path / "summary.png") == [
        ("0", "num_nodes=1", "COMPLETED"),
        ("1", "num_nodes=2", "COMPLETED"),
    ]
    drawn = plotted(tmp_path / "summary.png")
    assert drawn["metric"] == "val_loss"
    assert all(isinstance(job["metric"], float) and "train_loss" in job["curves"] for job in drawn["jobs"])
    metric, curves = sweep_figure(tmp_path).axes
    assert {"num_nodes=1", "num_nodes=2"} <= axis_labels(metric) and metric.get_ylabel() == "val_loss"
    assert {"num_nodes=1", "num_nodes=2"} <= axis_labels(curves)
