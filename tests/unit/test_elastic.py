"""Elastic jobs (num_nodes=MIN:MAX) without processes: the range and its refusals, each world's batch plan (the same
global batch), the variables every rank gets, the world records, and the local coordinator's decisions (which world
forms, when it runs, when the job fails) driven by the files its node agents would write."""

import os
import pickle
import time
from types import SimpleNamespace
from typing import List

import pytest

from helpers.plans import planned
from mmt.backends.base import capability_problems
from mmt.backends.local.backend import LocalBackend
from mmt.backends.ray.backend import RayBackend
from mmt.backends.slurm.backend import SlurmBackend
from mmt.core.errors import ConfigError
from mmt.core.jobdir import JobDir
from mmt.core.rank_env import RankInfo
from mmt.core.states import JobState
from mmt.planning.elastic import node_range
from mmt.planning.environment import Rendezvous
from mmt.planning.plan import JobPlan
from mmt.records.schema import ResultRecord
from mmt.records.world import (
    DONE,
    FORMING,
    RUNNING,
    World,
    WorldChange,
    mark_ended,
    mark_ready,
    read_changes,
    record_change,
)

ELASTIC = ["num_nodes=2:3", "devices=2", "batch.global_size=48"]


def test_a_range_is_min_colon_max_and_a_count_is_not_elastic():
    assert node_range("2:3") == (2, 3) and node_range(" 1 : 8 ") == (1, 8)
    assert node_range(2) is None and node_range("2") is None
    for bad, said in (
        ("3:2", "1 <= MIN < MAX"),
        ("0:2", "1 <= MIN < MAX"),
        ("2:2", "1 <= MIN < MAX"),
        ("a:b", "MIN:MAX"),
    ):
        with pytest.raises(ConfigError) as raised:
            node_range(bad)
        assert str(raised.value).startswith(f"Invalid num_nodes={bad!r}") and said in str(raised.value)


def test_each_world_has_its_own_split_of_the_same_global_batch(tmp_path):
    plan = planned(ELASTIC, tmp_path)
    assert plan.elastic is not None and plan.elastic.label == "2:3"
    assert (plan.num_nodes, plan.world_size, plan.generation) == (3, 6, 0)
    assert plan.batch is not None and (plan.batch.micro, plan.batch.accumulate) == (8, 1)
    smaller = plan.at_world(2, generation=1)
    assert (smaller.num_nodes, smaller.world_size, smaller.generation) == (2, 4, 1)
    assert smaller.batch is not None and (smaller.batch.global_size, smaller.batch.micro) == (48, 12)
    env = smaller.extra_env()
    assert env["MMT_WORLD_GENERATION"] == "1" and env["MMT_ELASTIC_NODES"] == "2:3"
    assert env["MMT_GLOBAL_BATCH_SIZE"] == "48" and env["MMT_MICRO_BATCH_SIZE"] == "12"
    info = RankInfo.from_env(env)
    assert info.world_generation == 1 and info.elastic_nodes == (2, 3)
    assert RankInfo.from_env({}).elastic_nodes is None  # a fixed job: not elastic
    assert planned(["num_nodes=2"], tmp_path).elastic is None


REFUSED = [
    (["num_nodes=2:3", "devices=2"], "Invalid batch.global_size=64: an elastic job (num_nodes=2:3, devices=2)"),
    (["num_nodes=2:3", "devices=2"], "HINT: use a multiple of 12, e.g. batch.global_size=60"),
    (["num_nodes=3:2"], "Invalid num_nodes='3:2'"),
    ([*ELASTIC, "+roles.trainer.num_nodes=1"], "Invalid num_nodes='2:3': a job with roles is not elastic"),
]


@pytest.mark.parametrize("overrides, said", REFUSED, ids=[" ".join(case[0]) + case[1][:20] for case in REFUSED])
def test_refused_in_one_line_before_anything_starts(overrides, said, tmp_path):
    with pytest.raises(ConfigError) as raised:
        planned(overrides, tmp_path)
    assert said in str(raised.value) and "\n" not in str(raised.value)
    assert not any(tmp_path.iterdir())


