"""What keeps the launch path short, in processes of their own: a process's start read from /proc is on the wall
clock, the SLURM task runner imports no submitit (a tenth of a second on every node), and a launch that draws no
summary.png never imports matplotlib."""

import json
import subprocess
import sys

from helpers.paths import REPO


def test_a_process_start_time_is_on_the_wall_clock():
    child = subprocess.run(
        [
            sys.executable,
            "-c",
            "import time; from mmt.core import timeline; print(time.time() - timeline.process_start_time())",
        ],
        capture_output=True,
        text=True,
        check=True,
        env={"PYTHONPATH": str(REPO / "launcher_plugin")},
    )
    # the child's own start, read from /proc, lies before its first line and not long before it
    assert 0 <= float(child.stdout) < 5


def test_the_slurm_task_runner_imports_no_submitit():
    loaded = subprocess.run(
        [sys.executable, "-c", "import json, sys, mmt.backends.slurm.task; print(json.dumps(sorted(sys.modules)))"],
        capture_output=True,
        text=True,
        check=True,
        env={"PYTHONPATH": str(REPO / "launcher_plugin")},
    )
    assert not [m for m in json.loads(loaded.stdout) if m.split(".")[0] == "submitit"]


def test_a_sweep_with_nothing_to_draw_never_imports_matplotlib(tmp_path):
    job = tmp_path / "0"
    job.mkdir()
    (job / "result.json").write_text(json.dumps({"job": 0, "status": "COMPLETED", "return_value": 1.0}))
    drawn = subprocess.run(
        [
            sys.executable,
            "-c",
            "import sys; from pathlib import Path; from mmt.monitor.plots import write_sweep_plot; "
            f"print(write_sweep_plot(Path({str(tmp_path)!r})), 'matplotlib' in sys.modules)",
        ],
        capture_output=True,
        text=True,
        check=True,
        env={"PYTHONPATH": str(REPO / "launcher_plugin")},
    )
    assert drawn.stdout.split() == ["None", "False"]
