"""Local jobs seen from another process than the one supervising them (``mmt wait``, the SDK): watched through
their job dirs. A job is running while its supervisor holds the job dir's lock; it ended when its result for this
attempt is written; a lock released without a result means the supervisor was killed before it could conclude."""

import time
from dataclasses import dataclass
from pathlib import Path
from typing import List, Optional

from mmt.backends.base import Backend, JobHandle, JobOutcome, JobState, JobStatus, Submission
from mmt.errors import ConfigError
from mmt.jobdir import Attempt, JobDir, read_json
from mmt.launching.outcome import outcome_of_record
from mmt.launching.ownership import lock_is_held
from mmt.planning.plan import JobPlan, Limits


@dataclass
class WatchedLocalJob(JobHandle):
    submission: Submission
    supervisor_pid: Optional[int] = None
    started: float = 0.0
    outcome: Optional[JobOutcome] = None


class LocalWatcher(Backend):
    name = "local"

    @property
    def limits(self) -> Limits:  # never plans anything
        return Limits(max_nodes=0, max_devices=0, max_world=0, why="a watcher starts no jobs")

    def problems(self, plan: JobPlan) -> List[ConfigError]:
        return []

    def describe(self, plan: JobPlan) -> List[str]:
        return []

    def submit(self, submission: Submission) -> JobHandle:
        raise NotImplementedError("a watcher starts no jobs")

    def attach(self, plan: JobPlan, attempt: Attempt, supervisor_pid: Optional[int]) -> WatchedLocalJob:
        return WatchedLocalJob(submission=Submission(plan=plan, attempt=attempt), supervisor_pid=supervisor_pid,
                               started=time.monotonic())

    def poll(self, handle: JobHandle) -> JobStatus:
        assert isinstance(handle, WatchedLocalJob)
        if handle.outcome is None:
            job_dir = JobDir(Path(handle.plan.job_dir))
            held = lock_is_held(job_dir.root)
            result = read_json(job_dir.result)
            if result is not None and result.get("attempt") == handle.attempt.id:
                handle.outcome = outcome_of_record(result)
            elif not held:
                handle.outcome = JobOutcome(
                    JobState.FAILED, None, detail=f"its supervisor (pid {handle.supervisor_pid}) ended without "
                    "concluding it (killed?); its processes died with it")
        state = handle.outcome.status if handle.outcome else JobState.RUNNING
        return JobStatus(state=state, outcome=handle.outcome)

    def cancel(self, handle: JobHandle, reason: str) -> None:
        """Ask the supervisor to stop the job (it checks for the request every half second)."""
        if handle.attempt.dir.exists():
            handle.attempt.stop_request.touch()

    def wait(self, timeout_s: float) -> None:
        time.sleep(max(timeout_s, 0.2))
