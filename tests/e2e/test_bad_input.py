"""Bad input on the console of a real launch: ``python train.py -m ...`` prints the one-line refusal, no traceback, and
starts nothing. (Every refusal's message, checked without a process: tests/unit/test_bad_input.py.)"""

import os

import pytest

from helpers.app import job_dirs, run_app
from helpers.mounts import tmpfs


def test_a_refusal_reaches_the_console_as_one_line_and_nothing_starts(tmp_path, tag):
    # refused by the backend after the job was planned (this host has no GPU)
    done = run_app("recipe=probe", "machine=h100_x_8", "num_nodes=2", sweep_dir=tmp_path, tag=tag)
    assert done.returncode != 0
    assert "Invalid machine='h100_x_8': 2 nodes x 8 GPUs need 16 GPUs on this host" in done.stderr, done.stderr
    assert "Traceback" not in done.stderr, "a config error is a message, not a stack trace"
    assert job_dirs(tmp_path) == [], "no job may start"


def test_a_bad_job_in_a_sweep_stops_the_whole_sweep_before_any_job_starts(tmp_path, tag):
    done = run_app("recipe=probe", "num_nodes=1,0", sweep_dir=tmp_path, tag=tag)
    assert done.returncode != 0 and "Invalid num_nodes=0" in done.stderr
    assert "Traceback" not in done.stderr, "a config error is a message, not a stack trace"
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
    assert (
        f"Invalid hydra.sweep.dir='{read_only_dir / 'sweep'}': the sweep dir cannot be created: {read_only_dir} "
        "is not writable. HINT: choose a writable hydra.sweep.dir"
    ) in done.stderr, done.stderr
