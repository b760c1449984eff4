"""Hang detection (``hydra.launcher.hang_timeout_min``): the local backend watches each job, and on SLURM every
node agent watches the whole job (its files are on the shared filesystem), signals its own ranks for their stacks,
and the first agent whose grace is over writes the job's hang record (``hang.json``) before the ranks stop.

Progress is anything a working rank leaves behind: a new line in its log, or a touch of its heartbeat file (every
training step of the LM recipes, through mmt's Lightning callback; ``touch "$MMT_HEARTBEAT"`` in a script). A job
none of whose processes has shown progress for the timeout has hung. Watching the whole job, not each rank, is what
keeps a long validation or checkpoint on rank 0 from tripping it while the other ranks wait at a barrier; a
checkpoint that takes longer than the timeout without a heartbeat still would, so the timeout must exceed it.

Before the job is stopped, every armed Python rank writes its stack (:mod:`mmt.core.stacks`), and the failure
says where each one waits: the ranks inside a collective, and the one that never arrived.
"""

import json
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, List, Mapping, Optional, Sequence, Tuple

from mmt.core import proctree
from mmt.core.jobdir import Attempt, JobDir, read_json, write_atomic
from mmt.core.stacks import HEARTBEAT_VAR, STACK_SIGNAL, STACKS_VAR, where
from mmt.planning.plan import JobPlan

# how long the ranks get to write their stacks once asked
STACKS_GRACE_S = 3.0


def _stamp(path: Path) -> Tuple[int, int]:
    try:
        info = os.stat(path)
    except OSError:
        return (-1, 0)
    return (info.st_size, info.st_mtime_ns)


@dataclass
class ProgressWatch:
    """When any of ``paths`` (every process's log and heartbeat) last changed, looked at about once a second."""

    timeout_s: float
    paths: Tuple[Path, ...]
    last_change: float = field(default_factory=time.monotonic)
    seen: Tuple[Tuple[int, int], ...] = ()
    next_look: float = 0.0

    def stalled_for(self, now: float) -> float:
        """Seconds since the last sign of progress (``now``: time.monotonic())."""
        if now >= self.next_look:
            self.next_look = now + min(1.0, self.timeout_s / 10)
            snapshot = tuple(_stamp(path) for path in self.paths)
            if snapshot != self.seen:
                self.seen, self.last_change = snapshot, now
        return now - self.last_change


class HangWatch:
    """One watcher's part in hang detection: the job's progress; once none for the timeout, the stacks of the
    processes it can signal; then, once the stacks of every process still running are in (or their grace is over),
    the hang in one line. The local backend watches a job with one; on SLURM every node agent has its own."""

    def __init__(self, plan: JobPlan, attempt: Attempt) -> None:
        assert plan.hang_timeout_s is not None
        self.plan = plan
        self.progress = ProgressWatch(plan.hang_timeout_s, progress_paths(plan, attempt))
        self.asked_at: Optional[float] = None
        self.stalled = 0.0

    def check(self, now: float, signalled: Mapping[int, int], running: Sequence[int]) -> Optional[str]:
        """``now``: time.monotonic(); ``signalled``: process index -> pid of the processes this watcher may ask for
        their stack; ``running``: the indices of every process of the job still running. The hang's line once
        the job has hung and the stacks are in; None until then."""
        if self.asked_at is None:
            self.stalled = self.progress.stalled_for(now)
            if self.stalled < self.progress.timeout_s:
                return None
            self.asked_at = now
            files = stack_files(self.plan)
            # only to an armed process: the real-time signal would end one that is not
            proctree.signal_all([pid for index, pid in signalled.items() if files[index].exists()], STACK_SIGNAL)
            return None
        if now - self.asked_at < STACKS_GRACE_S and not stacks_written(self.plan, running):
            return None
        return describe(self.plan, self.stalled, running)


def progress_paths(plan: JobPlan, attempt: Attempt) -> Tuple[Path, ...]:
    """What shows a job's progress: every process's log and heartbeat."""
    logs = tuple(plan.log_path(i) for i in range(plan.process_count))
    return logs + tuple(attempt.heartbeat_file(i) for i in range(plan.process_count))


def hang_env(plan: JobPlan, attempt: Attempt, index: int) -> Dict[str, str]:
    """Where process ``index`` shows progress and writes its stack when asked (none where hangs are not watched)."""
    if plan.hang_timeout_s is None:
        return {}
    return {HEARTBEAT_VAR: str(attempt.heartbeat_file(index)), STACKS_VAR: str(stack_files(plan)[index])}


def stack_files(plan: JobPlan) -> List[Path]:
    """Each process's stack file, by process index."""
    job_dir = JobDir(Path(plan.job_dir))
    if plan.roles:  # each role numbers its own ranks: its name tells their stacks apart
        logs = [plan.log_path(i).relative_to(job_dir.logs) for i in range(plan.process_count)]
        return [job_dir.stacks / ".".join(log.with_suffix(".txt").parts) for log in logs]
    return [job_dir.stack_file(p.node_rank, p.rank, plan.per_node) for p in plan.places()]


def _read(path: Path) -> str:
    try:
        return path.read_text(errors="replace")
    except OSError:
        return ""


def stacks_written(plan: JobPlan, indices: Sequence[int]) -> bool:
    files = stack_files(plan)
    return all(_read(files[i]) for i in indices)


def describe(plan: JobPlan, stalled_s: float, indices: Sequence[int]) -> str:
    """The hang in one line: how long, and where each process that was still running waits, grouped by the user's
    own line (the ranks waiting inside one collective together, the one that never arrived apart), with the
    functions they are inside."""
    files = stack_files(plan)
    places: Dict[str, List[int]] = {}
    inside: Dict[str, List[str]] = {}
    for index in indices:
        found = where(_read(files[index]))
        place = found.place if found else "no Python stack (a command's own program, or it did not answer)"
        places.setdefault(place, []).append(index)
        if found is not None and found.inside and found.inside not in inside.setdefault(place, []):
            inside[place].append(found.inside)
    who = "node" if plan.per_node else "rank"

    def named(group: List[int]) -> str:
        numbers = [plan.place(i).node_rank if plan.per_node else plan.place(i).rank for i in group]
        return f"{who}{'s' if len(numbers) > 1 else ''} {', '.join(map(str, numbers))}"

    def at(place: str) -> str:
        return place + (f" (inside {', '.join(inside[place])})" if inside.get(place) else "")

    groups = sorted(places.items(), key=lambda item: (-len(item[1]), item[1]))
    text = "; ".join(f"{named(group)} at {at(place)}" for place, group in groups)
    return (
        f"hung: no progress (output or training step) for {stalled_s:.0f} s, hydra.launcher.hang_timeout_min="
        f"{plan.hang_timeout_s / 60 if plan.hang_timeout_s else 0:g}: {text}. Stacks: {files[0].parent}/"
    )


def write_hang(attempt: Attempt, detail: str) -> None:
    """The job's hang record, once: the first node agent to get there writes it."""
    if not attempt.hang_file.exists():
        write_atomic(attempt.hang_file, json.dumps({"detail": detail}).encode(), private=True)


def read_hang(attempt: Attempt) -> Optional[str]:
    """What the hang record says, when the job's run hung."""
    data = read_json(attempt.hang_file)
    detail = data.get("detail") if isinstance(data, dict) else None
    return detail if isinstance(detail, str) else None
