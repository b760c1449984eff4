"""The sbatch scripts mmt generates: golden texts, and no config value can inject shell code.

Rendering is pure (no cluster needed); the golden files are the exact scripts submitit writes. pyxis and
apptainer cannot run here, so their jobs are checked as text only; the injection test runs on the real cluster.
"""

import os
import subprocess
import sys
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from conftest import results, run_app
from hydra_plugins.mmt_launcher.config import SlurmLauncherConf
from mmt.backends.slurm.sbatch import SlurmSettings, render_script
from mmt.errors import ConfigError
from mmt.jobdir import Attempt
from mmt.planning.machine import Machine
from mmt.planning.plan import JobPlan

GOLDEN = Path(__file__).parent / "golden"
PROJECT = "/home/ada/project"
A100 = Machine(name="a100_x_8", accelerator="gpu", gpus=8, cpus=96, memory_gb=1152, price_per_hour=21.96)


def _plan(**overrides) -> JobPlan:
    values = dict(num=3, name="sweep-3", job_id="1202-101010-abcd-3", overrides=("num_nodes=2",), job_dir="/shared/sweep/3", num_nodes=2,
                  devices=8, machine=A100, image=None, command=None, command_mode="per_node", env={},
                  timeout_s=7200.0, dry_run=False)
    values.update(overrides)
    return JobPlan(**values)


def _settings(**overrides) -> SlurmSettings:
    cfg = OmegaConf.structured(SlurmLauncherConf)
    cfg.submitit_folder = "/shared/sweep/.submitit/%j"
    for key, value in overrides.items():
        cfg[key] = value
    return SlurmSettings.from_config(cfg)


ATTEMPT = Attempt(Path("/shared/sweep/3/.mmt/attempts/20261202T101010-abcdef"))


def _render(plan: JobPlan, settings: SlurmSettings) -> str:
    return render_script(plan, settings, PROJECT, "mmt-3", ATTEMPT)


def _check_golden(name: str, text: str) -> None:
    text = text.replace(sys.executable, "<python>")
    path = GOLDEN / name
    if not path.exists():  # record on first run, like submitit's own sbatch test
        path.write_text(text)
        pytest.fail(f"recorded {path}; check it and run again")
    assert text == path.read_text()


def test_pass_through_options_and_site_settings():
    settings = _settings(partition="gpu", account="proj-42", qos="high", constraint="a100&ib", mem_gb=900,
                         setup=["module load cuda/12.4", "source ~/venv/bin/activate"],
                         sbatch_extra={"mail-type": "END", "exclusive": True, "comment": "lr sweep"},
                         srun_extra=["--cpu-bind=cores"])
    _check_golden("pass_through.sbatch", _render(_plan(), settings))


def test_pyxis_container():
    settings = _settings(container_runtime="pyxis", container_mounts=["/datasets:/data"])
    plan = _plan(image="nvcr.io/nvidia/pytorch:24.05-py3")
    _check_golden("pyxis.sbatch", _render(plan, settings))


def test_apptainer_container():
    settings = _settings(container_runtime="apptainer", container_mounts=["/datasets:/data"])
    plan = _plan(image="docker://nvcr.io/nvidia/pytorch:24.05-py3")
    _check_golden("apptainer.sbatch", _render(plan, settings))


def test_per_node_command_starts_one_task_per_node():
    script = _render(_plan(command="python train_fsdp.py"), _settings())
    assert "#SBATCH --ntasks-per-node=1\n" in script and "#SBATCH --cpus-per-task=96\n" in script


HOSTILE = "it's; $(touch /tmp/mmt-pwned) `touch /tmp/mmt-pwned` && echo \"x\" | cat"


def test_hostile_values_are_quoted_in_the_script(tmp_path):
    settings = _settings(partition=HOSTILE, sbatch_extra={"comment": HOSTILE}, srun_extra=[HOSTILE],
                         container_mounts=["/a b:/c'd"], container_runtime="apptainer")
    script = _render(_plan(image="img'; rm -rf /"), settings)
    path = tmp_path / "job.sh"
    path.write_text(script.replace("srun ", "printf '%s\\n' ", 1))
    # run the script's shell lines with srun replaced by printf: every argument arrives as one literal word
    out = subprocess.run(["bash", str(path)], capture_output=True, text=True, env={"PATH": os.environ["PATH"]})
    assert out.returncode == 0, out.stderr
    assert HOSTILE in out.stdout.splitlines()
    assert "img'; rm -rf /" in out.stdout.splitlines()
    assert not Path("/tmp/mmt-pwned").exists()


@pytest.mark.parametrize("key", ["partition", "account", "qos", "constraint"])
def test_a_newline_cannot_reach_an_sbatch_line(key):
    with pytest.raises(ConfigError, match=rf"Invalid hydra.launcher.{key}=.*must fit on one line"):
        _settings(**{key: "debug\ntouch /tmp/mmt-pwned"})


def test_sbatch_extra_cannot_take_over_what_the_plan_decides():
    with pytest.raises(ConfigError, match=r"--nodes is set by mmt from the job's plan"):
        _settings(sbatch_extra={"nodes": 16})
    with pytest.raises(ConfigError, match=r"sbatch option names are lower-case letters"):
        _settings(sbatch_extra={"Bad Name": 1})


@pytest.mark.slurm
def test_hostile_values_reach_the_job_literally(slurm_cluster, tmp_path, tag):
    # a value with quotes, ';', '$()', backticks and a newline, in env (travels in the payload) and in an
    # sbatch comment (travels in the script); a per-rank command writes what each rank received
    conf = tmp_path / "conf"
    (conf / "hostile").mkdir(parents=True)
    (conf / "hostile" / "values.yaml").write_text(OmegaConf.to_yaml(OmegaConf.create({
        "env": {"HOSTILE": HOSTILE + "\nsecond line"},
        "hydra": {"launcher": {"sbatch_extra": {"comment": HOSTILE}}},
    })).replace("env:", "# @package _global_\nenv:", 1))
    dump = tmp_path / "dump.py"
    dump.write_text("import os, pathlib\n"
                    "pathlib.Path(os.environ['MMT_JOB_DIR'], f\"hostile.{os.environ['RANK']}\")"
                    ".write_text(os.environ['HOSTILE'])\n")
    done = run_app("cluster=slurm", "recipe=probe", "num_nodes=2", "devices=1", "command_mode=per_rank",
                   f"command='{sys.executable} {dump}'", f"hydra.searchpath=[file://{conf}]", "+hostile=values",
                   sweep_dir=tmp_path / "sweep", tag=tag, timeout=180)
    assert done.returncode == 0, done.stderr[-3000:]
    [result] = results(tmp_path / "sweep")
    for rank in (0, 1):
        assert (tmp_path / "sweep" / "0" / f"hostile.{rank}").read_text() == HOSTILE + "\nsecond line"
    comment = subprocess.run(["sacct", "-n", "-X", "-P", "-j", result["scheduler_id"], "-o", "Comment"],
                             capture_output=True, text=True).stdout.strip()
    assert comment in ("", HOSTILE)  # sacct stores comments only when AccountingStoreFlags=job_comment
    assert not Path("/tmp/mmt-pwned").exists()
