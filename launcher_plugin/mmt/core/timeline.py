"""A job's timeline: when each phase of its launch happened, in every process that took part.

Each process appends one JSON line per phase to the job dir's ``timeline.jsonl`` (``JobDir.timeline``): the
launcher (start, submit, result known, return), the SLURM batch script (its start), each node's task and agent
(process start, agent start, ready to fork), each rank (forked, its task called, exit) and whoever concludes the job.
``benchmarks/bench_timeline.py`` prints it, so that a change on the launch path shows which phase it cost.

A mark is one ``write`` of one line to a file opened with ``O_APPEND`` (tens of microseconds, atomic for lines this
short): cheap enough for every job, and it never fails a job (a mark that cannot be written is lost, silently).
Training code may add its own phases with :func:`mark` (``mmt.timeline.mark("first_collective")``): a rank knows
its timeline from ``MMT_TIMELINE``, which the worker sets.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict, List, Optional

# the timeline file of the job a process belongs to (set by the worker for the rank's own code)
TIMELINE_VAR = "MMT_TIMELINE"

# the phases mmt itself marks, in the order a job goes through them (a recipe may add its own)
LAUNCHER_START = "launcher_start"  # the launcher's process started (from /proc)
SUBMIT = "submit"  # the launcher hands the job to its backend (sbatch, the host agent)
SUBMITTED = "submitted"  # the backend accepted it
BATCH_START = "batch_start"  # SLURM: the batch script started
TASK_START = "task_start"  # SLURM: a node's task process started (from /proc)
AGENT_START = "agent_start"  # a node agent took the job
AGENT_READY = "agent_ready"  # the agent imported the job's preload and forks
RANK_FORK = "rank_fork"  # the agent started a rank
RANK_START = "rank_start"  # the rank's own process runs (after fork or exec)
USER_CODE = "user_code"  # the rank calls the task function (or the command)
FIRST_COLLECTIVE = "first_collective"  # the recipe's first collective returned (recipes that mark it)
RANK_EXIT = "rank_exit"  # the agent saw the rank exit
AGENT_END = "agent_end"  # a node agent is done
CONCLUDED = "concluded"  # result.json written (the launcher, or SLURM's finalize)
LAUNCHER_RETURN = "launcher_return"  # the launcher is done with the launch (summary printed)

NAME = "timeline.jsonl"


def mark_at(path: Optional[os.PathLike[str] | str], phase: str, at: Optional[float] = None, **where: Any) -> None:
    """Append ``phase`` (at ``at``, default now) with ``where`` (node, rank, ...) to the timeline at ``path``."""
    if not path:
        return
    event: Dict[str, Any] = {"phase": phase, "t": round(time.time() if at is None else at, 6), **where}
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_NOFOLLOW, 0o666)
    except OSError:  # the job dir is gone (a job that deleted it): the mark is lost, the job goes on
        return
    try:
        os.write(fd, (json.dumps(event, separators=(",", ":")) + "\n").encode())
    except OSError:
        pass
    finally:
        os.close(fd)


def mark(phase: str, **where: Any) -> None:
    """A phase of the current rank's job, from training code (a no-op outside an mmt rank)."""
    mark_at(os.environ.get(TIMELINE_VAR), phase, **where)


def process_start_time(pid: Optional[int] = None) -> Optional[float]:
    """When process ``pid`` (default: this one) started, in epoch seconds (kernel clock ticks, 10 ms here). From
    the uptime, not the boot time: /proc/stat's btime is whole seconds, which would put every process up to a
    second off the clock the other phases are read from."""
    try:
        stat = Path(f"/proc/{pid or 'self'}/stat").read_text()
        ticks = int(stat.rsplit(")", 1)[1].split()[19])
        uptime = float(Path("/proc/uptime").read_text().split()[0])
        return time.time() - (uptime - ticks / os.sysconf("SC_CLK_TCK"))
    except (OSError, ValueError, IndexError):
        return None


@dataclass(frozen=True)
class Event:
    phase: str
    t: float
    where: Dict[str, Any]


def read(path: os.PathLike[str] | str) -> List[Event]:
    """The timeline's events in time order (unreadable lines skipped: a process killed mid-write)."""
    events = []
    try:
        lines = Path(path).read_text().splitlines()
    except OSError:
        return []
    for line in lines:
        try:
            raw = json.loads(line)
            events.append(Event(str(raw.pop("phase")), float(raw.pop("t")), raw))
        except (ValueError, KeyError, TypeError, AttributeError):
            continue
    return sorted(events, key=lambda e: e.t)
