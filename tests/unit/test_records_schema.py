"""The records that cross processes (mmt.records.schema): typed, versioned, and the same keys on disk as before they
were typed. A file an older mmt wrote (no ``schema`` key) reads; one a newer mmt wrote (a higher ``schema``) is
refused, saying so, instead of misread."""

import json
import os
import pickle
from pathlib import Path

import pytest

from mmt.core.errors import RankFailure
from mmt.core.jobdir import Attempt, JobDir
from mmt.core.states import JobState, ProcessState
from mmt.planning.machine import Machine
from mmt.planning.plan import JobPlan
from mmt.records import ownership
from mmt.records.outcome import (
    JobOutcome,
    first_failure,
    outcome_of_record,
    process_state,
    read_result,
    result_record,
    write_result,
)
from mmt.records.registry import JobRecord
from mmt.records.schema import (
    ERROR_SCHEMA,
    EXIT_SCHEMA,
    OWNER_SCHEMA,
    RESULT_SCHEMA,
    ErrorRecord,
    ExitRecord,
    OwnerRecord,
    RecordError,
    ResultRecord,
    UnknownSchemaError,
)

FAILURE = RankFailure(
    rank=3,
    node_rank=1,
    exit_code=None,
    signal=None,
    exception="ValueError: boom",
    traceback="Traceback ...\nValueError: boom\n",
    log="/s/0/logs/node1.rank3.log",
)

# what mmt wrote before records had versions (the keys, in their order; values as a real run left them)
OLD_RESULT = {
    "job": 0,
    "name": "probe-0",
    "attempt": "20260101T000000-abcdef",
    "overrides": ["recipe.x=1", "hydra.launcher.env.TOKEN=***"],
    "status": "FAILED",
    "num_nodes": 2,
    "devices": 2,
    "world_size": 4,
    "machine": "cpu_x_2",
    "summary_metric": None,
    "duration_s": 3.5,
    "stop_latency_s": 0.25,
    "scheduler_id": None,
    "started_at": 1767225600.0,
    "ended_at": 1767225603.5,
    "return_value": None,
    "failure": {
        "rank": 3,
        "node_rank": 1,
        "exit_code": None,
        "signal": None,
        "exception": "ValueError: boom",
        "traceback": "Traceback ...\nValueError: boom\n",
        "log": "/s/0/logs/node1.rank3.log",
        "whole_node": False,
        "missing_result": False,
    },
    "error": "job 0: rank 3 (node 1) raised ValueError: boom; the other ranks were stopped. Log: ...",
}
OLD_ORPHAN_RESULT = {
    "status": "FAILED",
    "error": "probe-0: its supervisor (pid 1) ended without concluding it",
    "attempt": "a1",
    "job": 0,
    "ended_at": 1767225603.5,
}
OLD_OWNER = {
    "host": "h1",
    "pid": 4242,
    "started": 1767225600.0,
    "attempt": "a1",
    "name": "probe-0",
    "backend": "slurm",
    "job_id": "0101-000000-abcd-0",
    "scheduler_id": "777",
}
OLD_ERROR = {"time": 1767225601.0, "exception": "ValueError: boom", "traceback": "Traceback ..."}
OLD_COMMAND_ERROR = {
    "time": 1767225602.0,
    "exception": "CommandFailedError: killed",
    "traceback": "Traceback ...",
    "exit_code": None,
    "signal": "SIGKILL",
}
OLD_EXIT = {"code": -15, "stopped": True, "time": 1767225602.5}


def _plan(tmp_path: Path, **overrides) -> JobPlan:
    values = dict(
        num=0,
        name="probe-0",
        job_id="0101-000000-abcd-0",
        overrides=("recipe.x=1", "hydra.launcher.env.TOKEN=abc"),
        job_dir=str(tmp_path / "0"),
        num_nodes=2,
        devices=2,
        machine=Machine(name="cpu_x_2", accelerator="cpu", gpus=0, cpus=2, memory_gb=8, price_per_hour=0.0),
        image=None,
        command=None,
        command_mode="per_node",
        env={"TOKEN": "abc"},
        timeout_s=60.0,
    )
    values.update(overrides)
    return JobPlan(**values)


