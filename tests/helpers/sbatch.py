"""An sbatch script rendered from a plan and the launcher's SLURM settings, as mmt writes it (no cluster needed)."""

from pathlib import Path

from omegaconf import OmegaConf

from hydra_plugins.mmt_launcher.config import SlurmLauncherConf
from mmt.backends.slurm.sbatch import SlurmSettings, render_script
from mmt.core.jobdir import Attempt
from mmt.planning.machine import Machine
from mmt.planning.plan import JobPlan

PROJECT = "/home/ada/project"
A100 = Machine(name="a100_x_8", accelerator="gpu", gpus=8, cpus=96, memory_gb=1152, price_per_hour=21.96)
ATTEMPT = Attempt(Path("/shared/sweep/3/.mmt/attempts/20261202T101010-abcdef"))
# quotes, ';', '$()', backticks, '&&' and a pipe: nothing of it may run as shell code
HOSTILE = 'it\'s; $(touch /tmp/mmt-pwned) `touch /tmp/mmt-pwned` && echo "x" | cat'


def sbatch_plan(**overrides) -> JobPlan:
    """Job 3 of a sweep: 2 nodes x 8 GPUs of a100_x_8, two hours; ``overrides`` replace any field."""
    values = dict(
        num=3,
        name="sweep-3",
        job_id="1202-101010-abcd-3",
        overrides=("num_nodes=2",),
        job_dir="/shared/sweep/3",
        num_nodes=2,
        devices=8,
        machine=A100,
        image=None,
        command=None,
        command_mode="per_node",
        env={},
        timeout_s=7200.0,
        dry_run=False,
    )
    values.update(overrides)
    return JobPlan(**values)


def slurm_settings(**overrides) -> SlurmSettings:
    """The ``mmt_slurm`` launcher's defaults with ``overrides`` set, validated as the launcher validates them."""
    cfg = OmegaConf.structured(SlurmLauncherConf)
    cfg.submitit_folder = "/shared/sweep/.submitit/%j"
    for key, value in overrides.items():
        cfg[key] = value
    return SlurmSettings.from_config(cfg)


def render(plan: JobPlan, settings: SlurmSettings) -> str:
    return render_script(plan, settings, PROJECT, "mmt-3", ATTEMPT)
