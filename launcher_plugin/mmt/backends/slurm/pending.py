"""Why a SLURM job waits in the queue, and whether it can ever start.

SLURM gives every pending job a reason (squeue's ``REASON``; ``scontrol show job``'s ``Reason=``). Most resolve by
waiting: nodes free up (``Resources``), jobs of higher priority go first (``Priority``), the jobs it depends on end
(``Dependency``), its start time comes (``BeginTime``), a drained node or a down partition comes back (an
administrator's doing: ``ReqNodeNotAvail``, ``NodeDown``, ``PartitionDown``), a hold is released (``JobHeldUser``,
``JobHeldAdmin``), other jobs of the same user, account or QOS end (``AssocMaxJobsLimit``, ``QOSGrpCpuLimit`` and
every other *group* or *per-user* limit). mmt shows those and waits.

Others never resolve by waiting: on every pass slurmctld checks the job against its partition (``PartitionConfig``,
``PartitionNodeLimit``, ``PartitionTimeLimit``: a job that asks more nodes, CPUs or time than the partition has or
allows, or an account or QOS the partition does not allow), against its account and QOS (``InvalidAccount``,
``InvalidQOS``, ``AccountNotAllowed``, ``QOSNotAllowed``, and every per-job or per-node maximum, or minimum, of its
QOS or association, e.g. ``QOSMaxNodePerJobLimit``, ``AssocMaxWallDurationPerJobLimit``, ``QOSMinCpuNotSatisfied``,
``MaxMemPerLimit``), against its constraints (``BadConstraints``), its dependencies (``DependencyNeverSatisfied``: a
job it depends on ended in a way that cannot satisfy it) and its reservation (``ReservationDeleted``,
``ReservationInvalid``), and keeps it queued while it does not fit: forever, unless someone changes the cluster's
configuration. Such a job is cancelled at once and reported FAILED with one line: what it asks and what its
partition offers. ``PartitionNodeLimit`` is the one reason SLURM also gives while nodes the job needs are down or
drained (squeue's manual says so): it counts as never only when the job asks more nodes than the partition has or
allows (or fewer than it requires).
"""

import re
from dataclasses import dataclass
from typing import Dict, List, Optional

from mmt.backends.slurm import queue

# reasons that never resolve by waiting, and what they mean
NEVER: Dict[str, str] = {
    "PartitionConfig": "the partition can never fit it: more CPUs, memory or nodes than it has, or an account, QOS "
    "or group it does not allow",
    "PartitionNodeLimit": "it asks more nodes than the partition has or allows per job, or fewer than it requires",
    "PartitionTimeLimit": "its time limit is longer than the partition allows",
    "BadConstraints": "no node of the partition has what its constraints ask",
    "InvalidAccount": "its account is not valid",
    "InvalidQOS": "its QOS is not valid",
    "AccountNotAllowed": "the partition does not allow its account",
    "QOSNotAllowed": "the partition does not allow its QOS",
    "DependencyNeverSatisfied": "a job it depends on ended in a way that can never satisfy the dependency",
    "ReservationDeleted": "its reservation was deleted",
    "ReservationInvalid": "its reservation is not valid",
    "MaxMemPerLimit": "the memory it asks is more than the partition allows per node or per CPU",
}
# a per-job or per-node maximum (or any minimum) of the job's QOS or association: QOSMaxNodePerJobLimit,
# AssocMaxCpuPerJobLimit, QOSMaxMemoryPerNode, QOSMaxCpuMinutesPerJobLimit, QOSMinCpuNotSatisfied, QOSMinGRES ...
# (group and per-user limits, QOSGrp*, AssocGrp*, *PerUser*, *PerAccount, AssocMaxJobsLimit, resolve as other jobs end)
_PER_JOB_LIMIT = re.compile(r"^(QOS|Assoc)Max\w*Per(Job|Node)(Limit)?$|^QOSMin\w+$")

