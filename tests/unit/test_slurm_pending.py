"""SLURM jobs that wait in the queue: the pending reason read from squeue, the reasons that never resolve by waiting
(the job is cancelled and FAILED with one line: what it asks, what its partition offers), the reason shown while a
job waits (the launcher's notices, the attempt's scheduler.json that `mmt list` and the live page read), and a
scheduler that stops answering, said so instead of a state that never changes. SLURM's answers here are the test
cluster's own, recorded (slurm 22.05: scripts/slurm_cluster.sh). On the real cluster: tests/e2e/test_slurm_pending.py.
"""

import pickle
import time
from dataclasses import replace
from pathlib import Path
from typing import Dict, List, Optional

import pytest

from helpers.sbatch import slurm_settings
from mmt.backends.base import Submission
from mmt.backends.slurm import pending, queue, records
from mmt.backends.slurm.backend import SlurmBackend, SlurmJob, SubmissionRefused, _refusal
from mmt.core.jobdir import Attempt, JobDir
from mmt.core.states import JobState
from mmt.planning.machine import Machine
from mmt.planning.plan import JobPlan
from mmt.records.registry import JobRecord, Registry
from mmt.records.scheduler import SchedulerRecord, clock, read_scheduler

# `squeue -h -t all -O JobID:|,State:|,RestartCnt:|,Reason:|` on the test cluster: jobs that can never start, jobs
# that wait for a reason that resolves (a long one with spaces and a comma among them), a running one, ended ones
SQUEUE = """\
24|PENDING|0|PartitionConfig|
27|PENDING|0|PartitionNodeLimit|
26|PENDING|0|BeginTime|
22|PENDING|0|ReqNodeNotAvail, UnavailableNodes:node1|
23|PENDING|0|Nodes required for job are DOWN, DRAINED or reserved for jobs in higher priority partitions|
17|RUNNING|2|None|
12|CANCELLED|0|PartitionConfig|
3|COMPLETED|0|None|
"""
# `scontrol show job -o 24`: mmt's num_nodes=3 on the cluster's two nodes of 4 CPUs (machine=cpu: 4 CPUs a task)
SCONTROL_JOB = (
    "JobId=24 JobName=mmt-never-0 UserId=root(0) GroupId=root(0) MCS_label=N/A Priority=4294901741 Nice=0 "
    "Account=(null) QOS=(null) JobState=PENDING Reason=PartitionConfig Dependency=(null) Requeue=1 Restarts=0 "
    "BatchFlag=1 Reboot=0 ExitCode=0:0 RunTime=00:00:00 TimeLimit=01:00:00 TimeMin=N/A "
    "SubmitTime=2026-12-03T14:57:09 Partition=debug AllocNode:Sid=localhost:2491 ReqNodeList=(null) "
    "ExcNodeList=(null) NodeList= NumNodes=3-3 NumCPUs=12 NumTasks=3 CPUs/Task=4 ReqB:S:C:T=0:0:*:* "
    "TRES=cpu=12,node=3,billing=12 Socks/Node=* NtasksPerN:B:S:C=1:0:*:* CoreSpec=* MinCPUsNode=4 MinMemoryNode=0 "
    "MinTmpDiskNode=0 Features=(null) DelayBoot=00:00:00 OverSubscribe=OK Contiguous=0 Licenses=(null) "
    "Network=(null) Command=/tmp/sweep/.submitit/submission.sh WorkDir=/work/main Power="
)
SCONTROL_PARTITION = (
    "PartitionName=debug AllowGroups=ALL AllowAccounts=ALL AllowQos=ALL AllocNodes=ALL Default=YES QoS=N/A "
    "DefaultTime=NONE DisableRootJobs=NO ExclusiveUser=NO GraceTime=0 Hidden=NO MaxNodes=UNLIMITED "
    "MaxTime=UNLIMITED MinNodes=0 LLN=NO MaxCPUsPerNode=UNLIMITED Nodes=node[1-2] PriorityJobFactor=1 "
    "PriorityTier=1 RootOnly=NO ReqResv=NO OverSubscribe=NO OverTimeLimit=NONE PreemptMode=OFF State=UP "
    "TotalCPUs=8 TotalNodes=2 SelectTypeParameters=NONE JobDefaults=(null) DefMemPerNode=UNLIMITED "
    "MaxMemPerNode=UNLIMITED TRES=cpu=8,mem=48210M,node=2,billing=8"
)
SINFO = "2|4|24105|(null)\n"


