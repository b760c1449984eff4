"""An elastic SLURM job as mmt writes it (no cluster): one sbatch of MIN to MAX nodes that a failed node does not
end, whose batch script runs the coordinator in place of every node's srun step; each node's own step; which node
states a lost node may come back from. The real runs are tests/e2e/test_slurm_elastic.py."""

import shlex
import sys

import pytest

from helpers.plans import planned
from helpers.sbatch import render, slurm_settings
from mmt.backends.slurm import backend as slurm_backend
from mmt.backends.slurm.elastic import answers, node_step

ELASTIC = ["num_nodes=2:3", "devices=2", "batch.global_size=48"]


@pytest.fixture
def elastic_plan(tmp_path, monkeypatch):
    # SLURM's commands as if on PATH: the unit tier runs before CI starts the test cluster
    monkeypatch.setattr(slurm_backend.shutil, "which", lambda name: f"/usr/bin/{name}")
    return lambda *more: planned([*ELASTIC, *more], tmp_path, "slurm")


def test_the_script_asks_for_min_to_max_nodes_and_runs_the_coordinator(elastic_plan):
    script = render(elastic_plan(), slurm_settings())
    lines = script.splitlines()
    # --nodes=2-3 alone gets 2 on slurm-wlm 22.05; 3 one-node tasks get 3 where they are free
    for line in ("#SBATCH --nodes=2-3", "#SBATCH --ntasks=3", "#SBATCH --overcommit", "#SBATCH --no-kill"):
        assert line in lines, script
    assert not [line for line in lines if line.startswith("#SBATCH --ntasks-per-node")]
    (command,) = [line for line in lines if "-m mmt.backends.slurm.elastic srun " in line]
    words = shlex.split(command)
    assert words[:4] == [sys.executable, "-u", "-m", "mmt.backends.slurm.elastic"] and words[4] == "srun"
    assert words[-4:-1] == ["-u", "-m", "mmt.backends.slurm.task"] and words[-1].endswith("task.pkl")
    assert not [line for line in lines if line.startswith("srun ")]  # no step over every node
    # a fixed job's script is as before
    fixed = render(elastic_plan("num_nodes=3"), slurm_settings())
    assert "#SBATCH --nodes=3" in fixed.splitlines() and "mmt.backends.slurm.elastic" not in fixed


def test_with_max_restarts_the_coordinator_runs_again_inside_the_allocation(elastic_plan):
    script = render(elastic_plan("hydra.launcher.max_restarts=2"), slurm_settings())
    (command,) = [line for line in script.splitlines() if "-m mmt.backends.slurm.elastic srun " in line]
    assert command.startswith("    ") and "while :; do" in script and "-m mmt.backends.slurm.restart" in script


def test_each_node_runs_the_jobs_srun_line_alone_as_an_elastic_node():
    srun = shlex.split(
        "srun --unbuffered --output /s/%j/%j_%t_log.out --error /s/%j/%j_%t_log.err --kill-on-bad-exit=1 "
        "--container-image=img /py -u -m mmt.backends.slurm.task /a/task.pkl"
    )
    first = node_step(srun, "node3", 2, spare=False)
    assert first[:5] == ["srun", "--nodes=1", "--ntasks=1", "--nodelist=node3", "--kill-on-bad-exit=0"]
    assert "--kill-on-bad-exit=1" not in first and "--overlap" not in first
    assert "/s/%j/%j_2_log.out" in first and "/s/%j/%j_2_log.err" in first  # by slot: %t is 0 in each step
    assert "--container-image=img" in first  # the job's own options stay
    assert first[-6:] == ["/py", "-u", "-m", "mmt.backends.slurm.elastic_node", "/a/task.pkl", "2"]
    spare = node_step(srun, "node3", 2, spare=True)
    assert "--overlap" in spare and spare[-2:] == ["2", "--spare"]


@pytest.mark.parametrize(
    "state, back",
    [
        ("IDLE", True),
        ("MIXED", True),
        ("ALLOCATED", True),
        ("ALLOCATED*", False),
        ("DOWN+NOT_RESPONDING", False),
        ("IDLE+DRAIN", False),
        ("MIXED+FAIL", False),
        ("", False),
    ],
)
def test_a_lost_node_comes_back_only_from_a_state_slurm_runs_steps_in(state, back):
    assert answers(state) is back
