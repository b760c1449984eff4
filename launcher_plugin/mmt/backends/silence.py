"""A cluster whose controller stops answering (Ray's head and its dashboard) is a fault with an end.

While it is silent the jobs' states are the last ones seen, and the jobs may run on (a dashboard restarted, a network
cut): the watcher says so once, with the time left. After ``hydra.launcher.cluster_grace_s`` without an answer a job
on it is concluded FAILED, lost with its cluster: one line names the cluster, its address and since when, and says
what may still run and how to check. An answer within the grace, and the job goes on as if nothing happened.

A backend whose jobs run on without their controller and conclude themselves (SLURM's, inside their allocation,
without slurmctld) has no such end: its watcher reads the job's own conclusion instead.
"""

import time
from dataclasses import dataclass
from typing import Optional

from mmt.records.scheduler import clock

GRACE_KEY = "hydra.launcher.cluster_grace_s"
# long enough for a head or dashboard restarted by hand or by its supervisor; short enough that a launcher, a sweep
# or `mmt wait` does not hang for good on a cluster that is gone
DEFAULT_GRACE_S = 300.0


@dataclass(frozen=True)
class Silence:
    """One cluster that did not answer: who (``the Ray dashboard at http://...``), since when (wall clock), and what
    the last question met."""

    who: str
    since: float
    why: str

    def over(self, grace_s: float, now: Optional[float] = None) -> bool:
        """Whether the grace has run out: the jobs on this cluster are lost with it."""
        return (time.time() if now is None else now) - self.since >= grace_s

    def describe(self) -> str:
        """``the Ray dashboard at http://h:8265 does not answer since 10:02:03 (connection refused)``."""
        return f"{self.who} does not answer since {_seconds(self.since)} ({self.why})"

    def waiting(self, grace_s: float, jobs: int) -> str:
        """What the watcher says once, when the silence starts."""
        left = max(0.0, grace_s - (time.time() - self.since))
        return (
            f"mmt: {self.describe()}; the state of its {jobs} job(s) is the last one seen. Unless it answers within "
            f"{_duration(left)} ({GRACE_KEY}={grace_s:g}), they are concluded lost with the cluster"
        )

    def lost(self, grace_s: float, may_run: str, check: str) -> str:
        """A job's FAILED line once the grace has run out."""
        return (
            f"lost with its cluster: {self.who} has not answered since {_seconds(self.since)} ({self.why}), longer "
            f"than {GRACE_KEY}={grace_s:g}; {may_run}. HINT: check with {check}"
        )

    def answered_again(self) -> str:
        """What the watcher says once the cluster answers again."""
        return f"mmt: {self.who} answers again (it did not since {_seconds(self.since)})"

    def came_back_without(self, check: str, now: Optional[float] = None) -> str:
        """A job's FAILED line when the cluster answers again (within the grace or not) and no longer knows it."""
        back = _seconds(time.time() if now is None else now)
        return (
            f"lost with its cluster: {self.who} did not answer from {_seconds(self.since)} ({self.why}) and answered "
            f"again at {back} without the job: the cluster was restarted, and the job's processes went with it. "
            f"HINT: check with {check}"
        )


def _seconds(when: float) -> str:
    """``10:02:03`` today (a silence is measured in seconds), else the day too."""
    day = clock(when)
    return day if " " in day else time.strftime("%H:%M:%S", time.localtime(when))


def _duration(seconds: float) -> str:
    return f"{seconds:.0f} s" if seconds < 120 else f"{seconds / 60:.1f} min"