def _facts(job: Optional[str] = SCONTROL_JOB, partition: Optional[str] = SCONTROL_PARTITION) -> pending.Facts:
    return pending.Facts(
        job=queue.parse_fields(job) if job else None,
        partition=queue.parse_fields(partition) if partition else None,
        kinds=queue.parse_sinfo(SINFO),
    )


# ------------------------------------------------------------------------------------------ the queue's reasons


def test_squeue_gives_the_reason_of_a_pending_job_whole_and_none_for_others():
    states = queue.parse_squeue(SQUEUE)
    assert states["24"].reason == "PartitionConfig" and states["27"].reason == "PartitionNodeLimit"
    assert states["26"] == queue.SlurmState("PENDING", None, 0, "BeginTime")
    assert states["22"].reason == "ReqNodeNotAvail, UnavailableNodes:node1"  # spaces, a comma: the whole reason
    assert states["23"].reason.startswith("Nodes required for job are DOWN, DRAINED")
    # a running job says "None"; an ended one keeps the reason it waited for: neither waits now
    assert states["17"] == queue.SlurmState("RUNNING", None, 2, None)
    assert states["12"].reason is None and states["3"].reason is None


def _answers(monkeypatch, answers: Dict[str, Optional[str]]) -> List[List[str]]:
    """queue.ask answering each command (by its name) with its text, or failing (None); the calls made."""
    calls: List[List[str]] = []

    def run(args, env=None, timeout_s=30):
        calls.append(list(args))
        return answers.get(args[0])

    monkeypatch.setattr(queue, "ask", run)
    return calls


def test_a_query_says_which_daemon_did_not_answer(monkeypatch):
    _answers(monkeypatch, {"squeue": None, "sacct": None})
    answer = queue.query(["24"])
    assert answer.states == {} and answer.unanswered == "slurmctld"
    _answers(monkeypatch, {"squeue": "", "sacct": None})  # the queue answered without the job; accounting did not
    assert queue.query(["24"]) == queue.Answer({}, "slurmdbd")
    calls = _answers(monkeypatch, {"squeue": SQUEUE})
    answer = queue.query(["24", "26"])
    assert answer.unanswered is None and answer.states["26"].reason == "BeginTime"
    assert calls[0][-2:] == ["-O", queue.SQUEUE_FORMAT]


def test_scontrols_one_line_reads_with_values_that_hold_spaces():
    job = queue.parse_fields(SCONTROL_JOB)
    assert (job["NumNodes"], job["NumCPUs"], job["CPUs/Task"], job["Partition"]) == ("3-3", "12", "4", "debug")
    assert job["AllocNode:Sid"] == "localhost:2491" and job["Power"] == ""
    spaced = queue.parse_fields("JobId=22 Reason=ReqNodeNotAvail, UnavailableNodes:node1 Dependency=(null)")
    assert spaced["Reason"] == "ReqNodeNotAvail, UnavailableNodes:node1" and spaced["Dependency"] == "(null)"
    assert queue.parse_sinfo("2|4|24105|(null)\n1|8|64000|gpu:2\n1|4|24105|(null)\n") == [
        queue.NodeKind(3, "4", "24105"),
        queue.NodeKind(1, "8", "64000", "gpu:2"),
    ]


# --------------------------------------------------------------------------- which reasons never resolve by waiting


