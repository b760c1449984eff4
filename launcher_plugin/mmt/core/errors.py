"""Errors mmt raises before anything starts, or returns inside a FAILED job result."""

from dataclasses import dataclass
from typing import Any, Optional, Tuple

from hydra.errors import CompactHydraException


class MMTError(CompactHydraException):
    """Base class of mmt's own errors. A CompactHydraException: Hydra prints the message alone, not a traceback
    through the launcher's frames (a failed rank's own traceback is part of the message)."""


class ConfigError(MMTError, ValueError):
    """A job's configuration cannot run; raised before anything starts.

    A CompactHydraException, so Hydra prints the message alone instead of a traceback through its own frames.
    """

    def __init__(self, key: str, value: object, expected: str, hint: Optional[str] = None) -> None:
        self.key, self.value, self.expected, self.hint = key, value, expected, hint
        message = f"Invalid {key}={value!r}: {expected}."
        if hint:
            message += f" HINT: {hint}"
        super().__init__(message)

    def __reduce__(
        self,
    ) -> Tuple[
        Any, Tuple[Any, ...]
    ]:  # keyword-only construction must survive pickling (results travel between processes)
        return (ConfigError, (self.key, self.value, self.expected, self.hint))


class UsageError(MMTError):
    """A request mmt refuses for a reason other than one config value (a job dir in use, an unknown job name)."""


class NotCarriedOut(MMTError):
    """A request mmt accepted but could not carry out (a stop the cluster did not take): the CLI exits 1, the SDK
    raises it. ``done``: what was carried out before it (lines for the user), said before the failure."""

    def __init__(self, message: str, done: Tuple[str, ...] = ()) -> None:
        self.done = tuple(done)
        super().__init__(message)

    def __reduce__(self) -> Tuple[Any, Tuple[Any, ...]]:
        return (NotCarriedOut, (str(self), self.done))


@dataclass(frozen=True)
class RankFailure:
    """The first process that failed in a job."""

    rank: int
    node_rank: int
    # the exit code of the process, or of the command it ran (command mode); None when killed by a signal
    exit_code: Optional[int]
    # signal name when the process (or its command) was killed by a signal (SIGKILL ...)
    signal: Optional[str]
    # exception type and message, and its traceback, when the process raised in Python
    exception: Optional[str]
    traceback: Optional[str]
    log: str
    # command mode once per node: the failed process is the node's command, which started that node's ranks
    whole_node: bool = False
    # every process exited 0, but the primary process reported no result
    missing_result: bool = False
    # a job with roles: the failed process's role (rank and node_rank are then that role's own)
    role: Optional[str] = None
    # a role whose processes may not end before the primary role's (early_exit=fail) ended first, cleanly
    ended_early: bool = False

    def describe(self) -> str:
        if self.missing_result:
            how = "exited 0 without reporting a result"
        elif self.exception:
            how = f"raised {self.exception}"
        elif self.signal:
            how = f"was killed by {self.signal}"
        else:
            how = f"exited with code {self.exit_code}"
            if self.exit_code is not None and self.exit_code > 128:
                how += f" (128+{self.exit_code - 128}: killed by a signal in a wrapper, e.g. the OOM killer)"
        if self.ended_early:
            how = f"exited before the primary role ended (code {self.exit_code}; the role's early_exit=fail)"
        role = f"role {self.role} " if self.role else ""
        if self.whole_node:
            return f"the command on {role}node {self.node_rank} {how}"
        return f"{role}rank {self.rank} (node {self.node_rank}) {how}"

    def brief(self) -> str:
        """Who failed and how, in a few words (``rank 1 exited with code 5``): a status line's, not the report's."""
        who = f"node {self.node_rank}" if self.whole_node else f"rank {self.rank}"
        if self.role:
            who = f"role {self.role} {who}"
        if self.ended_early:
            return f"{who} ended before the primary role"
        if self.missing_result:
            return f"{who} reported no result"
        if self.signal:
            return f"{who} was killed by {self.signal}"
        command = (self.exception or "").startswith("CommandFailedError")
        if self.exception and not command:
            return f"{who} raised {self.exception.split(':', 1)[0]}"
        return f"{who} exited with code {self.exit_code}"


class RankFailedError(MMTError):
    """A rank of the job failed; the others were stopped."""

    def __init__(self, job: str, failure: RankFailure) -> None:
        self.job, self.failure = job, failure
        others = "nodes" if failure.whole_node else "ranks"
        text = f"{job}: {failure.describe()}"
        if not failure.missing_result:
            text += f"; the other {others} were stopped"
        text += f". Log: {failure.log}"
        if failure.traceback:
            text += "\n" + failure.traceback.rstrip()
        super().__init__(text)

    def __reduce__(self) -> Tuple[Any, Tuple[Any, ...]]:
        return (RankFailedError, (self.job, self.failure))


class JobTimeoutError(MMTError):
    """The job reached its time limit; every rank was stopped."""

    def __init__(self, job: str, limit_s: float, running: str) -> None:
        self.job, self.limit_s, self.running = job, limit_s, running
        super().__init__(f"{job}: timed out after {limit_s:g} s; {running}")

    def __reduce__(self) -> Tuple[Any, Tuple[Any, ...]]:
        return (JobTimeoutError, (self.job, self.limit_s, self.running))


class JobInterruptedError(MMTError):
    """The launcher was interrupted (Ctrl-C, SIGTERM, SIGHUP) or the job was stopped; every rank was stopped."""

    def __init__(self, job: str, reason: str) -> None:
        self.job, self.reason = job, reason
        super().__init__(f"{job}: {reason}")

    def __reduce__(self) -> Tuple[Any, Tuple[Any, ...]]:
        return (JobInterruptedError, (self.job, self.reason))


class JobCancelledError(MMTError):
    """The job never ran: a job it waits for (hydra.launcher.after) ended without completing."""

    def __init__(self, job: str, reason: str) -> None:
        self.job, self.reason = job, reason
        super().__init__(f"{job}: {reason}")

    def __reduce__(self) -> Tuple[Any, Tuple[Any, ...]]:
        return (JobCancelledError, (self.job, self.reason))


class JobFailedError(MMTError):
    """The job could not run to its end for a reason outside its processes (the host agent was killed ...)."""

    def __init__(self, job: str, reason: str) -> None:
        self.job, self.reason = job, reason
        super().__init__(f"{job}: {reason}")

    def __reduce__(self) -> Tuple[Any, Tuple[Any, ...]]:
        return (JobFailedError, (self.job, self.reason))


class InvalidJobError(MMTError):
    """A job a sweeper proposed cannot run (its config is invalid); the other jobs of the batch still run."""

    def __init__(self, job: str, reason: str) -> None:
        self.job, self.reason = job, reason
        super().__init__(f"{job}: not started: {reason}")

    def __reduce__(self) -> Tuple[Any, Tuple[Any, ...]]:
        return (InvalidJobError, (self.job, self.reason))