def test_a_backend_that_does_not_run_elastic_jobs_refuses_them_in_one_line(tmp_path):
    plan = planned(ELASTIC, tmp_path)
    plain = SimpleNamespace(name="other", runs_roles=False, runs_elastic=False)  # a third-party backend's class
    (refused,) = capability_problems(plain, plan)  # type: ignore[arg-type]
    assert str(refused).startswith("Invalid num_nodes='2:3': cluster=other does not run an elastic job yet")
    # mmt's own three all run them
    for backend in (LocalBackend, SlurmBackend, RayBackend):
        assert backend.runs_elastic and capability_problems(backend, plan) == []  # type: ignore[arg-type]


@pytest.mark.parametrize("setting", ["hydra.launcher.tasks=per_rank", "hydra.launcher.container_runtime=oci"])
def test_what_an_elastic_slurm_job_cannot_be_is_refused_in_one_line(setting, tmp_path):
    overrides = [*ELASTIC, setting, *(["image=alpine"] if "oci" in setting else [])]
    with pytest.raises(ConfigError) as raised:
        planned(overrides, tmp_path, "slurm")
    said = str(raised.value)
    assert said.startswith(f"Invalid {setting.split('=')[0]}=") and "an elastic job (num_nodes=2:3)" in said, said


def test_a_change_is_recorded_once_per_world_and_read_back_into_the_result(tmp_path):
    job_dir = JobDir(tmp_path)
    change = WorldChange(1, 100.0, (2,), (), 3, 2, 6, 4, "global 48 = 6 ranks", "global 48 = 4 ranks")
    record_change(job_dir, change)
    record_change(job_dir, WorldChange(**{**change.__dict__, "formed_at": 101.0, "training_at": 102.5}))
    (read,) = read_changes(job_dir)
    assert read.to_training_s == 2.5 and read.lost == (2,)
    assert read.describe() == "world 1: lost node 2: 3 -> 2 nodes, 6 -> 4 ranks; training again 2.5 s after"
    result = ResultRecord.from_dict(ResultRecord(status=JobState.COMPLETED, world_changes=(read,)).to_dict())
    assert result.world_changes == (read,)
    assert result.to_dict()["world_changes"][0]["to_training_s"] == 2.5


def coordinator_for(plan: JobPlan, restore_after_s=None):
    from mmt.agent.processes import ProcessSpec
    from mmt.backends.local.elastic import ElasticCoordinator

    ports = iter(range(40000, 40100))
    released: List[int] = []

    def rank_specs(world: JobPlan, meet: Rendezvous) -> List[ProcessSpec]:
        return [
            ProcessSpec(world.job_id, index, place.node_rank, "", {"MASTER_PORT": str(meet.master_port)}, "/", "log")
            for index, place in enumerate(world.places())
        ]

    coordinator = ElasticCoordinator(
        master_addr="127.0.0.1",
        kill_grace_s=1.0,
        start_method="fork",
        rank_specs=rank_specs,
        reserve_port=lambda: next(ports),
        release_port=released.append,
        restore_after_s=restore_after_s,
    )
    return coordinator, released


def test_the_coordinator_forms_a_smaller_world_once_the_survivors_stopped_their_ranks(tmp_path):
    plan = planned(ELASTIC, tmp_path / "job")
    attempt = JobDir(tmp_path / "job").attempt("a").create()
    coordinator, released = coordinator_for(plan)
    job, agents = coordinator.start(plan, attempt, 39999, "/")
    assert [agent.argv[-3:] for agent in agents][0][:2] == ("-m", "mmt.agent.elastic")
    assert World.read(attempt) == World(0, (0, 1, 2), RUNNING)
    assert coordinator.node_lost(job, 1) is None  # 2 nodes left of 2:3: the world forms again
    assert World.read(attempt) == World(1, (0, 2), FORMING)
    coordinator.tick(job)
    assert World.read(attempt).state == FORMING  # the survivors have not stopped their ranks yet
    mark_ended(attempt, 0, 0, -15)
    mark_ended(attempt, 2, 0, -15)
    coordinator.tick(job)
    assert World.read(attempt) == World(1, (0, 2), RUNNING) and released == [39999] and job.port == 40000
    # slot 2 is node 1 of the new world; its ranks meet on the new port, split for 4 ranks
    with open(attempt.elastic_node_run(2, 1), "rb") as handle:
        run = pickle.load(handle)
    assert run.node_rank == 1 and [spec.index for spec in run.processes] == [2, 3]
    assert run.processes[0].env["MASTER_PORT"] == "40000"
    assert job.plan.world_size == 4 and job.plan.generation == 1
    (change,) = read_changes(attempt.job_dir)
    assert (change.lost, change.world_before, change.world_after) == ((1,), 6, 4) and change.formed_at is not None
    # a second loss: below 2 nodes the job fails, naming every node lost
    failed = coordinator.node_lost(job, 2)
    assert failed == "lost node 1, 2 (its node agent died): 1 node(s) left, fewer than the 2 that num_nodes=2:3 needs"