@pytest.mark.parametrize(
    "reason",
    [
        "PartitionConfig",
        "PartitionNodeLimit",
        "PartitionTimeLimit",
        "BadConstraints",
        "InvalidAccount",
        "InvalidQOS",
        "AccountNotAllowed",
        "QOSNotAllowed",
        "DependencyNeverSatisfied",
        "ReservationDeleted",
        "MaxMemPerLimit",
        "QOSMaxNodePerJobLimit",
        "QOSMaxCpuPerJobLimit",
        "QOSMaxWallDurationPerJobLimit",
        "AssocMaxCpuPerJobLimit",
        "AssocMaxWallDurationPerJobLimit",
        "QOSMaxMemoryPerNode",
        "AssocMaxGRESPerJob",
        "QOSMinCpuNotSatisfied",
        "QOSMinGRES",
    ],
)
def test_reasons_that_never_resolve(reason):
    assert pending.never_resolves(reason)
    assert pending.explain(reason)


@pytest.mark.parametrize(
    "reason",
    [
        "Resources",
        "Priority",
        "Dependency",
        "BeginTime",
        "JobHeldUser",
        "JobHeldAdmin",
        "ReqNodeNotAvail",
        "ReqNodeNotAvail, UnavailableNodes:node1",
        "NodeDown",
        "PartitionDown",
        "PartitionInactive",
        "Reservation",
        "Licenses",
        "AssocMaxJobsLimit",
        "AssociationJobLimit",
        "QOSJobLimit",
        "QOSGrpCpuLimit",
        "AssocGrpNodeLimit",
        "QOSMaxJobsPerUserLimit",
        "QOSMaxCpuPerUserLimit",
        "MaxCpuPerAccount",
        "QOSMaxSubmitJobPerUserLimit",
        "Nodes required for job are DOWN, DRAINED or reserved for jobs in higher priority partitions",
        "Prolog",
        "",
        "SomethingNew",
    ],
)
def test_reasons_that_resolve_by_waiting(reason):
    assert not pending.never_resolves(reason)
    assert pending.verdict("24", reason, _facts()) is None


def test_the_message_names_what_the_job_asks_and_what_the_partition_offers_on_one_line(monkeypatch):
    monkeypatch.setattr(queue, "partition_names", lambda: None)  # sinfo does not answer
    message = pending.verdict("24", "PartitionConfig", _facts())
    assert message is not None and "\n" not in message
    assert message.startswith("SLURM job 24 can never start, so mmt cancelled it: PartitionConfig (")
    assert "it asks 3 nodes, 12 CPUs (3 tasks x 4 CPUs), time limit 01:00:00" in message
    assert "partition debug offers 2 nodes (node[1-2]) of 4 CPUs and 24105 MB, 8 CPUs in all, no time limit" in message
    assert "HINT: " in message
    # what could not be read is said so, never guessed
    assert "its settings could not be read" in pending.verdict("24", "PartitionConfig", _facts(partition=None))


def test_a_partition_the_cluster_does_not_have_is_named_with_the_key_and_the_ones_it_has(monkeypatch):
    monkeypatch.setattr(queue, "ask", lambda args, env=None, timeout_s=30: "gpu\ndebug*\ngpu\n")
    assert queue.partition_names() == ["debug", "gpu"]  # the default first, each once
    assert pending.offers("nope", None, None) == (
        "no partition nope on this cluster (hydra.launcher.partition=nope; it has: debug, gpu)"
    )


def test_partition_node_limit_is_never_only_when_the_partition_is_too_small():
    assert "it asks 3 nodes" in pending.verdict("27", "PartitionNodeLimit", _facts())
    # two nodes of a two-node partition: what SLURM also says while a node is down or drained (it may come back)
    fits = _facts(job=SCONTROL_JOB.replace("NumNodes=3-3", "NumNodes=2-2"))
    assert pending.verdict("27", "PartitionNodeLimit", fits) is None
    # a per-job maximum of the partition
    capped = _facts(
        job=SCONTROL_JOB.replace("NumNodes=3-3", "NumNodes=2-2"),
        partition=SCONTROL_PARTITION.replace("MaxNodes=UNLIMITED", "MaxNodes=1"),
    )
    assert "at most 1 nodes per job" in pending.verdict("27", "PartitionNodeLimit", capped)