def _write(path: Path, data) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data))
    return path


# ------------------------------------------------------------------------------------------------ round trips


@pytest.mark.parametrize(
    "record",
    [
        ResultRecord(
            job=2,
            name="n-2",
            attempt="a",
            overrides=("x=1",),
            status=JobState.COMPLETED,
            num_nodes=1,
            devices=2,
            world_size=2,
            machine="m",
            summary_metric="loss",
            duration_s=1.5,
            started_at=10.0,
            ended_at=11.5,
            return_value={"loss": 0.25, "curve": [1, 2]},
        ),
        ResultRecord(status=JobState.FAILED, attempt="a", failure=FAILURE, error="job 0: rank 3 ...", scheduler_id="9"),
        OwnerRecord.of_this_process(attempt="a", name="n", backend="local", job_id="j"),
        OwnerRecord(host="h", pid=1, started=2.0, attempt="a", scheduler_id="12"),
        ErrorRecord(exception="ValueError: x", traceback="tb"),
        ErrorRecord(exception="CommandFailedError: x", traceback="tb", command=True, exit_code=3),
        ErrorRecord(exception="CommandFailedError: x", traceback="tb", command=True, signal="SIGKILL"),
        ExitRecord(code=0),
        ExitRecord(code=-9, stopped=True, time=5.0),
    ],
    ids=lambda record: type(record).__name__,
)
def test_a_record_reads_back_as_written(record, tmp_path: Path) -> None:
    assert type(record).from_dict(record.to_dict()) == record
    assert type(record).from_dict(json.loads(record.to_json())) == record
    path = tmp_path / "record.json"
    record.write(path)
    assert type(record).read(path) == record
    assert json.loads(path.read_text())["schema"] == record.SCHEMA_VERSION == 1


def test_records_are_frozen() -> None:
    with pytest.raises(AttributeError):
        ExitRecord(code=0).code = 1  # type: ignore[misc]


def test_the_files_keep_their_keys_plus_schema(tmp_path: Path) -> None:
    """The dashboard, the plots, the registry and users' scripts read these keys: none renamed, none dropped."""
    result = ResultRecord.from_dict(OLD_RESULT)
    assert list(result.to_dict()) == ["schema", *OLD_RESULT]
    no_timing = {k: v for k, v in OLD_RESULT.items() if k not in ("started_at", "ended_at")}
    assert list(ResultRecord.from_dict(no_timing).to_dict()) == ["schema", *no_timing]  # absent stays absent
    assert list(OwnerRecord.from_dict(OLD_OWNER).to_dict()) == ["schema", *OLD_OWNER]
    before_submit = {k: v for k, v in OLD_OWNER.items() if k != "scheduler_id"}
    assert list(OwnerRecord.from_dict(before_submit).to_dict()) == ["schema", *before_submit]
    assert list(ErrorRecord.from_dict(OLD_ERROR).to_dict()) == ["schema", *OLD_ERROR]
    assert list(ErrorRecord.from_dict(OLD_COMMAND_ERROR).to_dict()) == ["schema", *OLD_COMMAND_ERROR]
    assert list(ExitRecord.from_dict(OLD_EXIT).to_dict()) == ["schema", *OLD_EXIT]
    # and the values too, byte for byte as JSON
    for kind, old in (
        (ResultRecord, OLD_RESULT),
        (OwnerRecord, OLD_OWNER),
        (ErrorRecord, OLD_COMMAND_ERROR),
        (ExitRecord, OLD_EXIT),
    ):
        assert {k: v for k, v in kind.from_dict(old).to_dict().items() if k != "schema"} == old