# the reasons a job array's task waits for its own array's throttle (hydra.launcher.max_parallel_jobs): not news
THROTTLED = ("JobArrayTaskLimit",)

# reasons that resolve by waiting (or by someone's hand: a hold released, a node resumed), and what they mean
WAITS: Dict[str, str] = {
    "Resources": "the nodes it needs are busy",
    "Priority": "jobs of higher priority go first",
    "Dependency": "it waits for the jobs it depends on",
    "JobArrayTaskLimit": "its job array runs as many of its tasks at once as it may (hydra.launcher.max_parallel_jobs)",
    "BeginTime": "its start time has not come yet",
    "JobHeldUser": "held by its user: scontrol release <job id>",
    "JobHeldAdmin": "held by an administrator",
    "JobHoldMaxRequeue": "held after too many requeues: scontrol release <job id>",
    "ReqNodeNotAvail": "a node it needs is down, drained, reserved or in use",
    "NodeDown": "a node it needs is down",
    "PartitionDown": "its partition is down",
    "PartitionInactive": "its partition is inactive",
    "Reservation": "it waits for its reservation",
    "Licenses": "it waits for licenses",
    "Cleaning": "a previous run is still being cleaned up",
    "Prolog": "its prolog is running",
    "AssocMaxJobsLimit": "its association runs as many jobs as it may; it starts when one ends",
    "AssociationJobLimit": "its association runs as many jobs as it may; it starts when one ends",
    "AssociationResourceLimit": "its association uses all the resources it may; it starts when some are freed",
    "QOSJobLimit": "its QOS runs as many jobs as it may; it starts when one ends",
    "QOSResourceLimit": "its QOS uses all the resources it may; it starts when some are freed",
}


def reason_code(reason: Optional[str]) -> str:
    """The reason's first word: ``ReqNodeNotAvail, UnavailableNodes:node2`` -> ``ReqNodeNotAvail``."""
    return (reason or "").split(",")[0].strip()


def never_resolves(reason: Optional[str]) -> bool:
    """Whether SLURM's reason alone says the job cannot start by waiting (see the module's doc)."""
    code = reason_code(reason)
    return code in NEVER or bool(_PER_JOB_LIMIT.match(code))


def explain(reason: Optional[str]) -> Optional[str]:
    """The reason in words; None for one mmt does not know (it is shown as SLURM gives it)."""
    code = reason_code(reason)
    if code in NEVER:
        return NEVER[code]
    if code in WAITS:
        return WAITS[code]
    if _PER_JOB_LIMIT.match(code):
        whose = "QOS" if code.startswith("QOS") else "association"
        return f"it asks more than its {whose} allows per job or node, or less than it requires"
    if "Grp" in code or "PerUser" in code or "PerAccount" in code:
        return "a limit its QOS or association shares with other jobs; it starts when some of them end"
    return None


def describe(reason: str) -> str:
    """``Resources (the nodes it needs are busy)``; an unknown reason as SLURM gives it."""
    words = explain(reason)
    return f"{reason} ({words})" if words else reason


# ------------------------------------------------------------------------------------------------ the verdict


@dataclass(frozen=True)
class Facts:
    """What SLURM holds of a job and of its partition (None: it could not be asked)."""

    job: Optional[Dict[str, str]]
    partition: Optional[Dict[str, str]]
    kinds: Optional[List[queue.NodeKind]]

    @property
    def partition_name(self) -> Optional[str]:
        name = (self.job or {}).get("Partition") or (self.partition or {}).get("PartitionName")
        return name.split(",")[0] if name else None


def gather(job_id: str) -> Facts:
    """``scontrol show job``, then its partition (``scontrol show partition``, ``sinfo``)."""
    job = queue.job_facts(job_id)
    name = (job or {}).get("Partition", "").split(",")[0]
    if not name:
        return Facts(job, None, None)
    return Facts(job, queue.partition_facts(name), queue.node_kinds(name))