def test_check_asks_slurm_only_for_a_reason_that_never_resolves(monkeypatch):
    calls = _answers(monkeypatch, {"scontrol": None, "sinfo": None})
    assert pending.check("26", "BeginTime") is None and calls == []
    calls = _answers(monkeypatch, {})
    monkeypatch.setattr(
        queue,
        "ask",
        lambda args, env=None: (
            calls.append(args)
            or {
                ("scontrol", "job"): SCONTROL_JOB,
                ("scontrol", "partition"): SCONTROL_PARTITION,
                ("sinfo", "-h"): SINFO,
            }.get((args[0], args[2] if args[0] == "scontrol" else args[1]))
        ),
    )
    message = pending.check("24", "PartitionConfig")
    assert message is not None and "partition debug offers 2 nodes" in message
    assert [c[0] for c in calls] == ["scontrol", "scontrol", "sinfo"]


# ------------------------------------------------------------------------------------------ scheduler.json


def test_the_scheduler_record_round_trips_and_says_what_the_state_does_not():
    seen = SchedulerRecord(scheduler_id="26").seen("PENDING", "BeginTime", "its start time has not come yet", now=10.0)
    assert SchedulerRecord.from_dict(seen.to_dict()) == seen
    assert seen.note() == "BeginTime" and "waits in the queue since" in seen.describe()
    assert seen.seen("PENDING", "BeginTime", "x", now=20.0).since == 10.0  # the same reason: since kept
    assert seen.seen("PENDING", "Priority", None, now=20.0).since == 20.0
    lost = seen.unanswered("slurmctld", now=time.time() - 60)
    assert lost.unanswered("slurmctld").unreachable_since == lost.unreachable_since  # the first time kept
    assert lost.note() == f"slurmctld not answering since {clock(lost.unreachable_since)}"
    assert lost.note(final=True) is None
    assert lost.seen("PENDING", "BeginTime", "x").unreachable_since is None  # it answers again
    never = SchedulerRecord(
        scheduler_id="24",
        state="PENDING",
        reason="PartitionConfig",
        never_starts=True,
        message="SLURM job 24 can never start ...",
    )
    assert never.note(final=True) == "can never start: PartitionConfig" and never.describe() == never.message


# ------------------------------------------------------------------------------------- the launcher's watcher


def _plan(tmp_path: Path, num_nodes: int = 3) -> JobPlan:
    return JobPlan(
        num=0,
        name="never-0",
        job_id="1203-150305-abcd-0",
        overrides=(f"num_nodes={num_nodes}",),
        job_dir=str(tmp_path / "0"),
        num_nodes=num_nodes,
        devices=1,
        machine=Machine(name="cpu", accelerator="cpu", gpus=0, cpus=4, memory_gb=16, price_per_hour=0.0),
        image=None,
        command=None,
        command_mode="per_node",
        env={},
        timeout_s=3600.0,
    )


def _attempt(tmp_path: Path, plan: JobPlan) -> Attempt:
    attempt = JobDir(Path(plan.job_dir)).attempt("20261203T150305-abcdef").create()
    attempt.plan.write_bytes(pickle.dumps(plan))
    return attempt


class FakeSlurm:
    """SLURM as queue's functions see it: squeue's answer (None: slurmctld does not answer), the facts, cancels."""

    def __init__(self, monkeypatch, squeue: Optional[str]):
        self.squeue, self.cancelled = squeue, []
        monkeypatch.setattr(queue, "query", self.query)
        monkeypatch.setattr(queue, "accounting_available", lambda: True)
        monkeypatch.setattr(queue, "cancel", lambda ids, signal_name=None: self.cancelled.extend(ids))
        monkeypatch.setattr(queue, "job_facts", lambda job_id: queue.parse_fields(SCONTROL_JOB))
        monkeypatch.setattr(queue, "partition_facts", lambda name: queue.parse_fields(SCONTROL_PARTITION))
        monkeypatch.setattr(queue, "node_kinds", lambda name: queue.parse_sinfo(SINFO))

    def query(self, ids, accounting=True):
        if self.squeue is None:
            return queue.Answer({}, "slurmctld")
        states = queue.parse_squeue(self.squeue)
        return queue.Answer({i: s for i, s in states.items() if i in ids}, None)


