"""The nodes of a SLURM job: its hosts in node order, and those SLURM holds lost (down, not responding).

A lost node is named wherever a job is concluded or requeued: SLURM's own account (``NODE_FAIL``, a requeue) says
that a node failed, not which one; ``sinfo`` says which of the run's nodes is down, since when and why.
"""

import re
import subprocess
from dataclasses import dataclass
from typing import Any, Dict, List, Optional, Sequence, Tuple

from mmt.backends.slurm.queue import QUERY_TIMEOUT_S, ask
from mmt.core.jobdir import Attempt
from mmt.planning.plan import JobPlan


def node_hosts(nodelist: str) -> List[str]:
    """Every host of the allocation in node order: ``scontrol show hostnames`` expands SLURM's compressed lists
    (node[1-2,5]); where scontrol cannot be run, :func:`expand_nodelist` does the same. A plain host name (a
    one-node job) is its own list: no scontrol on every task of a sweep of one-node jobs."""
    if nodelist and not any(mark in nodelist for mark in "[,"):
        return [nodelist]
    try:
        out = subprocess.run(
            ["scontrol", "show", "hostnames", nodelist], capture_output=True, text=True, timeout=30, check=True
        ).stdout
        hosts = out.split()
        if hosts:
            return hosts
    except (OSError, subprocess.SubprocessError):
        pass
    return expand_nodelist(nodelist)


def expand_nodelist(nodelist: str) -> List[str]:
    """SLURM's compressed host list, expanded: ``gpu[01-02,7],login1`` -> gpu01 gpu02 gpu7 login1 (ranges keep
    their zero padding; several bracket groups in one name multiply out, as scontrol's do)."""
    names: List[str] = []
    for item in re.findall(r"(?:[^,\[]+|\[[^\]]*\])+", nodelist):
        expanded = [""]
        for literal, group in re.findall(r"([^\[]*)(?:\[([^\]]*)\])?", item):
            options = [literal]
            if group:
                options = []
                for part in group.split(","):
                    low, _, high = part.partition("-")
                    if high and low.isdigit() and high.isdigit():
                        options += [literal + str(n).zfill(len(low)) for n in range(int(low), int(high) + 1)]
                    else:
                        options.append(literal + part)
            expanded = [head + tail for head in expanded for tail in options]
        names += [name for name in expanded if name]
    return names


@dataclass(frozen=True)
class LostNode:
    """A node SLURM holds lost: down, failed, or not responding (sinfo's state ends with ``*``)."""

    name: str
    state: str  # sinfo's long state: "down*", "idle*", "fail" ...
    reason: str  # SLURM's reason: "Not responding", "Kill task failed" ...
    since: Optional[str] = None  # when SLURM gave that reason: "2026-12-03T20:15:40"

    def describe(self) -> str:
        why = self.reason if self.reason and self.reason.lower() != "none" else f"state {self.state}"
        when = f" since {self.since[11:19]}" if self.since and len(self.since) >= 19 else ""
        return f"{self.name} ({why.lower()}{when})"


def held_lost(state: str) -> bool:
    """Does SLURM hold a node in ``state`` lost: down, failed, or not responding? Either spelling: sinfo's long
    state (``idle*``, ``down*``), or scontrol's (``IDLE+NOT_RESPONDING``, ``DOWN+NOT_RESPONDING``)."""
    flags = state.rstrip("*~#!%$@^-+").lower().split("+")  # scontrol: the base state, then its flags
    return state.endswith("*") or any(flag.startswith(("down", "fail", "not_responding")) for flag in flags)


def parse_sinfo_nodes(out: str) -> List[LostNode]:
    """``sinfo -h -N -o '%N|%T|%E|%H'`` output: the lost nodes, each once (a node is listed per partition)."""
    found: Dict[str, LostNode] = {}
    for line in out.splitlines():
        parts = [part.strip() for part in line.split("|")]
        if len(parts) >= 2 and parts[0] and held_lost(parts[1]):
            since = parts[3] if len(parts) > 3 and parts[3] not in ("", "Unknown") else None
            found.setdefault(parts[0], LostNode(parts[0], parts[1], parts[2] if len(parts) > 2 else "", since))
    return list(found.values())


