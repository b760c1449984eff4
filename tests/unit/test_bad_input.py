"""Bad input gets a clear error before anything starts: the key, the bad value, what is allowed, a hint.

Each case is one job of ``python train.py -m recipe=probe <overrides>``, composed in this process (Hydra's compose
API) and checked as the launcher checks it before it starts anything: its backend's settings (setup), the job's
plan, then what the backend can run. No process is started. (That the line reaches the console of a real launch,
without a traceback, and that nothing starts: tests/e2e/test_bad_input.py.)"""

from pathlib import Path
from typing import List

import pytest
from hydra.errors import ConfigCompositionException, MissingConfigException

from helpers.config import compose_train
from helpers.plans import planned
from mmt.core.errors import ConfigError

CASES = [
    (["num_nodes=0"], "Invalid num_nodes=0: expected a whole number >= 1"),
    (["num_nodes=-1"], "Invalid num_nodes=-1: expected a whole number >= 1"),
    (["num_nodes=two"], "Invalid num_nodes='two': expected a whole number >= 1. HINT"),
    (["devices=0"], "Invalid devices=0: expected a whole number >= 1"),
    (
        ["machine=a100_x_8", "devices=16"],
        "Invalid devices=16: machine 'a100_x_8' has 8 GPUs per node. HINT: use devices<=8",
    ),
    (["command=''"], "Invalid command='': expected a non-empty shell command, or null to run the recipe. HINT"),
    (["command='   '"], "Invalid command='   ': expected a non-empty shell command"),
    (["+env.BAD-NAME=1"], "Invalid env.BAD-NAME=***: environment variable names are letters, digits and _"),
    (["+env.RANK=3"], "Invalid env.RANK=***: RANK belongs to the rank contract the launcher sets"),
    # names the launcher scrubs from every rank: set here, Lightning would take the job for a SLURM or torchrun one
    (
        ["+env.SLURM_NTASKS=8"],
        "Invalid env.SLURM_NTASKS=***: SLURM_* variables are removed from every rank's environment",
    ),
    (["+env.TORCHELASTIC_RUN_ID=x"], "Invalid env.TORCHELASTIC_RUN_ID=***: TORCHELASTIC_* variables are removed"),
    (
        ["+env.PL_TRAINER_NUM_NODES=4"],
        "Invalid env.PL_TRAINER_NUM_NODES=***: PL_TRAINER_NUM_NODES belongs to the rank contract",
    ),
    (["+env.PL_TRAINER_STRATEGY=ddp_spawn"], "Invalid env.PL_TRAINER_STRATEGY=***: mmt starts every rank itself"),
    (
        ["hydra.launcher.master_addr='bad host'"],
        "Invalid hydra.launcher.master_addr='bad host': expected an IP address or a host name",
    ),
    (
        ["command_mode=sometimes", "command='true'"],
        "Invalid command_mode='sometimes': expected one of per_node, per_rank",
    ),
    (["hydra.launcher.timeout_min=0"], "Invalid hydra.launcher.timeout_min=0.0: expected a number > 0"),
    (["hydra.launcher.start_method=vfork"], "Invalid value 'vfork', expected one of [fork, spawn]"),
    (
        ["image=nvcr.io/nvidia/pytorch:24.05-py3", "hydra.launcher.container_mounts=[/data]"],
        "Invalid hydra.launcher.container_mounts='/data': a bind mount SRC:DST[:OPTIONS] with DST an absolute path",
    ),
    (
        ["image=nvcr.io/nvidia/pytorch:24.05-py3", "hydra.launcher.container_runtime=lxc"],
        "Invalid value 'lxc', expected one of [podman, docker]",
    ),
    (["machine=h100_x_8", "num_nodes=2"], "Invalid machine='h100_x_8': 2 nodes x 8 GPUs need 16 GPUs on this host"),
    # one line, not Hydra's four-line merge error (the field was typed)
    (
        ["num_nodes=2:3", "hydra.launcher.restore_lost_nodes_after_s=abc"],
        "Invalid hydra.launcher.restore_lost_nodes_after_s='abc': expected a number > 0",
    ),
    (
        ["+roles.trainer.num_nodes=2:3", "+roles.scorer.num_nodes=1", "+roles.scorer.command=true"],
        "Invalid roles.trainer.num_nodes='2:3': a role's node count is fixed: a job with roles is not elastic",
    ),
]


def refusal(overrides: List[str], job_dir: Path) -> Exception:
    """What the launcher refuses one job with, in the order it checks: compose, the local backend's settings (its
    setup()), the job's plan, what the backend can run (a host without GPUs: CUDA_VISIBLE_DEVICES is empty)."""
    try:
        planned(["recipe=probe", *overrides], job_dir)
    except Exception as exc:  # noqa: BLE001 - what was raised is what the test looks at
        return exc
    pytest.fail(f"{overrides} was accepted")


@pytest.mark.parametrize("overrides, message", CASES, ids=[" ".join(c[0]) for c in CASES])
def test_refused_before_anything_starts(overrides, message, tmp_path, monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")  # this host's GPUs: none, wherever the tests run
    error = refusal(overrides, tmp_path / "0")
    if isinstance(error, ConfigCompositionException):
        # a typed launcher field (start_method): OmegaConf refuses the value while Hydra composes the config, and
        # Hydra prints both lines
        said = f"{error}\n{error.__cause__}"
    else:
        # a ConfigError is a CompactHydraException: Hydra prints its message alone, not a traceback
        assert isinstance(error, ConfigError), repr(error)
        said = str(error)
        assert "\n" not in said, f"not one line: {said!r}"
    assert message in said, said


def test_unknown_machine_lists_the_catalogue():
    with pytest.raises(MissingConfigException) as missing:
        compose_train("recipe=probe", "machine=a100_x_16")
    said = str(missing.value)
    assert "Could not find 'machine/a100_x_16'" in said
    for name in ("cpu", "cpu_small", "t4", "t4_x_4", "l4", "a10g", "a100", "a100_x_8", "h100", "h100_x_8", "h200_x_8"):
        assert f"\t{name}\n" in said
