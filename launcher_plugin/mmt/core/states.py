"""The states a job and its processes go through, as every layer and every process names them.

Hydra has a ``JobStatus`` of its own (COMPLETED/FAILED of one task function call); these are mmt's, for a job of
N nodes x M processes, and ``result.json`` holds one of the final job states.
"""

import enum


class JobState(str, enum.Enum):
    """Where a job is. The last five are final; ``result.json`` holds one of them."""

    PENDING = "PENDING"  # accepted, not started (waiting for capacity here, or in SLURM's queue)
    RUNNING = "RUNNING"
    RESTARTING = "RESTARTING"  # a run failed; the next starts after its back-off (hydra.launcher.max_restarts)
    STOPPING = "STOPPING"  # asked to stop (a failure, the time limit, an interrupt); its processes are going
    COMPLETED = "COMPLETED"
    FAILED = "FAILED"
    TIMEOUT = "TIMEOUT"
    INTERRUPTED = "INTERRUPTED"
    CANCELLED = "CANCELLED"  # never ran: a job it waits for (hydra.launcher.after) ended without completing

    @property
    def final(self) -> bool:
        return self in FINAL_STATES

    def __str__(self) -> str:
        return self.value


FINAL_STATES = frozenset(
    {JobState.COMPLETED, JobState.FAILED, JobState.TIMEOUT, JobState.INTERRUPTED, JobState.CANCELLED}
)


class ProcessState(str, enum.Enum):
    """Where one process of a job is (a rank, or a node's command)."""

    PENDING = "PENDING"
    RUNNING = "RUNNING"
    SUCCEEDED = "SUCCEEDED"
    FAILED = "FAILED"  # exited non-zero or was killed, by itself
    STOPPED = "STOPPED"  # stopped by mmt (a sibling failed, the time limit, an interrupt)

    def __str__(self) -> str:
        return self.value


class StartMethod(str, enum.Enum):
    """How a node agent starts its ranks (``hydra.launcher.start_method``)."""

    fork = "fork"  # ranks fork from the node agent, which imported the recipe's `preload` once
    spawn = "spawn"  # every rank is a fresh interpreter (slower; for code that is not fork-safe)


class ConsoleMode(str, enum.Enum):
    """Whose output the launcher's console follows live (``hydra.launcher.console``)."""

    rank0 = "rank0"
    all = "all"
    none = "none"


def values(kind: "type[enum.Enum]") -> "tuple[str, ...]":
    """An enum's values, in order: what a validation message lists as allowed."""
    return tuple(str(member.value) for member in kind)
