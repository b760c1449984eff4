"""Bad input gets a clear error before anything starts: the key, the bad value, what is allowed, a hint."""

import os

import pytest

from conftest import job_dirs, run_app, tmpfs

CASES = [
    (["num_nodes=0"], "Invalid num_nodes=0: expected a whole number >= 1"),
    (["num_nodes=-1"], "Invalid num_nodes=-1: expected a whole number >= 1"),
    (["num_nodes=two"], "Invalid num_nodes='two': expected a whole number >= 1. HINT"),
    (["devices=0"], "Invalid devices=0: expected a whole number >= 1"),
    (["machine=a100_x_8", "devices=16"], "Invalid devices=16: machine 'a100_x_8' has 8 GPUs per node. HINT: use devices<=8"),
    (["command=''"], "Invalid command='': expected a non-empty shell command, or null to run the recipe. HINT"),
    (["command='   '"], "Invalid command='   ': expected a non-empty shell command"),
    (["+env.BAD-NAME=1"], "Invalid env.BAD-NAME=***: environment variable names are letters, digits and _"),
    (["+env.RANK=3"], "Invalid env.RANK=***: RANK belongs to the rank contract the launcher sets"),
    # names the launcher scrubs from every rank: set here, Lightning would take the job for a SLURM or torchrun one
    (["+env.SLURM_NTASKS=8"], "Invalid env.SLURM_NTASKS=***: SLURM_* variables are removed from every rank's "
                              "environment"),
    (["+env.TORCHELASTIC_RUN_ID=x"], "Invalid env.TORCHELASTIC_RUN_ID=***: TORCHELASTIC_* variables are removed"),
    (["+env.PL_TRAINER_NUM_NODES=4"], "Invalid env.PL_TRAINER_NUM_NODES=***: PL_TRAINER_NUM_NODES belongs to the "
                                      "rank contract"),
    (["+env.PL_TRAINER_STRATEGY=ddp_spawn"], "Invalid env.PL_TRAINER_STRATEGY=***: mmt starts every rank itself"),
    (["hydra.launcher.master_addr='bad host'"], "Invalid hydra.launcher.master_addr='bad host': expected an IP "
                                                "address or a host name"),
    (["command_mode=sometimes", "command='true'"], "Invalid command_mode='sometimes': expected one of per_node, per_rank"),
    (["hydra.launcher.timeout_min=0"], "Invalid hydra.launcher.timeout_min=0.0: expected a number > 0"),
    (["hydra.launcher.start_method=vfork"], "Invalid value 'vfork', expected one of [fork, spawn]"),
    (["image=nvcr.io/nvidia/pytorch:24.05-py3"], "Invalid image='nvcr.io/nvidia/pytorch:24.05-py3': cluster=local "
                                                 "runs every node in this host's Python environment"),
    (["machine=h100_x_8", "num_nodes=2"], "Invalid machine='h100_x_8': 2 nodes x 8 GPUs need 16 GPUs on this host"),
]


@pytest.mark.parametrize("overrides, message", CASES, ids=[" ".join(c[0]) for c in CASES])
def test_refused_before_anything_starts(overrides, message, tmp_path, tag):
    done = run_app("recipe=probe", *overrides, sweep_dir=tmp_path, tag=tag)
    assert done.returncode != 0
    assert message in done.stderr, done.stderr
    assert "Traceback" not in done.stderr, "a config error is a message, not a stack trace"
    assert job_dirs(tmp_path) == [], "no job may start"


def test_a_bad_job_in_a_sweep_stops_the_whole_sweep_before_any_job_starts(tmp_path, tag):
    done = run_app("recipe=probe", "num_nodes=1,0", sweep_dir=tmp_path, tag=tag)
    assert done.returncode != 0 and "Invalid num_nodes=0" in done.stderr
    assert job_dirs(tmp_path) == []


def test_unknown_machine_lists_the_catalogue(tmp_path, tag):
    done = run_app("recipe=probe", "machine=a100_x_16", sweep_dir=tmp_path, tag=tag)
    assert done.returncode != 0
    assert "Could not find 'machine/a100_x_16'" in done.stderr
    for name in ("cpu", "cpu_small", "t4", "t4_x_4", "l4", "a10g", "a100", "a100_x_8", "h100", "h100_x_8", "h200_x_8"):
        assert f"\t{name}\n" in done.stderr
    assert job_dirs(tmp_path) == []


@pytest.fixture
def read_only_dir(tmp_path):
    """A dir nobody may write: a read-only mount for root (whom permissions do not stop), mode 0555 otherwise."""
    path = tmp_path / "read-only"
    path.mkdir()
    if os.geteuid() != 0:
        path.chmod(0o555)
        yield path
        path.chmod(0o755)
        return
    with tmpfs(path, "ro,size=1m"):
        yield path


def test_a_sweep_dir_that_cannot_be_created_is_one_line(read_only_dir, tag):
    done = run_app("recipe=probe", sweep_dir=read_only_dir / "sweep", tag=tag)
    assert done.returncode != 0 and "Traceback" not in done.stderr, done.stderr
    assert (f"Invalid hydra.sweep.dir='{read_only_dir / 'sweep'}': the sweep dir cannot be created: {read_only_dir} "
            "is not writable. HINT: choose a writable hydra.sweep.dir") in done.stderr, done.stderr
