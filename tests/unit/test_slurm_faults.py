"""SLURM when the cluster itself fails (issue 21), without a cluster: the job's own conclusion from the records its
processes left, the batch script, the planning checks. (The batch shell and the preemption handler under real
signals: tests/e2e/test_signal_safety.py.)"""

import signal
import time
from pathlib import Path

import pytest

from helpers.sbatch import render, sbatch_plan, slurm_settings
from mmt.backends.slurm import finalize
from mmt.backends.slurm.backend import SlurmBackend
from mmt.backends.slurm.conclusion import conclude
from mmt.backends.slurm.nodes import LostNode, lost_in_run, lost_node_detail, parse_sinfo_nodes
from mmt.core.jobdir import Attempt
from mmt.core.states import JobState
from mmt.planning.machine import Machine
from mmt.planning.plan import JobPlan
from mmt.records.restarts import ON_SIGNAL, requeues, with_requeues
from mmt.records.schema import ExitRecord, ResultRecord

CPU = Machine(name="cpu", accelerator="cpu", gpus=0, cpus=4)


def _plan(job_dir: Path, timeout_s: float = 600.0) -> JobPlan:
    return JobPlan(
        num=0,
        name="f-0",
        job_id="f",
        overrides=(),
        job_dir=str(job_dir),
        num_nodes=2,
        devices=2,
        machine=CPU,
        image=None,
        command=None,
        command_mode="per_node",
        env={},
        timeout_s=timeout_s,
    )


def _attempt(tmp_path: Path) -> Attempt:
    attempt = Attempt(tmp_path / ".mmt" / "attempts" / "a")
    attempt.dir.mkdir(parents=True)
    return attempt


# ---------------------------------------------------------------------------------------- 2: a SIGKILLed rank


@pytest.mark.parametrize("killed", [1, 2], ids=["node0", "node1"])
def test_a_sigkilled_rank_of_a_2x2_job_is_named_though_srun_then_terminates_the_other_node(tmp_path, killed):
    plan, attempt = _plan(tmp_path), _attempt(tmp_path)
    t0 = time.time()
    ExitRecord(code=-signal.SIGKILL, stopped=False, time=t0).write(attempt.exit_file(killed))
    sibling = killed ^ 1  # the same node's other rank: its agent stopped it
    ExitRecord(code=-signal.SIGTERM, stopped=True, time=t0 + 0.05).write(attempt.exit_file(sibling))
    other_node = 1 - plan.place(killed).node_rank
    # srun --kill-on-bad-exit then sends SIGTERM to the other node's agent, which records it and stops its ranks
    attempt.write_agent(other_node, {"host": "x", "pid": 1, "terminated_by": "SIGTERM", "terminated_at": t0 + 0.2})
    for index in plan.node_indices(other_node):
        ExitRecord(code=-signal.SIGTERM, stopped=True, time=t0 + 0.3).write(attempt.exit_file(index))
    for slurm_state in (None, "FAILED"):  # the allocation's own conclusion, the launcher's
        outcome = conclude(plan, attempt, scheduler_id="9", duration_s=3.0, slurm_state=slurm_state)
        assert outcome.status == JobState.FAILED, (slurm_state, outcome)
        assert (outcome.failure.rank, outcome.failure.node_rank, outcome.failure.signal) == (
            killed,
            plan.place(killed).node_rank,
            "SIGKILL",
        )


def test_a_sigkill_after_the_job_was_cancelled_is_still_not_a_failure(tmp_path):
    plan, attempt = _plan(tmp_path), _attempt(tmp_path)
    t0 = time.time()
    for node in (0, 1):
        attempt.write_agent(node, {"host": "x", "pid": 1, "terminated_by": "SIGTERM", "terminated_at": t0})
    ExitRecord(code=-signal.SIGKILL, stopped=True, time=t0 + 1).write(attempt.exit_file(0))
    outcome = conclude(plan, attempt, scheduler_id="9", duration_s=3.0, slurm_state="CANCELLED")
    assert outcome.status == JobState.INTERRUPTED and outcome.failure is None