def test_result_json_is_written_as_before(tmp_path: Path) -> None:
    plan = _plan(tmp_path)
    outcome = JobOutcome(JobState.FAILED, 3.5, failure=FAILURE, stop_latency_s=0.25)
    record = result_record(plan, outcome, None, "a1", started_at=1.0, ended_at=4.5)
    write_result(plan, record)
    on_disk = json.loads(JobDir(tmp_path / "0").result.read_text())
    assert list(on_disk) == ["schema", *OLD_RESULT]
    assert on_disk["schema"] == RESULT_SCHEMA
    assert on_disk["overrides"] == ["recipe.x=1", "hydra.launcher.env.TOKEN=***"]  # masked, as before
    assert on_disk["status"] == "FAILED" and on_disk["failure"]["rank"] == 3
    assert on_disk["error"].startswith("job 0: rank 3 (node 1) raised ValueError: boom")
    umask = os.umask(0)
    os.umask(umask)
    assert JobDir(tmp_path / "0").result.stat().st_mode & 0o777 == 0o666 & ~umask  # the user's file, not private
    back = read_result(tmp_path / "0")
    assert back == record and back.concludes("a1") and not back.concludes("other")
    assert outcome_of_record(back) == outcome


def test_a_completed_result_carries_its_value_and_no_error(tmp_path: Path) -> None:
    plan = _plan(tmp_path)
    record = result_record(plan, JobOutcome(JobState.COMPLETED, 2.0), {"loss": float("nan"), "k": (1, 2)}, "a1")
    assert record.completed and record.error is None and record.failure is None
    assert json.loads(record.to_json())["return_value"] == {"loss": "nan", "k": [1, 2]}  # JSON-able, as before
    assert "started_at" not in record.to_dict()
    outcome = outcome_of_record(record)
    assert outcome.status == JobState.COMPLETED and outcome.detail == ""


def test_a_timeout_reads_back_with_its_detail(tmp_path: Path) -> None:
    plan = _plan(tmp_path)
    outcome = JobOutcome(JobState.TIMEOUT, 60.0, detail="all 4 ranks were still running (none reached the end)")
    back = outcome_of_record(ResultRecord.from_dict(json.loads(result_record(plan, outcome, None, "a1").to_json())))
    assert back.status == JobState.TIMEOUT and back.duration_s == 60.0
    assert back.detail.endswith(outcome.detail)  # the error's text past "job 0: "


# ------------------------------------------------------------------------------------ files of the previous mmt


def test_files_without_a_schema_read_as_version_one(tmp_path: Path) -> None:
    result = ResultRecord.read(_write(tmp_path / "result.json", OLD_RESULT))
    assert result is not None and result.schema == RESULT_SCHEMA
    assert result.status == JobState.FAILED and result.failure == FAILURE
    assert result.overrides == ("recipe.x=1", "hydra.launcher.env.TOKEN=***")
    assert result.started_at == 1767225600.0 and result.num_nodes == 2
    owner = OwnerRecord.read(_write(tmp_path / "owner.json", OLD_OWNER))
    assert owner == OwnerRecord(
        host="h1",
        pid=4242,
        started=1767225600.0,
        attempt="a1",
        name="probe-0",
        backend="slurm",
        job_id="0101-000000-abcd-0",
        scheduler_id="777",
    )
    assert owner.schema == OWNER_SCHEMA
    error = ErrorRecord.read(_write(tmp_path / "error.0.json", OLD_ERROR))
    assert error == ErrorRecord(time=1767225601.0, exception="ValueError: boom", traceback="Traceback ...")
    assert not error.command and error.schema == ERROR_SCHEMA
    command = ErrorRecord.read(_write(tmp_path / "error.1.json", OLD_COMMAND_ERROR))
    assert command.command and command.exit_code is None and command.signal == "SIGKILL"
    exited = ExitRecord.read(_write(tmp_path / "exit.0.json", OLD_EXIT))
    assert exited == ExitRecord(code=-15, stopped=True, time=1767225602.5) and exited.schema == EXIT_SCHEMA


