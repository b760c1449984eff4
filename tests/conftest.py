"""Shared helpers: run the real app in a subprocess, read its results, and check the process table."""

import json
import os
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Dict, List, Optional

import pytest

REPO = Path(__file__).resolve().parents[1]
# Every process a test starts inherits this variable (the launcher passes it to every rank), so the process
# table can be searched for leftovers of exactly this test.
TAG_VAR = "LEFTOVER_TAG"


def tagged_pids(tag: str) -> List[int]:
    """Pids of live processes whose environment carries ``LEFTOVER_TAG=<tag>`` (zombies excluded)."""
    needle = f"{TAG_VAR}={tag}".encode()
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            if needle in (entry / "environ").read_bytes().split(b"\0"):
                if "\nState:\tZ" not in (entry / "status").read_text():
                    found.append(int(entry.name))
        except (FileNotFoundError, ProcessLookupError, PermissionError):
            continue
    return found


def wait_gone(tag: str, timeout_s: float = 10.0) -> List[int]:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        left = tagged_pids(tag)
        if not left:
            return []
        time.sleep(0.1)
    return tagged_pids(tag)


@pytest.fixture
def tag() -> str:
    """A unique tag; after the test, no process carrying it may be left running."""
    value = uuid.uuid4().hex
    yield value
    left = wait_gone(value)
    for pid in left:  # do not let one failure poison the next tests
        try:
            os.kill(pid, 9)
        except ProcessLookupError:
            pass
    assert not left, f"processes left behind: {left}"


def app_command(*overrides: str, sweep_dir: Path, multirun: bool = True) -> List[str]:
    args = [sys.executable, str(REPO / "train.py")]
    if multirun:
        args.append("-m")
    return args + [*overrides, f"hydra.sweep.dir={sweep_dir}"]


def app_env(tag: Optional[str] = None, **extra: str) -> Dict[str, str]:
    env = dict(os.environ, PYTHONUNBUFFERED="1", **extra)
    if tag:
        env[TAG_VAR] = tag
    return env


def run_app(*overrides: str, sweep_dir: Path, tag: Optional[str] = None, timeout: float = 300,
            multirun: bool = True, **extra_env: str) -> subprocess.CompletedProcess:
    """``python train.py -m <overrides>`` from the repo root, as a user would type it."""
    return subprocess.run(app_command(*overrides, sweep_dir=sweep_dir, multirun=multirun), cwd=REPO,
                          env=app_env(tag, **extra_env), capture_output=True, text=True, timeout=timeout)


def results(sweep_dir: Path) -> List[dict]:
    """Every job's result.json in the sweep, in job order."""
    found = [json.loads(p.read_text()) for p in sweep_dir.glob("*/result.json")]
    return sorted(found, key=lambda r: r["job"])


def job_dirs(sweep_dir: Path) -> List[Path]:
    return sorted(p for p in sweep_dir.iterdir() if p.is_dir() and p.name.isdigit()) if sweep_dir.exists() else []
