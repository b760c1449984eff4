"""Shared helpers: run the real app in a subprocess, read its results, and check the process table."""

import contextlib
import json
import os
import signal
import shutil
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Dict, Iterator, List, Optional

import pytest

REPO = Path(__file__).resolve().parents[1]
# the job registry of every process the tests start: their own, not the user's ~/.mmt
os.environ.setdefault("MMT_HOME", tempfile.mkdtemp(prefix="mmt-tests-home."))
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


def wait_until(predicate, timeout_s: float, what: str):
    """The first truthy value of ``predicate()``, polled; the test fails naming ``what`` after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.1)
    pytest.fail(f"timed out waiting for {what}")


def wait_gone(tag: str, timeout_s: float = 10.0) -> List[int]:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        left = tagged_pids(tag)
        if not left:
            return []
        time.sleep(0.1)
    return tagged_pids(tag)


def from_a_terminal() -> None:
    """``preexec_fn`` for a launcher that the test signals as a terminal would: SIGINT, SIGHUP at default.

    A runner started under ``nohup``, or as a background job of a script, passes them on ignored, and mmt
    (like Python) leaves an ignored signal ignored.
    """
    for sig in (signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, signal.SIG_DFL)


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


# ------------------------------------------------------------------------------------------------ SLURM cluster

CLUSTER_SCRIPT = REPO / "scripts" / "slurm_cluster.sh"


def _cluster_env() -> Dict[str, str]:
    out = subprocess.run([str(CLUSTER_SCRIPT), "env"], capture_output=True, text=True, check=True).stdout
    name, value = out.strip().removeprefix("export ").split("=", 1)
    return {name: value}


@pytest.fixture(scope="session")
def slurm_cluster():
    """The project's two-node SLURM cluster on this host, started for the tests (and stopped if we started it).

    Skips where SLURM cannot run here (not root, no unshare); with MMT_REQUIRE_SLURM=1 (CI) it fails instead.
    """
    required = os.environ.get("MMT_REQUIRE_SLURM") == "1"
    why = None
    if os.geteuid() != 0:
        why = "the test cluster needs root (it starts slurmd in their own namespaces)"
    elif subprocess.run(["unshare", "--mount", "--uts", "true"], capture_output=True).returncode != 0:
        why = "unshare --mount --uts is not permitted here (the nodes need their own hostname)"
    if why:
        if required:
            pytest.fail(f"SLURM required (MMT_REQUIRE_SLURM=1) but {why}")
        pytest.skip(why)
    status = subprocess.run([str(CLUSTER_SCRIPT), "status"], capture_output=True, text=True)
    started_here = status.returncode != 0
    if started_here:
        start = subprocess.run([str(CLUSTER_SCRIPT), "start"], capture_output=True, text=True, timeout=600)
        if start.returncode != 0:
            message = f"could not start the SLURM test cluster: {start.stderr[-2000:]}"
            if required:
                pytest.fail(message)
            pytest.skip(message)
    env = _cluster_env()
    os.environ.update(env)
    yield env
    # a job whose ranks all reported is concluded at once; SLURM may need a moment more for its epilog
    deadline = time.monotonic() + 15
    while True:
        leftover = _queued()
        if not leftover or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    if started_here:
        subprocess.run([str(CLUSTER_SCRIPT), "stop"], capture_output=True, timeout=120)
    assert leftover == "", f"jobs left in the queue after the tests: {leftover}"


def _queued() -> str:
    return subprocess.run(["squeue", "-h", "-o", "%i %j %T"], capture_output=True, text=True).stdout.strip()


@pytest.fixture(autouse=True)
def _nothing_queued_after_a_slurm_test(request):
    """After every test on the SLURM cluster, no job of it may be queued or running (SLURM's epilog may take a
    moment after a job's ranks have all reported)."""
    yield
    if "slurm_cluster" not in request.fixturenames:
        return
    deadline = time.monotonic() + 15
    while _queued() and time.monotonic() < deadline:
        time.sleep(0.5)
    left = _queued()
    if left:
        subprocess.run(["scancel", "--full", *[line.split()[0] for line in left.splitlines()]], capture_output=True)
    assert left == "", f"jobs left in the queue after the test: {left}"


@contextlib.contextmanager
def tmpfs(path: Path, options: str) -> Iterator[Path]:
    """A tmpfs mounted on ``path`` for the block (a small disk, a read-only one); skips where it cannot be mounted."""
    path.mkdir(parents=True, exist_ok=True)
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(path)], capture_output=True, text=True)
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs ({options}) here: {done.stderr.strip()} (needs root)")
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], capture_output=True)


# ---------------------------------------------------------------------------------- tuner, shared recipe package


def run_tune(*overrides: str, run_dir: Path, timeout: float = 300, **extra_env: str) -> subprocess.CompletedProcess:
    """``python tune.py <overrides>`` from the repo root, its Hydra run dir (trial logs) in ``run_dir``."""
    return subprocess.run([sys.executable, str(REPO / "tune.py"), *overrides, f"hydra.run.dir={run_dir}"], cwd=REPO,
                          env=app_env(None, **extra_env), capture_output=True, text=True, timeout=timeout)


SHARED_RECIPES = REPO / "tests" / "fixtures" / "shared_recipes"
SHARED_SEARCHPATH = "hydra.searchpath=[pkg://mmt_shared_recipes.conf]"


@pytest.fixture(scope="session")
def shared_recipes(tmp_path_factory) -> Path:
    """The fixture recipe package (tests/fixtures/shared_recipes) installed into a fresh directory, as pip
    would install a shared recipe repo; put the returned path on PYTHONPATH to use it."""
    root = tmp_path_factory.mktemp("shared_recipes")
    source = root / "src"
    shutil.copytree(SHARED_RECIPES, source)  # pip builds in the source tree: keep the repo's copy clean
    site = root / "site"
    subprocess.run([sys.executable, "-m", "pip", "install", "--no-deps", "--no-build-isolation", "--no-input",
                    "--disable-pip-version-check", "--quiet", "--target", str(site), str(source)],
                   check=True, capture_output=True, text=True, timeout=120)
    return site