def _watched(tmp_path: Path, job_id: str, num_nodes: int = 3):
    backend = SlurmBackend(slurm_settings())
    plan = _plan(tmp_path, num_nodes)
    job = SlurmJob(
        submission=Submission(plan=plan, attempt=_attempt(tmp_path, plan)),
        job_id=job_id,
        stderr=Path("/nonexistent"),
        submitted=time.monotonic(),
    )
    backend._watched.append(job)
    return backend, job


def test_the_launcher_cancels_a_job_that_can_never_start_and_fails_it_with_the_line(tmp_path, monkeypatch):
    slurm = FakeSlurm(monkeypatch, "24|PENDING|0|PartitionConfig|\n")
    backend, job = _watched(tmp_path, "24")
    backend.wait(0)
    snapshot = backend.poll(job)
    assert slurm.cancelled == ["24"]
    assert snapshot.outcome is not None and snapshot.outcome.status == JobState.FAILED
    assert snapshot.outcome.detail.startswith("SLURM job 24 can never start, so mmt cancelled it: PartitionConfig")
    view = read_scheduler(job.attempt)
    assert view.never_starts and view.message == snapshot.outcome.detail and view.reason == "PartitionConfig"


def test_the_launcher_shows_a_reason_that_resolves_once_and_waits(tmp_path, monkeypatch):
    slurm = FakeSlurm(monkeypatch, "26|PENDING|0|BeginTime|\n")
    backend, job = _watched(tmp_path, "26", num_nodes=1)
    for _ in range(3):
        backend.wait(0)
        assert backend.poll(job).state == JobState.PENDING
    waits = [n for n in backend.drain_notices() if "waits in SLURM's queue" in n]
    assert waits == [
        "mmt: job 0 (never-0) waits in SLURM's queue (job 26): BeginTime (its start time has not come yet)"
    ]
    assert slurm.cancelled == [] and read_scheduler(job.attempt).reason == "BeginTime"
    slurm.squeue = "26|RUNNING|0|None|\n"
    backend._next_query = 0.0  # the next poll asks the queue again
    backend.wait(0)
    assert backend.poll(job).state == JobState.RUNNING
    assert read_scheduler(job.attempt).state == "RUNNING" and read_scheduler(job.attempt).reason is None


def test_the_launcher_says_when_slurmctld_stops_answering_and_when_it_answers_again(tmp_path, monkeypatch):
    slurm = FakeSlurm(monkeypatch, None)
    backend, job = _watched(tmp_path, "26", num_nodes=1)
    backend.wait(0)
    backend.poll(job)
    [notice] = backend.drain_notices()
    assert notice.startswith("mmt: slurmctld is not answering (squeue failed) since ")
    assert read_scheduler(job.attempt).note().startswith("slurmctld not answering since ")
    backend._next_query = 0.0
    backend.wait(0)
    assert backend.drain_notices() == []  # said once
    slurm.squeue = "26|PENDING|0|Priority|\n"
    backend._next_query = 0.0
    backend.wait(0)
    backend.poll(job)
    assert any(n.startswith("mmt: slurmctld answers again") for n in backend.drain_notices())
    assert read_scheduler(job.attempt).unreachable_since is None