def test_keys_a_file_lacks_get_defaults_and_unknown_keys_are_ignored() -> None:
    orphan = ResultRecord.from_dict(OLD_ORPHAN_RESULT)  # what the registry held for an orphan
    assert orphan.status == JobState.FAILED and orphan.job == 0 and orphan.overrides == ()
    assert orphan.name is None and orphan.failure is None and orphan.ended_at == 1767225603.5
    assert ErrorRecord.from_dict({}).time is None and ErrorRecord.from_dict({}).when == float("inf")
    assert ExitRecord.from_dict({"code": 0}) == ExitRecord(code=0, stopped=False, time=None)
    assert OwnerRecord.from_dict({"name": "x"}).scheduler_id is None
    added_later = {**OLD_EXIT, "schema": 1, "rss_mb": 12}  # a key a later version of the same schema adds
    assert ExitRecord.from_dict(added_later) == ExitRecord.from_dict(OLD_EXIT)


def test_a_registry_result_of_the_previous_mmt_reads_typed() -> None:
    record = JobRecord(
        name="probe-0",
        job_id="j",
        backend="local",
        job_dir="/x/0",
        sweep_dir="/x",
        attempt="a1",
        num_nodes=1,
        devices=1,
        machine="m",
        command=None,
        command_mode="per_node",
        overrides=[],
        state="FAILED",
        result=OLD_RESULT,
    )
    assert record.result_record().failure == FAILURE
    record.result = None
    assert record.result_record() is None


# --------------------------------------------------------------------------------------- a newer mmt's records


@pytest.mark.parametrize(
    "kind, old",
    [(ResultRecord, OLD_RESULT), (OwnerRecord, OLD_OWNER), (ErrorRecord, OLD_ERROR), (ExitRecord, OLD_EXIT)],
)
def test_a_newer_schema_is_refused_saying_so(kind, old, tmp_path: Path) -> None:
    newer = {**old, "schema": kind.SCHEMA_VERSION + 1}
    with pytest.raises(UnknownSchemaError, match=r"schema 2, and this mmt knows up to schema 1.*newer mmt"):
        kind.from_dict(newer)
    path = _write(tmp_path / "record.json", newer)
    with pytest.raises(UnknownSchemaError) as raised:
        kind.read(path)
    assert str(path) in str(raised.value)
    for nonsense in ("1", None, -1, True, 1.5):
        with pytest.raises(UnknownSchemaError):
            kind.from_dict({**old, "schema": nonsense})
    again = pickle.loads(pickle.dumps(raised.value))  # errors travel between processes
    assert str(again) == str(raised.value)


def test_what_is_not_a_record_reads_as_none(tmp_path: Path) -> None:
    assert ResultRecord.read(tmp_path / "missing.json") is None
    (tmp_path / "partial.json").write_text('{"status": "COMPL')
    assert ResultRecord.read(tmp_path / "partial.json") is None
    assert ResultRecord.read(_write(tmp_path / "list.json", [1, 2])) is None
    assert ResultRecord.read(_write(tmp_path / "nostatus.json", {"job": 1})) is None
    assert ResultRecord.read(_write(tmp_path / "badstatus.json", {"status": "DONE"})) is None
    assert ExitRecord.read(_write(tmp_path / "badcode.json", {"code": "0"})) is None
    with pytest.raises(RecordError, match="result"):
        ResultRecord.from_dict({"status": "COMPLETED", "duration_s": "long"})
    with pytest.raises(RecordError):
        ResultRecord.from_dict([])  # type: ignore[arg-type]


# ------------------------------------------------------------------------------- the readers use the records


def _attempt(tmp_path: Path) -> Attempt:
    return JobDir(tmp_path / "0").attempt("a1").create()