# a dependency that can no longer be met: a job that waits for mmt jobs (hydra.launcher.after) is submitted with
# --kill-on-invalid-dep, so SLURM cancels it itself, and it ends CANCELLED naming the job that failed (not FAILED)
DEPENDENCY_FAILED = "DependencyNeverSatisfied"


def check(job_id: str, reason: Optional[str], waits_for_jobs: bool = False) -> Optional[str]:
    """The one line that says why the job can never start; None when it may still start, or when SLURM cancels it
    itself (``waits_for_jobs``: a dependency that failed). Asks SLURM about the job and its partition only for a
    reason that never resolves."""
    if not never_resolves(reason) or (waits_for_jobs and reason_code(reason) == DEPENDENCY_FAILED):
        return None
    return verdict(job_id, reason or "", gather(job_id))


def verdict(job_id: str, reason: str, facts: Facts) -> Optional[str]:
    """:func:`check` on facts already gathered (pure)."""
    if not never_resolves(reason):
        return None
    if reason_code(reason) == "PartitionNodeLimit" and _within_node_limits(facts):
        return None  # what SLURM also says while nodes the job needs are down or drained: they may come back
    return message(job_id, reason, facts)


def _count(text: Optional[str]) -> Optional[int]:
    """The first number of ``3``, ``3-3``, ``2-4`` (NumNodes), None for UNLIMITED or nothing."""
    match = re.match(r"\s*(\d+)", text or "")
    return int(match.group(1)) if match else None


def _within_node_limits(facts: Facts) -> bool:
    """The job's node count fits the partition's (so PartitionNodeLimit is about nodes down); False when unknown."""
    if facts.job is None or facts.partition is None:
        return False
    asked = _count(facts.job.get("NumNodes"))
    total = _count(facts.partition.get("TotalNodes"))
    most = _count(facts.partition.get("MaxNodes"))
    least = _count(facts.partition.get("MinNodes")) or 0
    if asked is None or total is None:
        return False
    return least <= asked <= total and (most is None or asked <= most)


def _set(value: Optional[str]) -> bool:
    return bool(value) and value not in ("(null)", "N/A", "None", "0", "NONE")


def _plural(count: Optional[str], word: str) -> str:
    return f"{count} {word}" + ("" if count in ("1", "1-1") else "s")


def asks(job: Dict[str, str], code: str) -> str:
    """What the job asks, in SLURM's own terms: ``3 nodes, 12 CPUs (3 tasks x 4 CPUs), time limit 01:00:00``."""
    nodes = job.get("NumNodes", "?")
    low, _, high = nodes.partition("-")
    parts = [_plural(low if high in ("", low) else nodes, "node")]
    cpus, tasks, per_task = job.get("NumCPUs"), job.get("NumTasks"), job.get("CPUs/Task")
    if cpus:
        parts.append(f"{cpus} CPUs" + (f" ({tasks} tasks x {per_task} CPUs)" if tasks and per_task else ""))
    if _set(job.get("MinMemoryNode")):
        parts.append(f"{job['MinMemoryNode']} memory per node")
    if _set(job.get("MinMemoryCPU")):
        parts.append(f"{job['MinMemoryCPU']} memory per CPU")
    for key, label in (("TresPerNode", "per node"), ("TresPerJob", "in all")):
        if _set(job.get(key)):
            parts.append(f"{job[key]} {label}")
    if _set(job.get("TimeLimit")) and (job["TimeLimit"] != "UNLIMITED" or code == "PartitionTimeLimit"):
        parts.append(f"time limit {job['TimeLimit']}")
    for key, label in (
        ("Features", "constraint"),
        ("ReqNodeList", "nodes"),
        ("ExcNodeList", "not nodes"),
        ("Account", "account"),
        ("QOS", "QOS"),
        ("Reservation", "reservation"),
    ):
        if _set(job.get(key)):
            parts.append(f"{label} {job[key]}")
    if code.startswith("Dependency") and _set(job.get("Dependency")):
        parts.append(f"dependency {job['Dependency']}")
    return ", ".join(parts)


