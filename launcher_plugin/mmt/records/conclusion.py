"""The records' side of concluding a job: one call that writes its result, updates its registry row and lets go of
its attempt, in the one right order.

1. ``result.json``, which every reader trusts over everything else (a job dir is the truth);
2. the registry row: before the claim is let go, so that while its supervisor still holds the attempt's beacon the
   job is never taken for an orphan, even one whose job dir (and so whose result.json) is gone;
3. the attempt set aside: its payload (pickled code, config, copied secrets) discarded; a local attempt's dir
   removed whole, a SLURM one's records kept (the allocation's last step may still read them) and marked
   concluded; then the claim released (owner.json forgotten for a local job; kept for a SLURM one, so that a rerun
   asks SLURM whether that job still runs).

What cannot be written is returned, never raised: the job has ended whatever a full disk or a damaged registry says.
"""

import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from mmt.core import timeline
from mmt.core.jobdir import Attempt, JobDir
from mmt.planning.plan import JobPlan
from mmt.records.outcome import JobOutcome, read_primary_return, result_record, return_value_of, write_result
from mmt.records.ownership import Claim
from mmt.records.payload import discard_payload
from mmt.records.registry import Registry, RegistryError
from mmt.records.restarts import recorded, with_earlier_runs, with_requeues
from mmt.records.schema import ResultRecord


@dataclass(frozen=True)
class Recorded:
    """What could not be recorded of a conclusion (None: all of it was)."""

    # result.json's path and why it could not be written
    result_error: Optional[str] = None
    # why the registry row could not be updated (the registry reconciles it from the job dir later)
    registry_error: Optional[str] = None


def record_conclusion(
    plan: JobPlan,
    attempt: Attempt,
    record: ResultRecord,
    *,
    registry: Optional[Registry],
    claim: Optional[Claim],
    keep_records: bool,
    write: bool = True,
) -> Recorded:
    """Record that the job ended as ``record`` says. ``claim``: the job dir's, when this process owns the attempt
    (None: a job re-attached to, which its owner concludes); ``keep_records``: the attempt's records stay (a SLURM
    job's); ``write``: False when ``record`` is the job's own result.json already (it concluded itself)."""
    result_error = None
    if write:
        try:
            write_result(plan, record)
            timeline.mark_at(attempt.timeline, timeline.CONCLUDED, by="launcher")
        except OSError as exc:
            result_error = f"{JobDir(Path(plan.job_dir)).result}: {exc.strerror or exc}"
    registry_error = None
    if registry is not None:
        try:
            registry.update(
                plan.name,
                state=record.status.value,
                ended_at=record.ended_at or time.time(),
                result=record.to_dict(),
                restarts=record.restarts,
            )
        except RegistryError as exc:
            registry_error = str(exc)
    if claim is not None:
        try:
            if keep_records:
                discard_payload(attempt)
                attempt.concluded.touch()
            else:
                shutil.rmtree(attempt.dir, ignore_errors=True)
        except OSError:  # the job deleted its own dir: there is nothing left to set aside
            pass
        finally:
            claim.release(forget=not keep_records)
    return Recorded(result_error=result_error, registry_error=registry_error)


def conclude_from_outside(
    plan: JobPlan, attempt: Attempt, outcome: JobOutcome, ended_at: Optional[float] = None
) -> ResultRecord:
    """The result of a job that ended with nobody concluding it (concluded by ``mmt list`` or a watcher from what
    its scheduler says): its return value, earlier runs and requeues, written to ``result.json`` where the job dir
    can still be written (the registry keeps it otherwise), and its payload discarded. ``ended_at``: when it ended,
    where that was before it was found (the last sign of life the records hold); now by default."""
    value = return_value_of(read_primary_return(attempt))
    ended = time.time() if ended_at is None else ended_at
    result = with_earlier_runs(
        result_record(plan, outcome, value, attempt.id, ended_at=ended, attempt=attempt), recorded(attempt)
    )
    result = with_requeues(result, attempt)
    try:
        write_result(plan, result)
    except OSError:
        pass  # the registry keeps it; the job dir cannot be written from here
    discard_payload(attempt)
    return result
