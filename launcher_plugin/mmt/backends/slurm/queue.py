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
import re
import subprocess
import time
from dataclasses import dataclass, field
from typing import Dict, Iterable, List, Optional, Sequence

# states after which a job will not run again by itself (REQUEUED, PENDING, RUNNING ... are not final)
FINAL = (
    "COMPLETED",
    "FAILED",
    "CANCELLED",
    "TIMEOUT",
    "OUT_OF_MEMORY",
    "NODE_FAIL",
    "PREEMPTED",
    "BOOT_FAIL",
    "DEADLINE",
    "REVOKED",
    "SPECIAL_EXIT",
)
ACTIVE = (
    "PENDING",
    "RUNNING",
    "CONFIGURING",
    "COMPLETING",
    "REQUEUED",
    "RESIZING",
    "SUSPENDED",
    "REQUEUE_HOLD",
    "REQUEUE_FED",
    "SIGNALING",
    "STAGE_OUT",
    "STOPPED",
)
# no longer queued, and no record (accounting is off)
GONE = "GONE"


@dataclass(frozen=True)
class SlurmState:
    """What SLURM says of one job (squeue, or sacct once it left the queue): its own words, not mmt's JobState."""

    state: str  # first word of SLURM's state: "CANCELLED by 0" -> CANCELLED
    exit_code: Optional[str] = None  # sacct's "code:signal"
    restarts: int = 0
    # why a PENDING job waits, as squeue says it ("Resources", "ReqNodeNotAvail, UnavailableNodes:node2" ...)
    reason: Optional[str] = None

    @property
    def final(self) -> bool:
        return self.state in FINAL or self.state == GONE


def ask(args: list, env: Optional[Dict[str, str]] = None, timeout_s: float = 30) -> Optional[str]:
    # a session of its own: the terminal's Ctrl-C, sent to the launcher's whole process group, must not kill the
    # scancel that the launcher runs because of that Ctrl-C
    try:
        done = subprocess.run(args, capture_output=True, text=True, timeout=timeout_s, start_new_session=True, env=env)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return done.stdout if done.returncode == 0 else None


_ARRAY_TASKS = re.compile(r"^(\d+)_\[([0-9,\-]+)(?:%\d+)?\]$")


# a component of a heterogeneous job (a job with roles): <leader id>+<offset>
_HET_COMPONENT = re.compile(r"^(\d+)\+(\d+)$")


def job_ids_in(field: str) -> List[str]:
    """The job ids one row of squeue or sacct stands for: a job array's tasks that have not started yet are one row
    (``453_[2-5%2]``, ``453_[1,4-6]``), each task by its own id (``453_2`` ...). A heterogeneous job's components
    (``453+0``, ``453+1``) are the job by its leader's id: its first component, where its batch script runs, stands
    for it (the others none)."""
    component = _HET_COMPONENT.match(field)
    if component is not None:
        return [component.group(1)] if component.group(2) == "0" else []
    match = _ARRAY_TASKS.match(field)
    if match is None:
        return [field]
    array, ids = match.group(1), []
    for part in match.group(2).split(","):
        first, _, last = part.partition("-")
        ids += [f"{array}_{index}" for index in range(int(first), int(last or first) + 1)]
    return ids


def compact_ids(job_ids: Sequence[str]) -> List[str]:
    """Job ids as few as SLURM takes them: the tasks of one job array as ranges (``456_[0-3,7]``), one request for
    scancel instead of one per task; plain job ids as they are."""
    arrays: Dict[str, List[int]] = {}
    plain: List[str] = []
    for job_id in job_ids:
        array, _, index = job_id.partition("_")
        if index.isdigit():
            arrays.setdefault(array, []).append(int(index))
        else:
            plain.append(job_id)
    return plain + [f"{array}_[{index_ranges(indices)}]" for array, indices in arrays.items()]


def index_ranges(numbers: Iterable[int]) -> str:
    """Numbers as SLURM writes them: ``0-99``, ``0-3,8,10-11``."""
    ordered = sorted(set(numbers))
    runs, start = [], 0
    for at, number in enumerate(ordered):
        if at + 1 == len(ordered) or ordered[at + 1] != number + 1:
            runs.append(f"{ordered[start]}-{number}" if number > ordered[start] else str(number))
            start = at + 1
    return ",".join(runs)


