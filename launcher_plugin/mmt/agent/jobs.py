"""The processes of one job on one agent: fail fast, stop within the grace, leave nothing behind.

The same rules on every backend (the local host agent runs every node of a job; a SLURM node agent runs one):

* the first process that fails (exits non-zero or is killed, not by us) stops its siblings at once;
* stopping is SIGTERM to every process group, SIGKILL after ``kill_grace_s``;
* when the last process has exited, whatever the job left running (a background child, a daemon in a session of
  its own) is found by the ``MMT_JOB_ID`` it inherited and stopped the same way, so the job is only over when every
  process it started is gone. One that also dropped the tag (``env -u MMT_JOB_ID``, ``env -i``) is found all the
  same: every descendant of the job's processes is noted while they run (:meth:`JobProcesses.observe`), and one
  still there when the job stops (adopted by the agent, a subreaper, once its parent died) is stopped with it.

Every exit is recorded in the job's attempt dir (``exit.<i>.json``): that is how a failure on another node is
attributed, and how a process killed outright (SIGKILL, the OOM killer) is told from one mmt stopped.
"""

import signal
import time
from dataclasses import dataclass
from typing import Dict, List, Optional

from mmt.core import proctree, timeline
from mmt.core.jobdir import Attempt
from mmt.core.rank_env import MMT_JOB_ID, NODE_RANK
from mmt.records.schema import ExitRecord


@dataclass
class Process:
    index: int
    pid: int
    code: Optional[int] = None  # exit code once it exited; negative: killed by that signal
    stopped: bool = False  # mmt signalled it before it exited


