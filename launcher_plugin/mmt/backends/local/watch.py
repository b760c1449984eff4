"""Local jobs seen from another process than the one supervising them (``mmt wait``, the SDK): watched through
their job dirs. A job is running while its supervisor holds the job dir's lock; it ended when its result for this
attempt is written; a lock released without a result means the supervisor was killed before it could conclude."""

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from mmt.backends.base import JobHandle, JobSnapshot, Submission, Watcher
from mmt.core.jobdir import JobDir
from mmt.core.states import JobState
from mmt.records.outcome import JobOutcome, outcome_of_record, read_result
from mmt.records.ownership import lock_is_held
from mmt.records.payload import read_plan
from mmt.records.registry import JobRecord


@dataclass
class WatchedLocalJob(JobHandle):
    submission: Submission
    name: str
    supervisor_pid: Optional[int] = None
    outcome: Optional[JobOutcome] = None


class LocalWatcher(Watcher[WatchedLocalJob]):
    name = "local"

    def attach(self, record: JobRecord) -> WatchedLocalJob:
        attempt = JobDir(Path(record.job_dir)).attempt(record.attempt)
        return WatchedLocalJob(submission=Submission(plan=read_plan(attempt), attempt=attempt), name=record.name,
                               supervisor_pid=record.supervisor_pid)

    def poll(self, handle: WatchedLocalJob) -> JobSnapshot:
        if handle.outcome is None:
            job_dir = JobDir(Path(handle.plan.job_dir))
            held = lock_is_held(job_dir.root)
            result = read_result(job_dir.root)
            if result is not None and result.concludes(handle.attempt.id):
                handle.outcome = outcome_of_record(result)
            elif not held:
                handle.outcome = JobOutcome(
                    JobState.FAILED, None, detail=f"its supervisor (pid {handle.supervisor_pid}) ended without "
                    "concluding it (killed?); its processes died with it")
        state = handle.outcome.status if handle.outcome else JobState.RUNNING
        return JobSnapshot(state=state, outcome=handle.outcome)

    def cancel(self, handle: WatchedLocalJob, reason: str) -> None:
        """Ask the supervisor to stop the job (it checks for the request every half second)."""
        if handle.attempt.dir.exists():
            handle.attempt.stop_request.touch()

    def wait(self, timeout_s: float) -> None:
        time.sleep(max(timeout_s, 0.2))  # a job dir is cheap to read: no scheduler to spare