def test_process_states_and_the_first_failure_from_the_previous_mmts_records(tmp_path: Path) -> None:
    plan = _plan(tmp_path, num_nodes=1, devices=4)
    attempt = _attempt(tmp_path)
    _write(attempt.exit_file(0), {"code": 0, "stopped": False, "time": 5.0})
    _write(attempt.error_file(1), OLD_ERROR)  # raised at 1767225601
    _write(attempt.exit_file(1), {"code": 1, "stopped": False, "time": 1767225601.5})
    _write(attempt.exit_file(2), OLD_EXIT)  # stopped by mmt
    _write(attempt.error_file(3), OLD_COMMAND_ERROR)  # its command was killed, later
    assert [process_state(attempt, i) for i in range(4)] == [
        ProcessState.SUCCEEDED,
        ProcessState.FAILED,
        ProcessState.STOPPED,
        ProcessState.FAILED,
    ]
    failure = first_failure(plan, attempt)
    assert failure is not None and failure.rank == 1 and failure.exception == "ValueError: boom"
    assert failure.exit_code == 1 and failure.signal is None  # the process's own status (not a command's)
    # without rank 1's, rank 3's command failure is first: its command's status, not the process's
    attempt.error_file(1).unlink()
    attempt.exit_file(1).unlink()
    failure = first_failure(plan, attempt)
    assert failure.rank == 3 and failure.signal == "SIGKILL" and failure.exit_code is None


def test_the_writers_records_are_read_by_the_readers(tmp_path: Path) -> None:
    plan = _plan(tmp_path, num_nodes=1, devices=2)
    attempt = _attempt(tmp_path)
    ExitRecord(code=-9, stopped=False, time=3.0).write(attempt.exit_file(0))
    ExitRecord(code=-15, stopped=True, time=4.0).write(attempt.exit_file(1))
    assert oct(attempt.exit_file(0).stat().st_mode & 0o777) == oct(0o600)  # the engine's own: private
    failure = first_failure(plan, attempt)
    assert failure.rank == 0 and failure.signal == "SIGKILL" and failure.exit_code is None
    assert first_failure(plan, attempt, outside_signals=(9,)) is None  # SLURM's kill is not the job's failure
    assert first_failure(plan, attempt, terminated_at=2.0) is None


def test_a_newer_mmts_process_record_is_not_misread(tmp_path: Path) -> None:
    attempt = _attempt(tmp_path)
    _write(attempt.exit_file(0), {**OLD_EXIT, "schema": 99})
    with pytest.raises(UnknownSchemaError, match="exit"):
        process_state(attempt, 0)


def test_owner_json_is_claimed_updated_and_read_typed(tmp_path: Path) -> None:
    job_dir = JobDir(tmp_path / "0")
    seen = []
    owner = OwnerRecord.of_this_process(attempt="a1", name="probe-0", backend="slurm", job_id="j")
    held = ownership.claim(job_dir, owner, lambda o: seen.append(o) or False)
    on_disk = json.loads(job_dir.owner.read_text())
    assert list(on_disk) == ["schema", "host", "pid", "started", "attempt", "name", "backend", "job_id"]
    assert on_disk["pid"] == os.getpid() and oct(job_dir.owner.stat().st_mode & 0o777) == oct(0o600)
    held.update(scheduler_id="123")
    assert json.loads(job_dir.owner.read_text())["scheduler_id"] == "123"
    assert ownership.read_owner(job_dir.root) == held.owner and held.owner.scheduler_id == "123"
    held.release(forget=False)
    # the next claim asks the backend about the previous owner, typed
    again = ownership.claim(job_dir, {"name": "second", "attempt": "a2"}, lambda o: seen.append(o) or False)
    assert [o.scheduler_id for o in seen] == ["123"] and again.owner.name == "second"
    again.release(forget=False)
    # an owner of a newer mmt: refused, saying so, rather than taken over
    _write(job_dir.owner, {**OLD_OWNER, "schema": 2})
    with pytest.raises(UnknownSchemaError, match="owner"):
        ownership.claim(job_dir, {"name": "third"}, lambda o: False)
    assert not ownership.lock_is_held(job_dir.root)  # the refused claim let the lock go