def test_sbatchs_refusal_is_one_line_naming_the_request_and_the_partition(tmp_path, monkeypatch):
    from submitit.core.utils import FailedJobError

    FakeSlurm(monkeypatch, "")
    monkeypatch.setattr(queue, "default_partition", lambda: "debug")
    big = Machine(name="cpu_x_8", accelerator="cpu", gpus=0, cpus=8, memory_gb=32, price_per_hour=0.0)
    plan = replace(_plan(tmp_path, num_nodes=1), machine=big)
    refusal = _refusal(
        FailedJobError(
            "sbatch: error: CPU count per node can not be satisfied\nsbatch: error: Batch "
            "job submission failed: Requested node configuration is not available"
        ),
        plan,
        slurm_settings(),
    )
    assert isinstance(refusal, SubmissionRefused) and "\n" not in str(refusal)
    assert "sbatch refused it: CPU count per node can not be satisfied; Batch job submission failed" in str(refusal)
    assert "it asks 1 node(s) x 1 task(s) x 8 CPUs (machine cpu_x_8)" in str(refusal)
    assert "partition debug offers 2 nodes (node[1-2]) of 4 CPUs and 24105 MB" in str(refusal)
    assert _refusal(OSError("not sbatch's"), plan, slurm_settings()) is None


# --------------------------------------------------------------------------- a refresh from any process (mmt list)


def _registered(tmp_path: Path, monkeypatch, job_id: str, state: str = "PENDING", num_nodes: int = 3):
    monkeypatch.setenv("MMT_HOME", str(tmp_path / "home"))
    registry = Registry()
    plan = _plan(tmp_path, num_nodes)
    attempt = _attempt(tmp_path, plan)
    record = JobRecord(
        name=plan.name,
        job_id=plan.job_id,
        backend="slurm",
        job_dir=plan.job_dir,
        sweep_dir=str(tmp_path),
        attempt=attempt.id,
        num_nodes=num_nodes,
        devices=1,
        machine="cpu",
        command=None,
        command_mode="per_node",
        overrides=list(plan.overrides),
        state=state,
        scheduler_id=job_id,
        created_at=time.time(),
    )
    registry.add([record])
    return registry, record, attempt


def test_mmt_list_cancels_a_job_that_can_never_start_and_shows_it_failed_with_the_reason(tmp_path, monkeypatch):
    from mmt.cli.main import _rows

    slurm = FakeSlurm(monkeypatch, "24|PENDING|0|PartitionConfig|\n")
    registry, record, attempt = _registered(tmp_path, monkeypatch, "24")
    record = records.refresh(record, registry)
    assert slurm.cancelled == ["24"] and record.state == "FAILED"
    result = registry.get(record.name).result_record()
    assert "SLURM job 24 can never start, so mmt cancelled it: PartitionConfig" in result.error
    [row] = _rows([record])
    assert (row["status"], row["reason"], row["note"]) == (
        "Failed",
        "PartitionConfig",
        "can never start: PartitionConfig",
    )


def test_a_job_cancelled_because_it_could_never_start_is_failed_not_cancelled_outside(tmp_path, monkeypatch):
    FakeSlurm(monkeypatch, "24|CANCELLED|0|PartitionConfig|\n")
    registry, record, attempt = _registered(tmp_path, monkeypatch, "24")
    SchedulerRecord(
        scheduler_id="24",
        state="PENDING",
        reason="PartitionConfig",
        never_starts=True,
        message="SLURM job 24 can never start, so mmt cancelled it: PartitionConfig",
    ).write(attempt.scheduler)
    record = records.refresh(record, registry)
    assert record.state == "FAILED" and "can never start" in record.result_record().error


def test_mmt_list_shows_why_a_job_waits(tmp_path, monkeypatch):
    from mmt.cli.main import _rows

    slurm = FakeSlurm(monkeypatch, "22|PENDING|0|ReqNodeNotAvail, UnavailableNodes:node1|\n")
    registry, record, attempt = _registered(tmp_path, monkeypatch, "22", num_nodes=1)
    record = records.refresh(record, registry)
    assert slurm.cancelled == [] and record.state == "PENDING"
    [row] = _rows([record])
    assert (row["status"], row["reason"], row["note"]) == (
        "Pending",
        "ReqNodeNotAvail, UnavailableNodes:node1",
        "ReqNodeNotAvail, UnavailableNodes:node1",
    )