class JobProcesses:
    def __init__(
        self,
        job_id: str,
        attempt: Attempt,
        kill_grace_s: float,
        node_rank: Optional[int] = None,
        rank_records: bool = True,
        fail_fast: bool = True,
    ) -> None:
        """``rank_records``: its processes are the job's ranks, whose exits it records; False for processes that
        record their ranks' exits themselves (node agents in containers). ``fail_fast``: the first failure stops the
        others; False for an elastic job's node agents (one lost node costs that node: the backend decides)."""
        self.job_id, self.attempt, self.kill_grace_s = job_id, attempt, kill_grace_s
        self.rank_records, self.fail_fast = rank_records, fail_fast
        # the tags every process of this job (on this node, for a SLURM node agent) inherits
        self.tags = {MMT_JOB_ID: job_id} if node_rank is None else {MMT_JOB_ID: job_id, NODE_RANK: str(node_rank)}
        self.by_pid: Dict[int, Process] = {}
        self.stopping_since: Optional[float] = None
        self.killed = False
        self.first_failure: Optional[Process] = None
        self._sweep_deadline: Optional[float] = None
        self.ended = False
        # every descendant of the job's processes seen so far (pid -> start time), and when to look again
        self._seen: Dict[int, int] = {}
        self._next_look = 0.0

    # --------------------------------------------------------------------------------------------- events

    def started(self, index: int, pid: int) -> None:
        if self.rank_records:
            timeline.mark_at(self.attempt.timeline, timeline.RANK_FORK, process=index)
        process = Process(index=index, pid=pid)
        self.by_pid[pid] = process
        if self.stopping_since is not None:  # stopped before this one even started
            process.stopped = True
            proctree.signal_group(pid, signal.SIGKILL if self.killed else signal.SIGTERM)

    def exited(self, pid: int, code: int) -> Optional[Process]:
        """Record an exit; returns the process (None when the pid is not one of ours)."""
        process = self.by_pid.get(pid)
        if process is None:
            return None
        process.code = code
        if self.rank_records:
            timeline.mark_at(self.attempt.timeline, timeline.RANK_EXIT, process=process.index, code=code)
            try:
                ExitRecord(code=code, stopped=process.stopped).write(self.attempt.exit_file(process.index))
            except OSError:  # a full disk must not stop supervision; the exit is still reported live
                pass
        if (
            code != 0
            and not process.stopped
            and self.fail_fast
            and self.first_failure is None
            and self.stopping_since is None
        ):
            self.first_failure = process
            self.stop()
        return process

    def observe(self) -> None:
        """Note the descendants of the job's processes (at most every 0.2 s, less often for a big job): one that
        leaves the job's process group and session and drops its tag is still known to be the job's once its parent
        is gone (adopted by the agent, a subreaper: its ancestry says nothing any more)."""
        now = time.monotonic()
        if now < self._next_look:
            return
        running = self.running
        self._next_look = now + max(0.2, 0.002 * len(running))
        # the same processes only: a pid reused since belongs to someone else, and so does what descends from it
        self._seen = {pid: start for pid, start in self._seen.items() if proctree.start_time(pid) == start}
        found = set()
        for pid in [p.pid for p in running] + [pid for pid in self._seen]:
            if pid not in found:
                found.update(proctree.family(pid))
        for pid in found:
            if pid not in self.by_pid and pid not in self._seen:
                started = proctree.start_time(pid)
                if started is not None:
                    self._seen[pid] = started

    def _left_behind(self) -> List[int]:
        """What the job left that is still there, its own processes aside: processes with its tags, and the
        descendants seen (the same processes: a pid reused since is not ours)."""
        left = proctree.tagged(self.tags, exclude=self.by_pid)
        self._seen = {pid: start for pid, start in self._seen.items() if proctree.start_time(pid) == start}
        return left + [pid for pid in self._seen if pid not in left]

    def stop(self) -> None:
        if self.stopping_since is not None:
            return
        self.observe()  # what the processes started since the last look
        self.stopping_since = time.monotonic()
        for process in self.running:
            process.stopped = True
            proctree.signal_group(process.pid, signal.SIGTERM)
        # processes that left the group (setsid) hear it now too, not after the ranks are gone
        proctree.signal_all(self._left_behind(), signal.SIGTERM)

    def tick(self) -> None:
        """Escalate to SIGKILL after the grace; once every process exited, sweep what the job left behind."""
        now = time.monotonic()
        if self.stopping_since is not None and not self.killed and now - self.stopping_since >= self.kill_grace_s:
            self.killed = True
            for process in self.running:
                proctree.signal_group(process.pid, signal.SIGKILL)
            proctree.signal_all(self._left_behind(), signal.SIGKILL)
        if self.ended:
            return
        if self.running:
            self.observe()
            return
        # every process exited: what it left behind (in its group, anywhere with the job's tags, or seen descending
        # from it) goes too
        groups = [p.pid for p in self.by_pid.values() if proctree.group_alive(p.pid)]
        left = self._left_behind()
        if not groups and not left:
            self.ended = True
            return
        if self._sweep_deadline is None:
            grace = (
                self.kill_grace_s
                if self.stopping_since is None
                else max(0.0, self.stopping_since + self.kill_grace_s - now)
            )
            self._sweep_deadline = now + grace
            sig = signal.SIGTERM
        elif now >= self._sweep_deadline:
            sig = signal.SIGKILL
        else:
            return
        for pgid in groups:
            proctree.signal_group(pgid, sig)
        proctree.signal_all(left, sig)

    # --------------------------------------------------------------------------------------------- facts

    @property
    def running(self) -> List[Process]:
        return [p for p in self.by_pid.values() if p.code is None]

    @property
    def succeeded(self) -> bool:
        return self.ended and bool(self.by_pid) and all(p.code == 0 for p in self.by_pid.values())

    def kill_now(self) -> None:
        """SIGKILL everything at once (the agent is going away)."""
        self.stopping_since = self.stopping_since or time.monotonic()
        self.killed = True
        for process in self.by_pid.values():
            proctree.signal_group(process.pid, signal.SIGKILL)
        proctree.signal_all(self._left_behind(), signal.SIGKILL)
