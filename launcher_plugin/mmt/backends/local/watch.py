"""Local jobs seen from another process than the one supervising them (``mmt wait``, the SDK): watched through
their job dirs and the run dir. A job is running while its supervisor is alive (mmt.records.liveness: its beacon in
the run dir, which the job cannot delete); it ended when its result for this attempt is written; a supervisor gone
without a result means it was killed before it could conclude."""

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from mmt.backends.base import JobHandle, JobSnapshot, Submission, Watcher
from mmt.core.errors import UsageError
from mmt.core.jobdir import JobDir
from mmt.core.states import JobState
from mmt.records import liveness
from mmt.records.outcome import JobOutcome, outcome_of_record, read_result
from mmt.records.payload import read_plan
from mmt.records.registry import JobRecord


@dataclass
class WatchedLocalJob(JobHandle):
    submission: Submission
    name: str
    supervisor_pid: Optional[int] = None
    outcome: Optional[JobOutcome] = None
    record: Optional[JobRecord] = None


class LocalWatcher(Watcher[WatchedLocalJob]):
    name = "local"

    def attach(self, record: JobRecord) -> WatchedLocalJob:
        attempt = JobDir(Path(record.job_dir)).attempt(record.attempt)
        try:
            plan = read_plan(attempt)
        except (FileNotFoundError, NotADirectoryError):
            raise UsageError(
                f"{record.name}: its records in {record.job_dir} are gone (did the job delete its own "
                f"dir?), so it cannot be followed from here. HINT: `mmt list`, `mmt inspect "
                f"{record.name}` and `mmt stop {record.name}` still can"
            ) from None
        return WatchedLocalJob(
            submission=Submission(plan=plan, attempt=attempt),
            name=record.name,
            supervisor_pid=record.supervisor_pid,
            record=record,
        )

    def poll(self, handle: WatchedLocalJob) -> JobSnapshot:
        if handle.outcome is None:
            job_dir = JobDir(Path(handle.plan.job_dir))
            assert handle.record is not None
            held = liveness.supervisor_alive(handle.record)
            result = read_result(job_dir.root)
            if result is not None and result.concludes(handle.attempt.id):
                handle.outcome = outcome_of_record(result)
            elif not held:
                handle.outcome = JobOutcome(
                    JobState.FAILED,
                    None,
                    detail=f"its supervisor (pid {handle.supervisor_pid}) ended without "
                    "concluding it (killed?); its processes died with it",
                )
        state = handle.outcome.status if handle.outcome else JobState.RUNNING
        return JobSnapshot(state=state, outcome=handle.outcome)

    def cancel(self, handle: WatchedLocalJob, reason: str) -> None:
        """Ask the supervisor to stop the job (it checks for the request every half second)."""
        try:
            liveness.request_stop(handle.plan.job_id, handle.attempt.id)
        except OSError:
            pass

    def wait(self, timeout_s: float) -> None:
        time.sleep(max(timeout_s, 0.2))  # a job dir is cheap to read: no scheduler to spare