# ---------------------------------------------------------------------------------------- 8: TIMEOUT names ranks


def test_a_slurm_timeout_names_the_ranks_that_had_not_finished(tmp_path):
    plan, attempt = _plan(tmp_path), _attempt(tmp_path)
    for index in (0, 2):
        attempt.done_file(index).write_text("0")
    outcome = conclude(plan, attempt, scheduler_id="9", duration_s=60.0, slurm_state="TIMEOUT")
    assert outcome.status == JobState.TIMEOUT
    assert "reached its time limit" in outcome.detail
    assert "still running at the limit: rank 1 (node 0), rank 3 (node 1)" in outcome.detail, outcome.detail


# ---------------------------------------------------------------------------------------- 1: SLURM's own requeue


def test_the_exit_trap_of_a_run_slurm_requeued_keeps_the_payload_and_concludes_nothing(tmp_path, monkeypatch):
    attempt = _attempt(tmp_path)
    attempt.plan.parent.mkdir(parents=True, exist_ok=True)
    attempt.plan.write_text("{}")
    monkeypatch.setenv("SLURM_JOB_ID", "77")
    monkeypatch.setenv("SLURM_RESTART_COUNT", "0")
    monkeypatch.setattr(finalize, "restart_count", lambda job_id: 1)  # scontrol: Restarts=1 (JobState=COMPLETING)
    monkeypatch.setattr(finalize, "conclude", lambda *a, **k: pytest.fail("a requeued run must conclude nothing"))
    monkeypatch.setattr(finalize, "requeue_why", lambda plan, attempt, job_id, run, nodelist: f"why {job_id} {run}")
    assert finalize.main([str(attempt.dir), "143", ""]) == 0
    assert attempt.plan.exists() and attempt.requeued_file(0).exists()
    assert not (tmp_path / "result.json").exists()
    [requeue] = requeues(attempt)
    assert (requeue.restart, requeue.why) == (0, "why 77 0") and requeue.at is not None


# sinfo -h -N -o '%N|%T|%E|%H' on the test cluster after `slurm_cluster.sh fail-node node2` (a node is listed once
# per partition); idle* is a node that stopped answering, not yet down
SINFO = """node1|allocated|none|Unknown
node2|down*|Not responding|2026-12-03T20:15:40
node2|down*|Not responding|2026-12-03T20:15:40
node3|idle*|Not responding|2026-12-03T20:15:52
node4|drained|maintenance|2026-12-03T19:00:00
node5|fail|Kill task failed|2026-12-03T20:16:00
"""


def test_sinfo_names_each_lost_node_once_down_failed_or_not_answering_and_not_a_drained_one():
    lost = parse_sinfo_nodes(SINFO)
    assert [node.name for node in lost] == ["node2", "node3", "node5"]
    assert lost[0].describe() == "node2 (not responding since 20:15:40)"
    assert LostNode("n9", "down", "none").describe() == "n9 (state down)"


def test_a_lost_node_fails_the_job_naming_it_its_place_and_ranks_not_the_ranks_that_died_of_it(tmp_path):
    plan, attempt = _plan(tmp_path), _attempt(tmp_path)
    t0 = time.time()
    attempt.write_agent(0, {"host": "node1", "pid": 1, "terminated_at": t0 + 20, "ended": t0 + 21, "code": 1})
    attempt.write_agent(1, {"host": "node2", "pid": 2})  # died with its node: it never ended
    for index in (0, 1):  # the surviving node's ranks: their collective broke, then SLURM's SIGTERM
        ExitRecord(code=1, stopped=False, time=t0 + 1).write(attempt.exit_file(index))
    lost = parse_sinfo_nodes(SINFO)
    outcome = conclude(
        plan, attempt, scheduler_id="9", duration_s=30.0, slurm_state="NODE_FAIL", lost=lost, hosts=["node1", "node2"]
    )
    assert outcome.status == JobState.FAILED and outcome.failure is None
    assert outcome.detail == (
        "SLURM job 9 lost node2 (not responding since 20:15:40): node 1 of the job, ranks 2-3; SLURM ended the job "
        "NODE_FAIL"
    )
    # node3 is down too, but not this run's; a node whose agent ended was not lost with this run
    assert [node.name for node in lost_in_run(plan, attempt, lost, ["node1", "node3"])] == []
    stopped = conclude(
        plan,
        attempt,
        scheduler_id="9",
        duration_s=1.0,
        slurm_state=None,
        stopped_because="Ctrl-C",
        lost=lost,
        hosts=["node1", "node2"],
    )
    assert stopped.status == JobState.INTERRUPTED  # the user's stop comes first