def lost_nodes(nodelist: str) -> List[LostNode]:
    """The nodes of ``nodelist`` (SLURM's compressed form, node[1-2]) that SLURM holds lost now; none when it
    cannot say."""
    if not nodelist:
        return []
    out = ask(["sinfo", "-h", "-N", "-n", nodelist, "-o", "%N|%T|%E|%H"], timeout_s=QUERY_TIMEOUT_S)
    return parse_sinfo_nodes(out or "")


def run_nodes(job_id: str, run: Optional[int] = None) -> Optional[str]:
    """The nodes run ``run`` of the job had (sacct -D lists every run of a requeued job; None: the last run), None
    when unknown."""
    out = ask(["sacct", "-X", "-n", "-P", "-D", "-j", job_id, "-o", "JobID,NodeList"], timeout_s=QUERY_TIMEOUT_S)
    rows = [line.split("|")[1] for line in (out or "").splitlines() if line.split("|")[0] == job_id and "|" in line]
    index = len(rows) - 1 if run is None else run
    return rows[index] if 0 <= index < len(rows) and rows[index] not in ("", "None assigned") else None


def lost_in_run(plan: JobPlan, attempt: Attempt, lost: Sequence[LostNode], hosts: Sequence[str]) -> List[LostNode]:
    """The nodes SLURM holds lost that this run lost: of its hosts, and, where node agents ran, one whose agent never
    ended (its processes died with the node: a node that answers again late, or went down after the job, is not)."""
    agents = {node: attempt.agent(node) for node in range(plan.num_nodes)}
    unended = {str(record.get("host")) for record in agents.values() if record and "ended" not in record}
    watched = any(agents.values())
    return [node for node in lost if (not hosts or node.name in hosts) and (not watched or node.name in unended)]


def lost_by_run(job_id: str, run: Optional[int] = None) -> Tuple[List[LostNode], List[str]]:
    """The nodes SLURM holds lost now of run ``run`` of the job (None: its last), with that run's hosts in node
    order, from outside the job (accounting has each run's nodes)."""
    nodelist = run_nodes(job_id, run)
    if not nodelist:
        return [], []
    return lost_nodes(nodelist), node_hosts(nodelist)


def node_fail_kwargs(job_id: str, slurm_state: Optional[str]) -> Dict[str, Any]:
    """For a job SLURM ended NODE_FAIL: conclude's ``lost`` and ``hosts`` (its last run's)."""
    if slurm_state != "NODE_FAIL":
        return {}
    lost, hosts = lost_by_run(job_id)
    return {"lost": lost, "hosts": hosts}


def lost_node_detail(
    plan: JobPlan, attempt: Attempt, scheduler_id: str, lost: Sequence[LostNode], hosts: Sequence[str]
) -> str:
    """ "SLURM job 427 lost node2 (not responding since 20:17:50): node 1 of the job, ranks 2-3"."""
    hosts_by_node = {
        node: hosts[node] if node < len(hosts) else str((attempt.agent(node) or {}).get("host") or "")
        for node in range(plan.num_nodes)
    }
    parts = []
    for one in lost:
        where = [node for node, host in hosts_by_node.items() if host == one.name]
        if where:
            first, last = where[0] * plan.devices, (where[0] + 1) * plan.devices - 1
            ranks = f"rank {first}" if first == last else f"ranks {first}-{last}"
            parts.append(f"{one.describe()}: node {where[0]} of the job, {ranks}")
        else:
            parts.append(one.describe())
    return f"SLURM job {scheduler_id} lost " + "; ".join(parts)


def requeue_why(
    plan: Optional[JobPlan], attempt: Attempt, job_id: str, run: int, nodelist: Optional[str] = None
) -> str:
    """Why SLURM requeued run ``run`` of the job: the node it lost, named, where SLURM holds one of the run's nodes
    lost (``nodelist``: the run's nodes; from accounting when not given). Without the plan, by name alone."""
    lost, hosts = (lost_nodes(nodelist), node_hosts(nodelist)) if nodelist else lost_by_run(job_id, run)
    if lost and plan is not None:
        return f"{lost_node_detail(plan, attempt, job_id, lost, hosts)}; SLURM requeued it"
    if lost:
        return f"SLURM job {job_id} lost {', '.join(node.describe() for node in lost)}; SLURM requeued it"
    return f"SLURM requeued job {job_id} (scontrol requeue, preemption or a node failure)"
