"""Where the jobs a job waits for (``hydra.launcher.after``) are: still going, completed, or ended otherwise. Read
from each one's own record (its ``result.json`` for that attempt), and, where none is there yet, from its registry
row brought up to date by its own backend (a job whose launcher was killed is concluded there)."""

from pathlib import Path
from typing import Optional, Sequence

from mmt.backends.base import Dependency
from mmt.backends.registry import backend_class
from mmt.core.states import JobState
from mmt.records.outcome import read_result
from mmt.records.registry import Registry, RegistryError, named
from mmt.records.schema import UnknownSchemaError


def dependency_state(dep: Dependency, registry: Optional[Registry] = None) -> Optional[JobState]:
    """The final state of the job ``dep`` names, or None while it has not ended."""
    try:
        result = read_result(Path(dep.job_dir))
    except UnknownSchemaError:  # a newer mmt concluded it: its registry row says how
        result = None
    if result is not None and result.concludes(dep.attempt):
        return result.status
    try:
        registry = registry or Registry()
        record = registry.get(dep.name)
        if record is None or record.attempt != dep.attempt:
            return JobState.CANCELLED if record is None else None  # deleted: it will never complete
        state = JobState(backend_class(record.backend).refresh(record, registry).state)
    except RegistryError:  # the registry cannot be read now: ask again later
        return None
    return state if state.final else None


def why_cancelled(dep: Dependency, state: JobState) -> str:
    return f"cancelled: it runs after {dep.name}, which ended {state.value} (hydra.launcher.after)"


def cancelled_because(entries: Sequence[str], registry: Optional[Registry] = None) -> str:
    """Why a job that waited for ``entries`` was cancelled: the first of those jobs that ended without completing,
    named; or, where the registry cannot tell, the entries themselves."""
    try:
        registry = registry or Registry()
        records = registry.list()
    except RegistryError:
        records = []
    for entry in entries:
        for record in named(entry, records):
            dep = Dependency(record.name, record.backend, record.job_dir, record.attempt, record.scheduler_id)
            state = dependency_state(dep, registry)  # its own result first: its row may not be up to date yet
            if state is not None and state != JobState.COMPLETED:
                return why_cancelled(dep, state)
    return f"cancelled: a job it runs after ({', '.join(entries)}: hydra.launcher.after) did not complete"