def test_a_slurm_jobs_last_step_concludes_from_the_typed_records(tmp_path: Path, monkeypatch) -> None:
    """finalize: owner.json says which attempt owns the dir; the error and exit records say who failed first."""
    import pickle as plain_pickle

    from mmt.backends.slurm import finalize
    from mmt.core.jobdir import write_atomic

    plan = _plan(tmp_path, num_nodes=2, devices=1)
    attempt = _attempt(tmp_path)
    write_atomic(attempt.plan, plain_pickle.dumps(plan), private=True)
    OwnerRecord.of_this_process(attempt="a1", name=plan.name, backend="slurm", scheduler_id="41").write(
        JobDir(tmp_path / "0").owner
    )
    ErrorRecord(exception="ValueError: boom", traceback="tb", time=2.0).write(attempt.error_file(1))
    ExitRecord(code=1, time=2.5).write(attempt.exit_file(1))
    ExitRecord(code=-15, stopped=True, time=3.0).write(attempt.exit_file(0))
    monkeypatch.setenv("SLURM_JOB_ID", "41")
    monkeypatch.delenv("SLURM_RESTART_COUNT", raising=False)
    assert finalize.main([str(attempt.dir), "1"]) == 0
    result = read_result(tmp_path / "0")
    assert result is not None and result.concludes("a1") and result.status == JobState.FAILED
    assert result.failure.rank == 1 and result.failure.exception == "ValueError: boom"
    assert result.scheduler_id == "41" and result.started_at is not None and attempt.finalized.exists()
    # a newer launch owns the dir now: this attempt's last step leaves its result alone
    other = JobDir(tmp_path / "0").attempt("a0").create()
    write_atomic(other.plan, plain_pickle.dumps(plan), private=True)
    assert finalize.main([str(other.dir), "1"]) == 0
    assert read_result(tmp_path / "0").concludes("a1")


def test_the_registry_keeps_the_result_as_a_dict_and_reads_it_typed(tmp_path: Path) -> None:
    """Its ``result`` column holds result.json's keys (to_dict at the boundary); a refresh reads the file typed."""
    from mmt.backends.local import records as local_records
    from mmt.backends.slurm.records import _scheduler_id_in_owner
    from mmt.records.registry import Registry

    registry = Registry(tmp_path / "registry.sqlite")

    def registered(name: str, attempt: str) -> JobRecord:
        record = JobRecord(
            name=name,
            job_id="j",
            backend="local",
            job_dir=str(tmp_path / name),
            sweep_dir=str(tmp_path),
            attempt=attempt,
            num_nodes=1,
            devices=2,
            machine="m",
            command=None,
            command_mode="per_node",
            overrides=["x=1"],
            state="RUNNING",
        )
        registry.add([record])
        return record

    # a job dir with this attempt's result: the registry gets it, as the file's dict
    done = registered("done-0", "a1")
    plan = _plan(tmp_path, name="done-0", job_dir=done.job_dir)
    write_result(plan, result_record(plan, JobOutcome(JobState.COMPLETED, 1.0), {"loss": 1.5}, "a1", ended_at=7.0))
    refreshed = local_records.refresh(done, registry)
    stored = registry.get("done-0")
    assert refreshed.state == stored.state == "COMPLETED" and stored.ended_at == 7.0
    assert stored.result == json.loads(JobDir(Path(done.job_dir)).result.read_text())
    assert stored.result_record().return_value == {"loss": 1.5}
    # no result and no live supervisor: concluded FAILED, saying why (a result with the same keys)
    orphan = registered("orphan-0", "a2")
    local_records.refresh(orphan, registry)
    stored = registry.get("orphan-0")
    assert stored.state == "FAILED" and stored.result["schema"] == RESULT_SCHEMA
    assert "ended before the job was started" in stored.result_record().error
    assert stored.result_record().concludes("a2")
    # a SLURM launcher that died after sbatch left the id in owner.json, for its own attempt only
    OwnerRecord.of_this_process(attempt="a2", scheduler_id="55").write(JobDir(tmp_path / "orphan-0").owner)
    assert _scheduler_id_in_owner(stored) == "55"
    stored.attempt = "a3"
    assert _scheduler_id_in_owner(stored) is None
