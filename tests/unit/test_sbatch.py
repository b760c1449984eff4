"""The sbatch scripts mmt generates: golden texts, and settings that could reach a script refused.

Rendering is pure (no cluster needed); the golden files (tests/golden/) are the exact scripts submitit writes.
pyxis and apptainer cannot run here, so their jobs are checked as text only. (The scripts' quoting run by bash,
and hostile values on the real cluster: tests/e2e/test_sbatch.py.)
"""

import sys

import pytest

from helpers.paths import GOLDEN
from helpers.sbatch import render, sbatch_plan, slurm_settings
from mmt.core.errors import ConfigError


def _check_golden(name: str, text: str) -> None:
    text = text.replace(sys.executable, "<python>")
    path = GOLDEN / name
    if not path.exists():  # record on first run, like submitit's own sbatch test
        path.write_text(text)
        pytest.fail(f"recorded {path}; check it and run again")
    assert text == path.read_text()


def test_pass_through_options_and_site_settings():
    settings = slurm_settings(
        partition="gpu",
        account="proj-42",
        qos="high",
        constraint="a100&ib",
        mem_gb=900,
        setup=["module load cuda/12.4", "source ~/venv/bin/activate"],
        sbatch_extra={"mail-type": "END", "exclusive": True, "comment": "lr sweep"},
        srun_extra=["--cpu-bind=cores"],
    )
    _check_golden("pass_through.sbatch", render(sbatch_plan(), settings))


def test_pyxis_container():
    settings = slurm_settings(container_runtime="pyxis", container_mounts=["/datasets:/data"])
    plan = sbatch_plan(image="nvcr.io/nvidia/pytorch:24.05-py3")
    _check_golden("pyxis.sbatch", render(plan, settings))


def test_apptainer_container():
    settings = slurm_settings(container_runtime="apptainer", container_mounts=["/datasets:/data"])
    plan = sbatch_plan(image="docker://nvcr.io/nvidia/pytorch:24.05-py3")
    _check_golden("apptainer.sbatch", render(plan, settings))


def test_per_node_command_starts_one_task_per_node():
    script = render(sbatch_plan(command="python train_fsdp.py"), slurm_settings())
    assert "#SBATCH --ntasks-per-node=1\n" in script and "#SBATCH --cpus-per-task=96\n" in script


@pytest.mark.parametrize("key", ["partition", "account", "qos", "constraint"])
def test_a_newline_cannot_reach_an_sbatch_line(key):
    with pytest.raises(ConfigError, match=rf"Invalid hydra.launcher.{key}=.*must fit on one line"):
        slurm_settings(**{key: "debug\ntouch /tmp/mmt-pwned"})


def test_sbatch_extra_cannot_take_over_what_the_plan_decides():
    with pytest.raises(ConfigError, match=r"--nodes is set by mmt from the job's plan"):
        slurm_settings(sbatch_extra={"nodes": 16})
    with pytest.raises(ConfigError, match=r"sbatch option names are lower-case letters"):
        slurm_settings(sbatch_extra={"Bad Name": 1})