def offers(name: str, partition: Optional[Dict[str, str]], kinds: Optional[List[queue.NodeKind]]) -> str:
    """What the partition offers: ``2 nodes (node[1-2]) of 4 CPUs and 24105 MB, 8 CPUs in all, no time limit``."""
    if partition is None:
        names = queue.partition_names()
        if names is not None and name not in names:
            listed = ", ".join(names) or "none"
            return f"no partition {name} on this cluster (hydra.launcher.partition={name}; it has: {listed})"
        return f"partition {name}: its settings could not be read (scontrol show partition {name})"
    total = partition.get("TotalNodes", "?")
    head = f"partition {name} offers {_plural(total, 'node')}"
    if _set(partition.get("Nodes")):
        head += f" ({partition['Nodes']})"
    if kinds:
        shapes = []
        for kind in kinds:
            shape = f"{kind.cpus} CPUs and {kind.memory_mb} MB" + (f" and {kind.gres}" if kind.gres else "")
            shapes.append(shape if len(kinds) == 1 else f"{kind.count} of {shape}")
        head += (" of " if len(kinds) == 1 else ": ") + "; ".join(shapes)
    parts = [head]
    if _set(partition.get("TotalCPUs")):
        parts.append(f"{partition['TotalCPUs']} CPUs in all")
    if _count(partition.get("MaxNodes")) is not None:
        parts.append(f"at most {partition['MaxNodes']} nodes per job")
    if (_count(partition.get("MinNodes")) or 0) > 1:
        parts.append(f"at least {partition['MinNodes']} nodes per job")
    max_time = partition.get("MaxTime")
    if max_time:
        parts.append("no time limit" if max_time == "UNLIMITED" else f"time limit {max_time}")
    for key in ("MaxCPUsPerNode", "MaxMemPerNode", "MaxMemPerCPU"):
        if _set(partition.get(key)) and partition[key] != "UNLIMITED":
            parts.append(f"{key}={partition[key]}")
    for key in ("AllowAccounts", "DenyAccounts", "AllowQos", "DenyQos", "AllowGroups"):
        if _set(partition.get(key)) and partition[key] != "ALL":
            parts.append(f"{key}={partition[key]}")
    if _set(partition.get("State")) and partition["State"] != "UP":
        parts.append(f"State={partition['State']}")
    return ", ".join(parts)


_HINTS = {
    "PartitionTimeLimit": "lower timeout_min, or choose another partition (hydra.launcher.partition)",
    "InvalidAccount": "set hydra.launcher.account to an account you have (sacctmgr show assoc user=$USER)",
    "AccountNotAllowed": "set hydra.launcher.account to one the partition allows, or choose another partition",
    "InvalidQOS": "set hydra.launcher.qos to a QOS you have (sacctmgr show assoc user=$USER)",
    "QOSNotAllowed": "set hydra.launcher.qos to one the partition allows, or choose another partition",
    "DependencyNeverSatisfied": "submit it again without that dependency (hydra.launcher.sbatch_extra)",
}
HINT = (
    "ask for what the partition has (num_nodes, machine, hydra.launcher.cpus_per_task / mem_gb / "
    "gpus_per_node), or choose another partition (hydra.launcher.partition; sinfo lists them)"
)


def message(job_id: str, reason: str, facts: Facts) -> str:
    """One line: the job, SLURM's reason and what it means, what the job asks, what its partition offers, a hint."""
    code = reason_code(reason)
    text = f"SLURM job {job_id} can never start, so mmt cancelled it: {describe(reason)}"
    if facts.job is not None:
        text += f"; it asks {asks(facts.job, code)}"
    name = facts.partition_name
    if name:
        text += f"; {offers(name, facts.partition, facts.kinds)}"
    return f"{text}. HINT: {_HINTS.get(code, HINT)}"