def test_a_rank_failure_with_no_node_lost_fails_the_job_after_the_grace(tmp_path, monkeypatch):
    from mmt.backends import elastic

    plan = planned(ELASTIC, tmp_path / "job")
    attempt = JobDir(tmp_path / "job").attempt("a").create()
    coordinator, _ = coordinator_for(plan)
    job, _ = coordinator.start(plan, attempt, 39999, "/")
    mark_ended(attempt, 1, 0, 1)
    monkeypatch.setattr(elastic, "LOSS_GRACE_S", 0.2)
    assert coordinator.tick(job) is None  # a lost node may still be reported
    time.sleep(0.3)
    assert coordinator.tick(job) == "a rank failed on node 1 with no node lost"


def started(tmp_path, restore_after_s=None):
    """An elastic 2:3 x 2 job's coordinator, started: (coordinator, its job, the attempt, the node agents)."""
    plan = planned(ELASTIC, tmp_path / "job")
    attempt = JobDir(tmp_path / "job").attempt("a").create()
    coordinator, _ = coordinator_for(plan, restore_after_s=restore_after_s)
    job, agents = coordinator.start(plan, attempt, 39999, str(tmp_path))
    return coordinator, job, attempt, agents


def lose_node_2(coordinator, job, attempt) -> None:
    """Node 2 lost; the survivors stop their ranks; world 1 (nodes 0, 1) runs."""
    assert coordinator.node_lost(job, 2) is None
    for slot in (0, 1):
        mark_ended(attempt, slot, 0, -15)
    coordinator.tick(job)
    assert World.read(attempt) == World(1, (0, 1), RUNNING)


def checkpointed(attempt, at: float) -> None:
    attempt.checkpoint_mark.touch()
    os.utime(attempt.checkpoint_mark, (at, at))


def test_a_restored_node_joins_the_world_right_after_the_next_checkpoint(tmp_path):
    coordinator, job, attempt, first = started(tmp_path, restore_after_s=0.0)
    assert all("MMT_CHECKPOINT_MARK" not in agent.env for agent in first)  # (the ranks' env is in their run files)
    lose_node_2(coordinator, job, attempt)
    (spare,) = coordinator.restore_due(job)  # node 2's agent again, as a spare with no ranks
    assert spare.index == 2 and spare.argv[-1] == "--spare" and coordinator.restore_due(job) == []
    with open(attempt.node_run(2), "rb") as handle:
        assert pickle.load(handle).processes == ()
    coordinator.tick(job)
    assert World.read(attempt).generation == 1, "not ready: no change"
    mark_ready(attempt, 2)
    ready = attempt.world_ready(2).stat().st_mtime
    checkpointed(attempt, ready - 5)  # a checkpoint from before it was ready: it waits for the next one
    coordinator.tick(job)
    assert World.read(attempt).generation == 1
    checkpointed(attempt, ready + 1)
    coordinator.tick(job)
    assert World.read(attempt) == World(2, (0, 1, 2), FORMING)
    for slot in (0, 1):
        mark_ended(attempt, slot, 1, -15)
    coordinator.tick(job)
    assert World.read(attempt) == World(2, (0, 1, 2), RUNNING) and job.alive == {0, 1, 2} and not job.spares
    with open(attempt.elastic_node_run(2, 2), "rb") as handle:
        run = pickle.load(handle)
    assert run.node_rank == 2 and [spec.index for spec in run.processes] == [4, 5]
    assert run.processes[0].env["MMT_CHECKPOINT_MARK"] == str(attempt.checkpoint_mark)
    assert job.plan.world_size == 6 and job.plan.batch.describe().startswith("global 48 = 6 ranks x micro 8")
    lost, grown = read_changes(attempt.job_dir)
    assert (grown.generation, grown.lost, grown.joined) == (2, (), (2,))
    assert (grown.nodes_before, grown.nodes_after, grown.world_before, grown.world_after) == (2, 3, 4, 6)
    assert grown.describe().startswith("world 2: node 2 joined: 2 -> 3 nodes, 4 -> 6 ranks")