def test_a_lost_node_is_placed_by_the_runs_hosts_where_agents_no_longer_say():
    plan = _plan(Path("/nonexistent"))
    attempt = Attempt(Path("/nonexistent/a"))
    detail = lost_node_detail(plan, attempt, "9", [LostNode("node3", "down*", "Not responding")], ["node1", "node3"])
    assert detail == "SLURM job 9 lost node3 (not responding): node 1 of the job, ranks 2-3"


def test_requeues_are_read_in_order_an_empty_marker_being_mmts_own_and_reach_the_result(tmp_path):
    attempt = _attempt(tmp_path)
    attempt.requeued_file(1).write_text('{"why": "SLURM job 9 lost node2", "at": 5.0}')
    attempt.requeued_file(0).touch()  # the rank that took the requeue signal requeued the job itself
    found = requeues(attempt)
    assert [(one.restart, one.why) for one in found] == [(0, ON_SIGNAL), (1, "SLURM job 9 lost node2")]
    result = with_requeues(ResultRecord(status=JobState.COMPLETED), attempt)
    data = result.to_dict()
    assert data["requeues"][1] == {"restart": 1, "why": "SLURM job 9 lost node2", "at": 5.0}
    assert ResultRecord.from_dict(data).requeues == result.requeues
    assert "requeues" not in ResultRecord(status=JobState.COMPLETED).to_dict()


def test_max_requeues_0_asks_slurm_not_to_requeue_the_job():
    assert "#SBATCH --no-requeue\n" in render(sbatch_plan(), slurm_settings(max_requeues=0))
    script = render(sbatch_plan(), slurm_settings(max_requeues=2))
    assert "#SBATCH --requeue\n" in script and "no-requeue" not in script


# ---------------------------------------------------------------------------------------- 9: the batch shell


def test_a_signal_delay_longer_than_the_time_limit_is_refused_at_planning():
    backend = SlurmBackend(slurm_settings(signal_delay_s=90))
    [problem] = [p for p in backend.problems(sbatch_plan(timeout_s=60.0)) if "signal_delay_s" in str(p)]
    assert "\n" not in str(problem) and "time limit of 60 s" in str(problem)
    assert not [p for p in backend.problems(sbatch_plan(timeout_s=120.0)) if "signal_delay_s" in str(p)]


# ------------------------------------------------------------------------- 6: a launch that fails part-way


def test_why_the_launcher_cancelled_a_job_is_kept_for_whoever_concludes_it_later(tmp_path):
    from mmt.records.scheduler import SchedulerRecord, read_scheduler

    plan, attempt = _plan(tmp_path), _attempt(tmp_path)
    why = "the launch failed: job 1: sbatch refused it: Invalid generic resource (gres) specification"
    SchedulerRecord(scheduler_id="5", state="PENDING", stopped_because=why).write(attempt.scheduler)
    view = read_scheduler(attempt)
    assert view is not None and view.stopped_because == why
    assert "stopped_because" not in SchedulerRecord(scheduler_id="5").to_dict()  # the layout of older records
    outcome = conclude(
        plan, attempt, scheduler_id="5", duration_s=None, slurm_state="CANCELLED", stopped_because=view.stopped_because
    )
    assert outcome.status == JobState.INTERRUPTED and outcome.detail == f"stopped: {why}"