def _sacct(ids: list) -> Optional[Dict[str, SlurmState]]:
    # a job array's tasks that never started are only listed under the array's own id: as a range (``711_[2-999%2]``)
    # or, once the array has ended, as the array's own record (``711``), which stands for every task not listed
    arrays = sorted({job_id.split("_", 1)[0] for job_id in ids if "_" in job_id})
    out = ask(["sacct", "-X", "-n", "-P", "-D", "-j", ",".join([*ids, *arrays]), "-o", "JobID,State,ExitCode"])
    if out is None:
        return None
    found: Dict[str, SlurmState] = {}
    asked = set(ids)
    unlisted: Dict[str, SlurmState] = {}  # an array's own record: its tasks that have no record of their own
    for line in out.splitlines():
        parts = line.split("|")
        if len(parts) < 3:
            continue
        if parts[0] in arrays and parts[0] not in asked:
            unlisted[parts[0]] = SlurmState(parts[1].split()[0] if parts[1] else "PENDING", parts[2])
            continue
        for job_id in job_ids_in(parts[0]):
            if job_id not in asked:
                continue
            previous = found.get(job_id)
            restarts = (previous.restarts + 1) if previous else 0  # -D lists every run of a requeued job
            found[job_id] = SlurmState(parts[1].split()[0] if parts[1] else "PENDING", parts[2], restarts)
    for job_id in asked - set(found):
        array = job_id.split("_", 1)[0]
        if "_" in job_id and array in unlisted:
            found[job_id] = unlisted[array]
    return found


def restart_count(job_id: str) -> Optional[int]:
    """How often SLURM has requeued the job so far (``scontrol show job``'s Restarts), None when it cannot say. A
    requeue (``scontrol requeue``, preemption, a node failure) raises it before the batch script's EXIT trap runs,
    while that run's own ``SLURM_RESTART_COUNT`` keeps the old value."""
    out = ask(["scontrol", "show", "job", "-o", job_id])
    match = re.search(r"\bRestarts=(\d+)", out or "")
    return int(match.group(1)) if match else None


def max_array_size() -> Optional[int]:
    """The cluster's MaxArraySize (a job array's indices are below it), None when SLURM cannot be asked."""
    out = ask(["scontrol", "show", "config"], timeout_s=QUERY_TIMEOUT_S)
    match = re.search(r"^MaxArraySize\s*=\s*(\d+)", out or "", re.M)
    return int(match.group(1)) if match else None


def partition_names() -> Optional[List[str]]:
    """The cluster's partitions (sinfo), the default one first, None when SLURM cannot be asked."""
    out = ask(["sinfo", "-h", "-o", "%P"], timeout_s=QUERY_TIMEOUT_S)
    if out is None:
        return None
    names = list(dict.fromkeys(line.strip() for line in out.splitlines() if line.strip()))
    return [name.rstrip("*") for name in sorted(names, key=lambda name: not name.endswith("*"))]


# squeue's columns: no width (the whole value, a long reason included), each ended by "|"
SQUEUE_FORMAT = "JobArrayID:|,State:|,RestartCnt:|,Reason:|"  # a job array's task: <array id>_<index>


def parse_squeue(out: str) -> Dict[str, SlurmState]:
    """``squeue -O SQUEUE_FORMAT`` output, by job id. The reason is kept for a PENDING job only (an ended job keeps
    the last one SLURM gave it, a running one says "None")."""
    found: Dict[str, SlurmState] = {}
    for line in out.splitlines():
        parts = [part.strip() for part in line.split("|")]
        if len(parts) >= 3 and parts[0]:
            reason = parts[3] if len(parts) > 3 and parts[1] == "PENDING" and parts[3] not in ("", "None") else None
            state = SlurmState(parts[1], None, int(parts[2]) if parts[2].isdigit() else 0, reason)
            found.update((job_id, state) for job_id in job_ids_in(parts[0]))
    return found


# a watching launcher asks the queue every poll: a slurmctld that does not answer (stopped, overloaded) must cost it
# seconds, not scancel's and squeue's own minute of retries, so that a Ctrl-C is acted on and a notice says why
QUERY_TIMEOUT_S = 8.0


def _squeue(ids: list) -> Optional[Dict[str, SlurmState]]:
    # -t all: a job that just ended is still listed (COMPLETING, CANCELLED ...) for MinJobAge
    out = ask(["squeue", "-h", "-t", "all", "-j", ",".join(ids), "-O", SQUEUE_FORMAT], timeout_s=QUERY_TIMEOUT_S)
    return None if out is None else parse_squeue(out)


@dataclass(frozen=True)
class Answer:
    """What one query of SLURM told: the state of every job it could tell, and which daemon did not answer."""

    states: Dict[str, SlurmState] = field(default_factory=dict)
    # "slurmctld": the queue (squeue) did not answer; "slurmdbd": the queue did, without a job, and accounting
    # (sacct) did not; None: both answered what was asked
    unanswered: Optional[str] = None


def job_states(job_ids: Iterable[str], accounting: bool = True) -> Dict[str, SlurmState]:
    """The state of every job the queries could tell; a job whose state is unknown right now is left out."""
    return query(job_ids, accounting).states