def test_a_stopping_job_whose_cluster_is_gone_says_so_instead_of_stopping_for_good(tmp_path, monkeypatch):
    from mmt.cli.main import _rows

    FakeSlurm(monkeypatch, None)  # slurmctld does not answer
    registry, record, attempt = _registered(tmp_path, monkeypatch, "19", state="STOPPING", num_nodes=1)
    before = time.time()
    record = records.refresh(record, registry)
    assert record.state == "STOPPING"
    [row] = _rows([record])
    assert row["status"] == "Stopping" and row["note"].startswith("slurmctld not answering since ")
    view = read_scheduler(attempt)
    assert view.unreachable == "slurmctld" and view.unreachable_since >= before - 1
    since = view.unreachable_since
    records.refresh(record, registry)
    assert read_scheduler(attempt).unreachable_since == since  # since the first time, not the last


def test_the_live_page_shows_why_a_job_waits_and_that_one_could_never_start(tmp_path):
    from mmt.dashboard import data
    from mmt.records.schema import OwnerRecord, ResultRecord

    plan = _plan(tmp_path, num_nodes=1)
    attempt = _attempt(tmp_path, plan)
    OwnerRecord.of_this_process(
        attempt=attempt.id, name=plan.name, backend="slurm", job_id=plan.job_id, scheduler_id="22"
    ).write(JobDir(Path(plan.job_dir)).owner)
    SchedulerRecord(scheduler_id="22").seen(
        "PENDING", "ReqNodeNotAvail, UnavailableNodes:node1", pending.explain("ReqNodeNotAvail")
    ).write(attempt.scheduler)
    root = Path(plan.job_dir)
    summary = data.job_summary("x", root)
    assert summary["status"] == "PENDING"  # not RUNNING: it waits in the queue
    assert summary["reason"] == summary["note"] == "ReqNodeNotAvail, UnavailableNodes:node1"
    message = "SLURM job 22 can never start, so mmt cancelled it: PartitionConfig (...)"
    SchedulerRecord(
        scheduler_id="22", state="PENDING", reason="PartitionConfig", never_starts=True, message=message
    ).write(attempt.scheduler)
    ResultRecord(status=JobState.FAILED, attempt=attempt.id, error=f"job 0: {message}").write(root / "result.json")
    detail = data.job_detail("x", root)
    assert (detail["status"], detail["reason"], detail["note"]) == (
        "FAILED",
        "PartitionConfig",
        "can never start: PartitionConfig",
    )
    assert detail["error"] == f"job 0: {message}"
    # a record that is not one (a newer mmt's, a foreign file) says nothing, and breaks nothing
    attempt.scheduler.write_text('{"schema": 99, "state": "PENDING"}')
    assert data.job_summary("x", root)["note"] is None


def test_sacct_answers_for_an_array_s_tasks_listed_as_a_range_or_only_under_the_array_s_own_record(monkeypatch):
    """Tasks that never started have no record of their own in sacct: while the array runs they are a range
    (``711_[2-999%2]``), once it has ended SLURM may list them under the array's own record (``711``) alone."""
    from mmt.backends.slurm import queue

    answers = {
        "range": "711_0|CANCELLED by 0|0:0\n711_1|COMPLETED|0:0\n711_[2-999%2]|CANCELLED by 0|0:0\n",
        "own record": "711_0|CANCELLED by 0|0:0\n711_1|COMPLETED|0:0\n711|CANCELLED by 0|0:0\n",
    }
    for shape, out in answers.items():
        monkeypatch.setattr(queue, "ask", lambda args, out=out, **_: out)
        found = queue._sacct(["711_1", "711_5", "711_999"])
        assert {job_id: state.state for job_id, state in found.items()} == {
            "711_1": "COMPLETED",
            "711_5": "CANCELLED",
            "711_999": "CANCELLED",
        }, shape
