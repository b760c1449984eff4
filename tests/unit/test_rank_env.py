"""The rank-env contract (DESIGN section 4): built by one module, read back by recipes."""

import os

import pytest

from helpers.plans import local_plan
from mmt.core.rank_env import RankInfo, RankPlace, scrubbed
from mmt.planning.environment import PythonEnvironment, Rendezvous, process_env
from mmt.planning.plan import JobPlan

RENDEZVOUS = Rendezvous(master_addr="127.0.0.1", master_port=40123)


def _plan(num_nodes: int, devices: int, env=None, command=None, command_mode="per_node") -> JobPlan:
    return local_plan(num_nodes=num_nodes, devices=devices, command=command, command_mode=command_mode, env=env or {})


def _env(place: RankPlace, base=None, job=None, cores=8, python=None):
    plan = _plan(place.num_nodes, place.local_world_size, env=job)
    return process_env(
        plan, place, rendezvous=RENDEZVOUS, inherited=base or {}, copied={}, cores_per_node=cores, python=python
    )


def test_two_by_two_ranks_and_node_ranks():
    places = [RankPlace(node_rank=n, local_rank=i, num_nodes=2, local_world_size=2) for n in range(2) for i in range(2)]
    envs = [_env(p) for p in places]
    assert [e["RANK"] for e in envs] == ["0", "1", "2", "3"]
    assert [e["NODE_RANK"] for e in envs] == ["0", "0", "1", "1"]
    assert [e["GROUP_RANK"] for e in envs] == ["0", "0", "1", "1"]
    assert [e["LOCAL_RANK"] for e in envs] == ["0", "1", "0", "1"]
    for env in envs:
        assert env["WORLD_SIZE"] == "4" and env["LOCAL_WORLD_SIZE"] == "2" and env["NUM_NODES"] == "2"
        assert env["MASTER_ADDR"] == "127.0.0.1" and env["MASTER_PORT"] == "40123"


def test_inherited_cluster_and_rank_variables_are_scrubbed():
    base = {
        "SLURM_NTASKS": "8",
        "SLURM_PROCID": "3",
        "TORCHELASTIC_RUN_ID": "x",
        "LT_DEVICES": "8",
        "PL_TRAINER_NUM_NODES": "4",
        "RANK": "7",
        "WORLD_SIZE": "16",
        "MASTER_PORT": "29500",
        "HOME": "/root",
        "PATH": "/usr/bin",
        "LSB_JOBID": "1",
        "GROUP_WORLD_SIZE": "3",
    }
    env = _env(RankPlace(0, 1, 1, 2), base=base)
    for gone in (
        "SLURM_NTASKS",
        "SLURM_PROCID",
        "TORCHELASTIC_RUN_ID",
        "LT_DEVICES",
        "PL_TRAINER_NUM_NODES",
        "LSB_JOBID",
        "GROUP_WORLD_SIZE",
    ):
        assert gone not in env
    assert env["HOME"] == "/root" and env["PATH"] == "/usr/bin"
    assert env["RANK"] == "1" and env["WORLD_SIZE"] == "2" and env["MASTER_PORT"] == "40123"
    assert scrubbed({"SLURM_X": "1", "KEEP": "2"}) == {"KEEP": "2"}


def test_omp_threads_split_among_the_ranks_of_a_node_unless_the_user_set_it():
    assert _env(RankPlace(0, 0, 1, 4), cores=8)["OMP_NUM_THREADS"] == "2"
    assert _env(RankPlace(0, 0, 1, 16), cores=8)["OMP_NUM_THREADS"] == "1"
    assert _env(RankPlace(0, 0, 1, 4), base={"OMP_NUM_THREADS": "3"})["OMP_NUM_THREADS"] == "3"
    assert _env(RankPlace(0, 0, 1, 4), job={"OMP_NUM_THREADS": "5"})["OMP_NUM_THREADS"] == "5"


def test_user_env_cannot_override_the_contract():
    env = _env(RankPlace(1, 0, 2, 1), job={"RANK": "9", "MY_FLAG": "1"})
    assert env["RANK"] == "1" and env["MY_FLAG"] == "1"


