"""The state of SLURM jobs, from the queue (squeue) and the accounting database (sacct).

submitit's own watcher backs off to a minute between polls and, without sacct, waits forever on a job that was
killed; this asks every poll and never waits on a job that has left the queue. The queue (squeue, answered by
slurmctld from memory) is asked every poll; accounting (sacct, a query of slurmdbd's database: ten times the
cost, and what sites ask users not to poll) only for a job the queue no longer shows as active, for how it ended.
A query that fails (slurmctld busy, a timeout) says nothing: a job is only GONE when the queue answered without
it and accounting, where there is accounting, has no record of it either.
"""

import getpass
import os
import subprocess
import time
from dataclasses import dataclass
from typing import Dict, Iterable, Optional

# states after which a job will not run again by itself (REQUEUED, PENDING, RUNNING ... are not final)
FINAL = ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "OUT_OF_MEMORY", "NODE_FAIL", "PREEMPTED", "BOOT_FAIL",
         "DEADLINE", "REVOKED", "SPECIAL_EXIT")
ACTIVE = ("PENDING", "RUNNING", "CONFIGURING", "COMPLETING", "REQUEUED", "RESIZING", "SUSPENDED", "REQUEUE_HOLD",
          "REQUEUE_FED", "SIGNALING", "STAGE_OUT", "STOPPED")
# no longer queued, and no record (accounting is off)
GONE = "GONE"


@dataclass(frozen=True)
class JobState:
    state: str  # first word of SLURM's state: "CANCELLED by 0" -> CANCELLED
    exit_code: Optional[str] = None  # sacct's "code:signal"
    restarts: int = 0

    @property
    def final(self) -> bool:
        return self.state in FINAL or self.state == GONE


def _run(args: list, env: Optional[Dict[str, str]] = None) -> Optional[str]:
    # a session of its own: the terminal's Ctrl-C, sent to the launcher's whole process group, must not kill the
    # scancel that the launcher runs because of that Ctrl-C
    try:
        done = subprocess.run(args, capture_output=True, text=True, timeout=30, start_new_session=True, env=env)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return done.stdout if done.returncode == 0 else None


def _sacct(ids: list) -> Optional[Dict[str, JobState]]:
    out = _run(["sacct", "-X", "-n", "-P", "-D", "-j", ",".join(ids), "-o", "JobID,State,ExitCode"])
    if out is None:
        return None
    found: Dict[str, JobState] = {}
    for line in out.splitlines():
        parts = line.split("|")
        if len(parts) < 3 or parts[0] not in ids:
            continue
        previous = found.get(parts[0])
        restarts = (previous.restarts + 1) if previous else 0  # -D lists every run of a requeued job
        found[parts[0]] = JobState(parts[1].split()[0] if parts[1] else "PENDING", parts[2], restarts)
    return found


def _squeue(ids: list) -> Optional[Dict[str, JobState]]:
    # -t all: a job that just ended is still listed (COMPLETING, CANCELLED ...) for MinJobAge
    out = _run(["squeue", "-h", "-t", "all", "-j", ",".join(ids), "-O", "JobID:|,State:|,RestartCnt:|"])
    if out is None:
        return None
    found = {}
    for line in out.splitlines():
        parts = [part.strip() for part in line.split("|")]
        if len(parts) >= 3 and parts[0]:
            found[parts[0]] = JobState(parts[1], None, int(parts[2]) if parts[2].isdigit() else 0)
    return found


def job_states(job_ids: Iterable[str], accounting: bool = True) -> Dict[str, JobState]:
    """The state of every job the queries could tell; a job whose state is unknown right now is left out."""
    ids = list(job_ids)
    if not ids:
        return {}
    queued = _squeue(ids)
    states = {job_id: state for job_id, state in (queued or {}).items() if job_id in ids and state.state in ACTIVE}
    ended = [job_id for job_id in ids if job_id not in states]  # or not known to the queue, or it did not answer
    accounted = (_sacct(ended) if ended else {}) if accounting else {}
    for job_id in ended:
        record = (accounted or {}).get(job_id)
        queue_state = queued.get(job_id) if queued is not None else None
        if queue_state is not None and (record is None or not record.final):
            # the queue is current (sacct can lag behind it)
            states[job_id] = queue_state
        elif record is not None:
            states[job_id] = record
        elif queued is not None and (accounted is not None or not accounting):
            states[job_id] = JobState(GONE)
    return states


def latest_job_named(name: str, submitted_since: float) -> Optional[str]:
    """This user's newest job called ``name`` submitted at ``submitted_since`` or later (whole seconds: not an older
    job that had the same name); "" when there is none, None when the queue did not answer."""
    out = _run(["squeue", "-h", "-t", "all", "-u", getpass.getuser(), "-n", name, "-o", "%i|%V"],
               env={**os.environ, "SLURM_TIME_FORMAT": "standard"})
    if out is None:
        return None
    rows = (line.strip().split("|", 1) for line in out.splitlines() if "|" in line)
    ours = [job_id for job_id, submitted in rows if _submitted_since(submitted, submitted_since)]
    return max(ours, key=lambda job_id: int(job_id) if job_id.isdigit() else 0, default="")


def _submitted_since(submitted: str, since: float) -> bool:
    try:
        return time.mktime(time.strptime(submitted, "%Y-%m-%dT%H:%M:%S")) >= int(since) - 1
    except ValueError:
        return True  # a time that cannot be read counts as ours (better followed than failed)


def is_active(job_id: str) -> Optional[bool]:
    """Whether the job is queued or running; None when SLURM cannot be asked."""
    state = job_states([job_id], accounting=accounting_available()).get(job_id)
    return None if state is None else not state.final


def accounting_available() -> bool:
    return _run(["sacct", "-n", "-X", "-S", "now", "-o", "JobID"]) is not None


def cancel(job_ids: Iterable[str], signal_name: Optional[str] = None) -> None:
    ids = list(job_ids)
    if ids:
        _run(["scancel", *([f"--signal={signal_name}", "--full"] if signal_name else []), *ids])
