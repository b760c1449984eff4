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
from typing import Dict, Iterable, List, Optional

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


def _sacct(ids: list) -> Optional[Dict[str, SlurmState]]:
    out = ask(["sacct", "-X", "-n", "-P", "-D", "-j", ",".join(ids), "-o", "JobID,State,ExitCode"])
    if out is None:
        return None
    found: Dict[str, SlurmState] = {}
    for line in out.splitlines():
        parts = line.split("|")
        if len(parts) < 3 or parts[0] not in ids:
            continue
        previous = found.get(parts[0])
        restarts = (previous.restarts + 1) if previous else 0  # -D lists every run of a requeued job
        found[parts[0]] = SlurmState(parts[1].split()[0] if parts[1] else "PENDING", parts[2], restarts)
    return found


def restart_count(job_id: str) -> Optional[int]:
    """How often SLURM has requeued the job so far (``scontrol show job``'s Restarts), None when it cannot say. A
    requeue (``scontrol requeue``, preemption, a node failure) raises it before the batch script's EXIT trap runs,
    while that run's own ``SLURM_RESTART_COUNT`` keeps the old value."""
    out = ask(["scontrol", "show", "job", "-o", job_id])
    match = re.search(r"\bRestarts=(\d+)", out or "")
    return int(match.group(1)) if match else None


def partition_names() -> Optional[List[str]]:
    """The cluster's partitions (sinfo), the default one first, None when SLURM cannot be asked."""
    out = ask(["sinfo", "-h", "-o", "%P"], timeout_s=QUERY_TIMEOUT_S)
    if out is None:
        return None
    names = list(dict.fromkeys(line.strip() for line in out.splitlines() if line.strip()))
    return [name.rstrip("*") for name in sorted(names, key=lambda name: not name.endswith("*"))]


# squeue's columns: no width (the whole value, a long reason included), each ended by "|"
SQUEUE_FORMAT = "JobID:|,State:|,RestartCnt:|,Reason:|"


def parse_squeue(out: str) -> Dict[str, SlurmState]:
    """``squeue -O SQUEUE_FORMAT`` output, by job id. The reason is kept for a PENDING job only (an ended job keeps
    the last one SLURM gave it, a running one says "None")."""
    found = {}
    for line in out.splitlines():
        parts = [part.strip() for part in line.split("|")]
        if len(parts) >= 3 and parts[0]:
            reason = parts[3] if len(parts) > 3 and parts[1] == "PENDING" and parts[3] not in ("", "None") else None
            found[parts[0]] = SlurmState(parts[1], None, int(parts[2]) if parts[2].isdigit() else 0, reason)
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
    job that had the same name); "" when there is none, None when the queue did not answer."""
    out = ask(
        ["squeue", "-h", "-t", "all", "-u", getpass.getuser(), "-n", name, "-o", "%i|%V"],
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
