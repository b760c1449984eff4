"""Registered jobs made by hand: a registry record and a job dir with logs, without running anything (what the CLI
and the SDK read back is all the test needs)."""

import time
from pathlib import Path
from typing import Dict, Optional

from mmt.core.jobdir import JobDir, process_log_name
from mmt.records.registry import JobRecord, Registry


def registered_job(
    home: Path,
    name: str,
    job_dir: Path,
    num_nodes: int = 1,
    devices: int = 1,
    command_mode: str = "per_rank",
    state: str = "COMPLETED",
    machine: str = "cpu",
    logs: Optional[Dict[int, str]] = None,
) -> JobRecord:
    """Register job ``name`` in the registry of ``home`` (``$MMT_HOME``), its dir ``job_dir`` holding ``logs``:
    rank (or, per-node command mode, node) -> text."""
    per_node = command_mode == "per_node"
    job = JobDir(job_dir)
    job.logs.mkdir(parents=True, exist_ok=True)
    for index, text in (logs or {}).items():
        node = index if per_node else index // devices
        (job.logs / process_log_name(node, index, per_node)).write_text(text)
    record = JobRecord(
        name=name,
        job_id=f"id-{name}",
        backend="local",
        job_dir=str(job_dir),
        sweep_dir=str(job_dir.parent),
        attempt="20260101T000000-abcdef",
        num_nodes=num_nodes,
        devices=devices,
        machine=machine,
        command="true",
        command_mode=command_mode,
        overrides=[],
        state=state,
        created_at=time.time(),
        started_at=time.time() - 1,
        ended_at=time.time(),
    )
    Registry(home / "registry.sqlite").add([record])
    return record
