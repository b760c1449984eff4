"""How a job ended, as any backend reports it, and its conversion into Hydra's ``JobReturn`` and result.json."""

import json
import math
import shutil
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Optional

import cloudpickle
from hydra.core.utils import JobReturn, JobStatus
from omegaconf import DictConfig, OmegaConf

from . import _payload
from ._plan import JobPlan
from .errors import JobInterruptedError, JobTimeoutError, RankFailedError, RankFailure

COMPLETED, FAILED, TIMEOUT, INTERRUPTED = "COMPLETED", "FAILED", "TIMEOUT", "INTERRUPTED"


@dataclass
class JobOutcome:
    status: str
    duration_s: Optional[float]
    # FAILED: the first rank that failed
    failure: Optional[RankFailure] = None
    # TIMEOUT: the ranks still running at the limit; INTERRUPTED: why
    detail: str = ""
    # the scheduler's id (SLURM job id), when there is one
    scheduler_id: Optional[str] = None
    # seconds from the decision to stop the job (failure, time limit, interrupt) until its last rank was gone
    stop_latency_s: Optional[float] = None


def read_failure(directory: Path, index: int, node_rank: int, rank: int, code: Optional[int],
                 signal_name: Optional[str], log: str, whole_node: bool = False) -> RankFailure:
    """What a failed process left behind: its exception and traceback if it raised, else its exit status."""
    record: dict = {}
    try:
        record = json.loads(_payload.error_path(directory, index).read_text())
    except (FileNotFoundError, json.JSONDecodeError):
        pass
    return RankFailure(rank=rank, node_rank=node_rank, exit_code=code, signal=signal_name,
                       exception=record.get("exception"), traceback=record.get("traceback"), log=log,
                       whole_node=whole_node)


def _primary_return(plan: JobPlan) -> Optional[JobReturn]:
    try:
        with open(_payload.return_path(_payload.payload_dir(plan.job_dir)), "rb") as handle:
            return cloudpickle.load(handle)
    except (FileNotFoundError, EOFError):
        return None


def _return_without_primary(plan: JobPlan, config: DictConfig) -> JobReturn:
    """A JobReturn built in the launcher, for a job whose rank 0 never reported (killed, never started)."""
    task_cfg = OmegaConf.masked_copy(config, [k for k in config.keys() if k != "hydra"])
    return JobReturn(
        overrides=list(plan.overrides),
        cfg=task_cfg,
        hydra_cfg=OmegaConf.masked_copy(config, "hydra"),
        working_dir=plan.job_dir,
        task_name=str(config.hydra.job.name),
        status=JobStatus.FAILED,
    )


def _error(plan: JobPlan, outcome: JobOutcome) -> Exception:
    if outcome.status == TIMEOUT:
        return JobTimeoutError(plan.name, plan.timeout_s, outcome.detail)
    if outcome.status == INTERRUPTED:
        return JobInterruptedError(plan.name, outcome.detail)
    assert outcome.failure is not None, "a FAILED outcome names its failing rank"
    return RankFailedError(plan.name, outcome.failure)


def to_job_return(plan: JobPlan, config: DictConfig, outcome: JobOutcome) -> JobReturn:
    """Rank 0's JobReturn when the job completed; otherwise FAILED with an error naming the cause."""
    ret = _primary_return(plan)
    if outcome.status == COMPLETED and ret is not None and ret.status == JobStatus.COMPLETED:
        return ret
    if outcome.status == COMPLETED:  # every process exited 0, but rank 0 left no result
        outcome.status = FAILED
        outcome.failure = RankFailure(rank=0, node_rank=0, exit_code=0, signal=None,
                                      exception="rank 0 exited 0 without reporting a result", traceback=None,
                                      log=str(Path(plan.job_dir) / "logs"))
    ret = ret or _return_without_primary(plan, config)
    ret.status = JobStatus.FAILED
    ret.return_value = _error(plan, outcome)
    return ret


def _jsonable(value: Any) -> Any:
    try:
        json.dumps(value, allow_nan=False)
        return value
    except (TypeError, ValueError):
        if isinstance(value, float) and not math.isfinite(value):
            return str(value)
        if isinstance(value, dict):
            return {str(k): _jsonable(v) for k, v in value.items()}
        if isinstance(value, (list, tuple)):
            return [_jsonable(v) for v in value]
        return repr(value)


def write_result(plan: JobPlan, outcome: JobOutcome, ret: JobReturn) -> None:
    """<job_dir>/result.json: status, topology, duration, rank 0's return value or the failure. Atomic."""
    record = {
        "job": plan.num,
        "overrides": list(plan.overrides),
        "status": outcome.status,
        "num_nodes": plan.num_nodes,
        "devices": plan.devices,
        "world_size": plan.world_size,
        "machine": plan.machine.name,
        "duration_s": outcome.duration_s,
        "stop_latency_s": outcome.stop_latency_s,
        "scheduler_id": outcome.scheduler_id,
        "return_value": _jsonable(ret._return_value) if ret.status == JobStatus.COMPLETED else None,
        "failure": asdict(outcome.failure) if outcome.failure else None,
        "error": None if ret.status == JobStatus.COMPLETED else str(ret._return_value),
    }
    _payload.write_atomic(Path(plan.job_dir) / "result.json", json.dumps(record, indent=2).encode())


def discard_payload(plan: JobPlan) -> None:
    """The payload holds pickled code and config; once the outcome is read it is only clutter."""
    shutil.rmtree(_payload.payload_dir(plan.job_dir), ignore_errors=True)