def test_node_env_tells_lightning_the_topology_without_per_rank_variables():
    plan = _plan(2, 4, command="python train.py")
    env = process_env(
        plan,
        plan.place(1),
        rendezvous=RENDEZVOUS,
        inherited={"LOCAL_RANK": "3"},
        copied={},
        cores_per_node=8,
        python=None,
    )
    assert "LOCAL_RANK" not in env and "RANK" not in env
    assert env["NODE_RANK"] == "1" and env["WORLD_SIZE"] == "8" and env["LOCAL_WORLD_SIZE"] == "4"
    assert env["PL_TRAINER_NUM_NODES"] == "2" and env["PL_TRAINER_DEVICES"] == "4"
    assert env["LT_NUM_NODES"] == "2" and env["LT_DEVICES"] == "4"


def test_rank_info_reads_back_what_rank_env_wrote():
    info = RankInfo.from_env(_env(RankPlace(1, 1, 2, 2)))
    assert (info.rank, info.local_rank, info.node_rank, info.world_size, info.local_world_size, info.num_nodes) == (
        3,
        1,
        1,
        4,
        2,
        2,
    )
    assert not info.is_main and info.master_port == 40123 and info.job_dir == "/tmp/job"
    single = RankInfo.from_env({})
    assert (single.rank, single.world_size, single.num_nodes, single.is_main) == (0, 1, 1, True)


def test_world_size_mismatch_is_refused_with_a_hint():
    info = RankInfo.from_env(_env(RankPlace(0, 0, 2, 2)))
    info.check_world_size(4)
    with pytest.raises(RuntimeError, match=r"world_size=2 .*WORLD_SIZE=4.*HINT: pass num_nodes=2 and devices=2"):
        info.check_world_size(2)


def test_slurm_threads_never_count_more_cores_than_the_host_has():
    # a SLURM node may declare more CPUs than its host has (the test cluster's nodes do): OMP_NUM_THREADS is
    # split from the smaller number, or OpenMP threads spin against each other (measured 6.5x slower)
    from mmt.backends.slurm.task import node_cores

    host = os.cpu_count()
    assert node_cores(str(host * 2)) == host
    assert node_cores("1") == 1
    assert node_cores(None) == host


def test_the_launchers_python_comes_first_on_path_and_in_a_venv_is_the_venv():
    venv = PythonEnvironment(
        executable="/home/ada/project/.venv/bin/python", prefix="/home/ada/project/.venv", in_venv=True
    )
    env = _env(RankPlace(0, 0, 1, 1), base={"PATH": "/usr/bin:/home/ada/project/.venv/bin"}, python=venv)
    assert env["PATH"] == "/home/ada/project/.venv/bin:/usr/bin"
    assert env["VIRTUAL_ENV"] == "/home/ada/project/.venv"
    system = PythonEnvironment(executable="/usr/bin/python3", prefix="/usr", in_venv=False)
    env = _env(RankPlace(0, 0, 1, 1), base={"PATH": "/bin", "VIRTUAL_ENV": "/stale"}, python=system)
    assert env["PATH"] == "/usr/bin:/bin" and "VIRTUAL_ENV" not in env


@pytest.mark.parametrize(
    "world_size, rank, fails",
    [(4, 1, False), (None, None, False), (-1, -1, False), (2, 1, True), (4, 3, True), (8, None, True)],
)
def test_a_process_group_of_another_world_or_rank_than_the_plans_fails_at_once(world_size, rank, fails, monkeypatch):
    from mmt.worker.guards import TopologyMismatchError, check_topology

    monkeypatch.setenv("WORLD_SIZE", "4")
    monkeypatch.setenv("RANK", "1")
    if not fails:
        check_topology(_plan(2, 2), world_size, rank)
        return
    with pytest.raises(TopologyMismatchError) as error:
        check_topology(_plan(2, 2), world_size, rank)
    message = str(error.value)
    assert f"init_process_group(world_size={world_size}, rank={rank})" in message
    assert "started as rank 1 of WORLD_SIZE=4 (2 nodes x 2 devices)" in message
    assert "HINT: wire the framework's topology to mmt's" in message and "trainer.num_nodes=${num_nodes}" in message
