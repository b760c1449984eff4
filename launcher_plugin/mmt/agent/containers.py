"""The containers of a local job's simulated nodes: removed when the job ends, whatever ends it.

A node of a job with an ``image`` is one container (``mmt.backends.local.images`` builds its command line): for the
task function its one process is mmt's node agent, run attached by the host agent like any process; for a command
it only waits (``sleep infinity``, started here before the ranks) and each rank's command is an ``exec`` into it.
The in-container ranks carry the job's tag (``MMT_JOB_ID``), so stopping a job reaches them through the same sweep
as any process a job left behind (``mmt.agent.jobs``), and removing the container (``rm -f``) ends whatever is left.

Every container is labelled with its job (``mmt.job=<job id>``): whoever finds a job's supervisor gone removes
them by that label (:func:`remove_labelled`), and the attempt dir says which runtime they are in
(``Attempt.containers``), so nothing outlives a SIGKILLed launcher.
"""

import json
import subprocess
import time
from dataclasses import dataclass
from typing import Dict, List, Optional, Sequence, Tuple

from mmt.core.jobdir import Attempt, read_json, write_atomic

JOB_LABEL = "mmt.job"
_CLI_TIMEOUT_S = 60.0


@dataclass(frozen=True)
class NodeContainer:
    """One simulated node's container: its name and the command that starts it."""

    runtime: str
    name: str
    node_rank: int
    run_argv: Tuple[str, ...]
    # how its runtime removes containers, as the backend that chose the runtime says: the flags with which one
    # ``rm -f`` removes them all, even when some are gone already; None (not said): each is removed alone
    remove_flags: Optional[Tuple[str, ...]] = None


def start(containers: Sequence[NodeContainer]) -> Optional[str]:
    """Start every node's container at once; None when all started, else why the first failed (any that started
    are removed again)."""
    running = [
        (container, subprocess.Popen(container.run_argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE))
        for container in containers
    ]
    failures = []
    for container, process in running:
        _, err = process.communicate(timeout=_CLI_TIMEOUT_S)
        if process.returncode != 0:
            text = err.decode(errors="replace").strip().splitlines()
            failures.append(f"node {container.node_rank}'s container did not start: {text[-1] if text else ''}")
    if failures:
        remove(containers)
        return failures[0]
    return None


def remove(containers: Sequence[NodeContainer]) -> None:
    """Remove these containers now (killing what runs in them); one that is already gone is no error."""
    by_runtime: Dict[Tuple[str, Optional[Tuple[str, ...]]], List[str]] = {}
    for container in containers:
        by_runtime.setdefault((container.runtime, container.remove_flags), []).append(container.name)
    for (runtime, flags), names in by_runtime.items():
        _remove_names(runtime, names, flags)


def remove_labelled(runtime: str, job_id: str, remove_flags: Optional[Sequence[str]] = None) -> None:
    """Remove every container of this job, found by its label (a job whose supervisor is gone)."""
    try:
        listed = subprocess.run(
            [runtime, "ps", "-aq", "--filter", f"label={JOB_LABEL}={job_id}"],
            capture_output=True,
            text=True,
            timeout=_CLI_TIMEOUT_S,
        )
    except (OSError, subprocess.TimeoutExpired):
        return
    ids = listed.stdout.split()
    if ids:
        _remove_names(runtime, ids, remove_flags)


def _remove_names(runtime: str, names: List[str], remove_flags: Optional[Sequence[str]]) -> None:
    # with flags, one rm for all; without, one per name, all at once: a runtime's `rm -f a b` may remove none of
    # them when a is gone already (a node agent's container that removed itself, --rm)
    argvs = [[*remove_flags, *names]] if remove_flags is not None else [[name] for name in names]
    started = []
    for argv in argvs:
        try:
            started.append(
                subprocess.Popen([runtime, "rm", "-f", *argv], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            )
        except OSError:
            return  # no such runtime: nothing of it to remove
    deadline = time.monotonic() + _CLI_TIMEOUT_S
    for process in started:
        try:
            process.wait(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            process.kill()  # a runtime that hangs: the label still finds them at the next mmt list or stop
            process.wait()


def record(attempt: Attempt, containers: Sequence[NodeContainer]) -> None:
    """Note in the attempt dir which runtime holds the job's containers, and how it removes them (read by
    :func:`remove_recorded`)."""
    if containers:
        flags = containers[0].remove_flags
        noted = {"runtime": containers[0].runtime, "remove_flags": None if flags is None else list(flags)}
        write_atomic(attempt.containers, json.dumps(noted).encode())


def remove_recorded(attempt: Attempt, job_id: str) -> None:
    """Remove what an attempt recorded it ran in (its containers by label): for a job concluded from outside."""
    noted = read_json(attempt.containers)
    if isinstance(noted, dict) and isinstance(noted.get("runtime"), str):
        flags = noted.get("remove_flags")  # absent: noted by an older mmt
        remove_labelled(noted["runtime"], job_id, [str(f) for f in flags] if isinstance(flags, list) else None)
