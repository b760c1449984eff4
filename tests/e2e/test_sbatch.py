"""No config value can inject shell code into the sbatch script mmt generates: its shell lines run by bash, and
hostile values on the real cluster. (The golden scripts: tests/unit/test_sbatch.py.)"""

import os
import subprocess
import sys
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from helpers.app import results, run_app
from helpers.sbatch import HOSTILE, render, sbatch_plan, slurm_settings


def test_hostile_values_are_quoted_in_the_script(tmp_path):
    settings = slurm_settings(
        partition=HOSTILE,
        sbatch_extra={"comment": HOSTILE},
        srun_extra=[HOSTILE],
        container_mounts=["/a b:/c'd"],
        container_runtime="apptainer",
    )
    script = render(sbatch_plan(image="img'; rm -rf /"), settings)
    path = tmp_path / "job.sh"
    path.write_text(script.replace("srun ", "printf '%s\\n' ", 1))
    # run the script's shell lines with srun replaced by printf: every argument arrives as one literal word
    out = subprocess.run(["bash", str(path)], capture_output=True, text=True, env={"PATH": os.environ["PATH"]})
    assert out.returncode == 0, out.stderr
    assert HOSTILE in out.stdout.splitlines()
    assert "img'; rm -rf /" in out.stdout.splitlines()
    assert not Path("/tmp/mmt-pwned").exists()


@pytest.mark.slurm
def test_hostile_values_reach_the_job_literally(slurm_cluster, tmp_path, tag):
    # a value with quotes, ';', '$()', backticks and a newline, in env (travels in the payload) and in an
    # sbatch comment (travels in the script); a per-rank command writes what each rank received
    conf = tmp_path / "conf"
    (conf / "hostile").mkdir(parents=True)
    (conf / "hostile" / "values.yaml").write_text(
        OmegaConf.to_yaml(
            OmegaConf.create(
                {
                    "env": {"HOSTILE": HOSTILE + "\nsecond line"},
                    "hydra": {"launcher": {"sbatch_extra": {"comment": HOSTILE}}},
                }
            )
        ).replace("env:", "# @package _global_\nenv:", 1)
    )
    dump = tmp_path / "dump.py"
    dump.write_text(
        "import os, pathlib\n"
        "pathlib.Path(os.environ['MMT_JOB_DIR'], f\"hostile.{os.environ['RANK']}\")"
        ".write_text(os.environ['HOSTILE'])\n"
    )
    done = run_app(
        "cluster=slurm",
        "recipe=probe",
        "num_nodes=2",
        "devices=1",
        "command_mode=per_rank",
        f"command='{sys.executable} {dump}'",
        f"hydra.searchpath=[file://{conf}]",
        "+hostile=values",
        sweep_dir=tmp_path / "sweep",
        tag=tag,
        timeout=180,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    [result] = results(tmp_path / "sweep")
    for rank in (0, 1):
        assert (tmp_path / "sweep" / "0" / f"hostile.{rank}").read_text() == HOSTILE + "\nsecond line"
    comment = subprocess.run(
        ["sacct", "-n", "-X", "-P", "-j", result["scheduler_id"], "-o", "Comment"], capture_output=True, text=True
    ).stdout.strip()
    assert comment in ("", HOSTILE)  # sacct stores comments only when AccountingStoreFlags=job_comment
    assert not Path("/tmp/mmt-pwned").exists()