def test_a_ready_spare_joins_at_the_next_loss_and_one_that_dies_is_not_restored_again(tmp_path):
    coordinator, job, attempt, _ = started(tmp_path, restore_after_s=0.0)
    lose_node_2(coordinator, job, attempt)
    coordinator.restore_due(job)
    mark_ready(attempt, 2)
    # node 1 lost before any checkpoint: the world forms with node 0 and the ready spare, never below MIN
    assert coordinator.node_lost(job, 1) is None
    assert World.read(attempt) == World(2, (0, 2), FORMING)
    (_, change) = read_changes(attempt.job_dir)
    assert (change.lost, change.joined, change.world_after) == ((1,), (2,), 4)
    mark_ended(attempt, 0, 1, -15)
    coordinator.tick(job)
    assert World.read(attempt) == World(2, (0, 2), RUNNING)
    (spare,) = coordinator.restore_due(job)  # node 1 back as a spare; it dies before it joins
    assert spare.index == 1 and coordinator.node_lost(job, 1) is None
    assert World.read(attempt).generation == 2 and coordinator.restore_due(job) == [] and job.given_up == {1}


def test_without_restore_a_lost_node_stays_lost(tmp_path):
    coordinator, job, attempt, _ = started(tmp_path)
    lose_node_2(coordinator, job, attempt)
    assert coordinator.restore_due(job) == [] and not job.lost_at


def test_a_spare_still_waiting_when_training_ends_is_told_so_and_no_node_comes_back_after(tmp_path):
    coordinator, job, attempt, _ = started(tmp_path, restore_after_s=0.0)
    lose_node_2(coordinator, job, attempt)
    assert coordinator.restore_due(job)  # a spare, not ready yet
    coordinator.node_done(job, 0)
    assert World.read(attempt).state == RUNNING
    coordinator.node_done(job, 1)
    assert World.read(attempt) == World(1, (0, 1), DONE)  # the spare's agent exits 0 on it


def test_a_node_lost_as_training_ends_is_not_restored_after_it(tmp_path):
    coordinator, job, attempt, _ = started(tmp_path, restore_after_s=3600.0)
    lose_node_2(coordinator, job, attempt)
    coordinator.node_done(job, 0)
    coordinator.node_done(job, 1)
    coordinator.restore_after_s = 0.0
    assert coordinator.restore_due(job) == [] and World.read(attempt).state == DONE


def test_a_spare_agent_says_it_is_ready_and_exits_when_training_is_over(tmp_path):
    """The real agent (``python -m mmt.agent.elastic <run> --spare``), restored after training ended: it says it is
    ready, sees the world done, and exits 0 (a spare never blocks the job's end)."""
    import subprocess
    import sys

    coordinator, job, attempt, _ = started(tmp_path, restore_after_s=0.0)
    lose_node_2(coordinator, job, attempt)
    (spare,) = coordinator.restore_due(job)
    coordinator.node_done(job, 0)
    coordinator.node_done(job, 1)
    assert spare.argv is not None and spare.argv[1:3] == ("-u", "-m")
    done = subprocess.run([sys.executable, *spare.argv[1:]], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert attempt.world_ready(2).exists()
