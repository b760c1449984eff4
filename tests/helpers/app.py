"""The real app (train.py, tune.py) in a subprocess, as a user would type it, and what it leaves in its sweep dir."""

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Dict, List, Optional

from helpers.paths import REPO
from helpers.processes import TAG_VAR


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


def run_app(
    *overrides: str,
    sweep_dir: Path,
    tag: Optional[str] = None,
    timeout: float = 300,
    multirun: bool = True,
    **extra_env: str,
) -> subprocess.CompletedProcess:
    """``python train.py -m <overrides>`` from the repo root, as a user would type it."""
    return subprocess.run(
        app_command(*overrides, sweep_dir=sweep_dir, multirun=multirun),
        cwd=REPO,
        env=app_env(tag, **extra_env),
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def run_tune(*overrides: str, run_dir: Path, timeout: float = 300, **extra_env: str) -> subprocess.CompletedProcess:
    """``python tune.py <overrides>`` from the repo root, its Hydra run dir (trial logs) in ``run_dir``."""
    return subprocess.run(
        [sys.executable, str(REPO / "tune.py"), *overrides, f"hydra.run.dir={run_dir}"],
        cwd=REPO,
        env=app_env(None, **extra_env),
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def results(sweep_dir: Path) -> List[dict]:
    """Every job's result.json in the sweep, in job order."""
    found = [json.loads(p.read_text()) for p in sweep_dir.glob("*/result.json")]
    return sorted(found, key=lambda r: r["job"])


def job_dirs(sweep_dir: Path) -> List[Path]:
    return sorted(p for p in sweep_dir.iterdir() if p.is_dir() and p.name.isdigit()) if sweep_dir.exists() else []
