"""``mmt list/logs/inspect/wait/stop/delete`` on the launcher's machine, for jobs that live on a cluster reached
over SSH (mmt.remote.known): the command runs there, through one connection, with the registry of the launches
made over SSH (``<root>/home``), its output streamed here as it comes; ``wait`` then brings the job's records into
its sweep dir here, ``delete`` forgets the job here too."""

import json
import subprocess
import sys
from typing import Any, Dict, List, Optional

from mmt.remote import known, results
from mmt.remote.connection import Connection
from mmt.remote.entry import HOME

# the verbs that name a job, and run where it lives
NAMED = ("inspect", "logs", "stop", "wait", "delete")


def _command(job: known.RemoteJob, argv: List[str]) -> List[str]:
    return ["env", f"MMT_HOME={job.root}/{HOME}", job.ssh.python, "-m", "mmt.cli.main", *argv]


def named(verb: str, name: str, argv: List[str], quiet: bool = False) -> Optional[int]:
    """Run ``argv`` where the job (or launch) ``name`` lives, on a cluster reached over SSH; its exit status.
    None: no job launched from here over SSH has that name."""
    jobs = known.named(name)
    if not jobs:
        return None
    job = jobs[0]
    connection = Connection(job.ssh)
    connection.open()
    try:
        out = subprocess.DEVNULL if quiet else None  # quiet: the SDK's call, which answers in values, not lines
        process = connection.popen(_command(job, argv), stdin=subprocess.DEVNULL, stdout=out, stderr=out)
        try:
            code = process.wait()
        except KeyboardInterrupt:
            process.wait()
            code = 130
        if code == 255:
            print(f"mmt: lost the connection to {job.ssh.label}", file=sys.stderr)
        if verb == "wait" and code != 255:
            results.fetch(connection, job.remote_sweep_dir, _local(job))
        if verb == "delete" and code == 0:
            for each in jobs:
                known.forget(each.name)
        return code
    finally:
        connection.close()


def captured(job: known.RemoteJob, argv: List[str]) -> "subprocess.CompletedProcess[bytes]":
    """``argv`` run where ``job`` lives, its output captured (the SDK's calls)."""
    connection = Connection(job.ssh)
    connection.open()
    try:
        return connection.run(_command(job, argv), timeout=None)
    finally:
        connection.close()


def _local(job: known.RemoteJob) -> Any:
    from pathlib import Path

    return Path(job.local_sweep_dir)


def listed(argv: List[str], as_json: bool) -> List[Dict[str, Any]]:
    """``mmt list`` on each cluster that has jobs launched from here: its rows (``--json``), or its table printed
    under a line naming the cluster."""
    rows: List[Dict[str, Any]] = []
    targets: Dict[str, known.RemoteJob] = {}
    for job in known.all_jobs():
        targets.setdefault(f"{job.ssh.label}|{job.root}", job)
    for job in targets.values():
        connection = Connection(job.ssh)
        try:
            connection.open()
        except Exception as exc:  # noqa: BLE001 - one cluster that cannot be reached is a line, not the end
            print(f"mmt: could not list the jobs on {job.ssh.label}: {exc}", file=sys.stderr)
            continue
        try:
            if as_json:
                done = connection.run(_command(job, argv), timeout=120)
                try:
                    found = json.loads(done.stdout or b"[]")
                except ValueError:
                    found = []
                for row in found:
                    row["host"] = job.ssh.label
                rows.extend(found)
            else:
                print(f"\nmmt: jobs on {job.ssh.label} (launched over SSH; {job.root}):", flush=True)
                connection.popen(_command(job, argv), stdin=subprocess.DEVNULL).wait()
        finally:
            connection.close()
    return rows