def query(job_ids: Iterable[str], accounting: bool = True) -> Answer:
    """The state of every job the queries could tell (a job whose state is unknown right now is left out), and
    which of SLURM's daemons did not answer."""
    ids = list(job_ids)
    if not ids:
        return Answer()
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
            states[job_id] = SlurmState(GONE)
    unanswered = "slurmctld" if queued is None else "slurmdbd" if accounting and ended and accounted is None else None
    return Answer(states, unanswered)


def latest_job_named(name: str, submitted_since: float) -> Optional[str]:
    """This user's newest job called ``name`` submitted at ``submitted_since`` or later (whole seconds: not an older
    job that had the same name); "" when there is none, None when the queue did not answer. A job array is named by
    its own id (``%F``), not by one of its tasks'."""
    out = ask(
        ["squeue", "-h", "-t", "all", "-u", getpass.getuser(), "-n", name, "-o", "%F|%V"],
        env={**os.environ, "SLURM_TIME_FORMAT": "standard"},
        timeout_s=QUERY_TIMEOUT_S,
    )
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
    return ask(["sacct", "-n", "-X", "-S", "now", "-o", "JobID"]) is not None


# scancel waits and retries for as long as slurmctld does not answer (a minute when it is stopped): a launcher
# that stops a job asks again instead, saying so, and stays responsive
CANCEL_TIMEOUT_S = 5.0


def cancel(job_ids: Iterable[str], signal_name: Optional[str] = None) -> bool:
    """Whether slurmctld took the cancel (False: it did not answer, or scancel failed; ask again)."""
    ids = list(job_ids)
    if not ids:
        return True
    args = ["scancel", *([f"--signal={signal_name}", "--full"] if signal_name else []), *ids]
    return ask(args, timeout_s=CANCEL_TIMEOUT_S) is not None


# ------------------------------------------------------------------------------------------ a job and its partition


_FIELD_NAME = re.compile(r"^[A-Za-z][A-Za-z0-9/:_]*$")  # NumNodes, CPUs/Task, AllocNode:Sid


def parse_fields(out: str) -> Dict[str, str]:
    """``scontrol show <kind> -o``'s one line as ``{key: value}``. A value may hold spaces (``Reason=ReqNodeNotAvail,
    UnavailableNodes:node2``, a command's arguments): a word without ``=`` belongs to the value before it."""
    fields: Dict[str, str] = {}
    key = None
    for word in out.split():
        name, sep, value = word.partition("=")
        if sep and _FIELD_NAME.match(name):
            key = name
            fields[key] = value
        elif key is not None:
            fields[key] += " " + word
    return fields


def job_facts(job_id: str) -> Optional[Dict[str, str]]:
    """What SLURM holds of the job (``scontrol show job -o``: NumNodes, NumCPUs, MinMemoryNode, TimeLimit, Partition,
    Account, QOS ...); None when it cannot be asked."""
    out = ask(["scontrol", "show", "job", "-o", job_id])
    return parse_fields(out.splitlines()[0]) if out and out.strip() else None


def partition_facts(name: str) -> Optional[Dict[str, str]]:
    """The partition's settings (``scontrol show partition -o``: TotalNodes, TotalCPUs, MaxNodes, MaxTime, Nodes,
    AllowAccounts ...); None when it cannot be asked."""
    out = ask(["scontrol", "show", "partition", "-o", name])
    return parse_fields(out.splitlines()[0]) if out and out.strip() else None


# sinfo's node groups: nodes, CPUs, memory (MB), generic resources; one line per distinct kind of node
SINFO_FORMAT = "%D|%c|%m|%G"


@dataclass(frozen=True)
class NodeKind:
    """Nodes of a partition that are alike (``sinfo -e``): how many, their CPUs, memory in MB, generic resources."""

    count: int
    cpus: str
    memory_mb: str
    gres: Optional[str] = None


def parse_sinfo(out: str) -> List[NodeKind]:
    kinds: Dict[NodeKind, int] = {}
    for line in out.splitlines():
        parts = [part.strip() for part in line.split("|")]
        if len(parts) < 4 or not parts[0].isdigit():
            continue
        kind = NodeKind(0, parts[1], parts[2], None if parts[3] in ("", "(null)") else parts[3])
        kinds[kind] = kinds.get(kind, 0) + int(parts[0])  # the same kind in several states: one group
    return [NodeKind(count, kind.cpus, kind.memory_mb, kind.gres) for kind, count in kinds.items()]


def node_kinds(partition: str) -> Optional[List[NodeKind]]:
    """The kinds of node the partition has; None when SLURM cannot be asked."""
    out = ask(["sinfo", "-h", "-e", "-p", partition, "-o", SINFO_FORMAT])
    return None if out is None else parse_sinfo(out)


def default_partition() -> Optional[str]:
    """The partition a job goes to when it names none (sinfo marks it with ``*``); None when there is none."""
    out = ask(["sinfo", "-h", "-o", "%P"])
    return next((line.strip().rstrip("*") for line in (out or "").splitlines() if line.strip().endswith("*")), None)
