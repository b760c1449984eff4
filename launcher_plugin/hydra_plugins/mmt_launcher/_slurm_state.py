"""The state of SLURM jobs, read from the accounting database (sacct), or from the queue (squeue) without it.

submitit's own watcher backs off to a minute between polls and, without sacct, waits forever on a job that was
killed; this asks every poll and never waits on a job that has left the queue.
"""

import subprocess
from dataclasses import dataclass
from typing import Dict, Iterable, Optional

# states after which a job will not run again by itself (REQUEUED, PENDING, RUNNING ... are not final)
FINAL = ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "OUT_OF_MEMORY", "NODE_FAIL", "PREEMPTED", "BOOT_FAIL",
         "DEADLINE", "REVOKED", "SPECIAL_EXIT")
# no record (sacct lags the queue by a moment, or accounting is off) and no longer queued
GONE = "GONE"


@dataclass(frozen=True)
class JobState:
    state: str  # first word of SLURM's state: "CANCELLED by 0" -> CANCELLED
    exit_code: Optional[str] = None  # sacct's "code:signal"
    restarts: int = 0

    @property
    def final(self) -> bool:
        return self.state in FINAL or self.state == GONE


def _run(args: list) -> Optional[str]:
    try:
        done = subprocess.run(args, capture_output=True, text=True, timeout=30)
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


def _squeue(ids: list) -> Dict[str, JobState]:
    out = _run(["squeue", "-h", "-j", ",".join(ids), "-o", "%i|%T"]) or ""
    return {line.split("|")[0]: JobState(line.split("|")[1]) for line in out.splitlines() if "|" in line}


def job_states(job_ids: Iterable[str]) -> Dict[str, JobState]:
    """Every job's state; GONE for a job neither queued nor (yet) accounted."""
    ids = list(job_ids)
    if not ids:
        return {}
    queued = _squeue(ids)
    accounted = _sacct(ids) or {}
    states = {}
    for job_id in ids:
        if job_id in queued and not (job_id in accounted and accounted[job_id].final):
            # the queue is current; sacct can lag a moment behind it
            restarts = accounted[job_id].restarts if job_id in accounted else 0
            states[job_id] = JobState(queued[job_id].state, None, restarts)
        else:
            states[job_id] = accounted.get(job_id, JobState(GONE))
    return states


def accounting_available() -> bool:
    return _run(["sacct", "-n", "-X", "-S", "now", "-o", "JobID"]) is not None


def cancel(job_ids: Iterable[str]) -> None:
    ids = list(job_ids)
    if ids:
        _run(["scancel", *ids])
