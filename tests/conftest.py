"""Fixtures and hooks for every tier: the tests' own MMT_HOME, the leftover-process check (``tag``), the SLURM test
cluster, the shared recipe package, and the tier markers. Helpers live in tests/helpers/ (``from helpers.x import``)."""

import os
import signal
import subprocess
import tempfile
import time
import uuid
from pathlib import Path

import pytest

from helpers.processes import CLUSTER_DRAIN_S, assert_none_left
from helpers.recipes import install_shared_recipes
from helpers.slurm import CLUSTER_SCRIPT, cluster_env, queued, why_no_cluster

# the job registry of every process the tests start: their own, not the user's ~/.mmt; with pytest-xdist (the
# README's `-n`), each worker's own, so that `mmt list` in one test never sees another worker's jobs
if "MMT_HOME" not in os.environ or (
    os.environ.get("PYTEST_XDIST_WORKER") and os.environ["MMT_HOME"] == os.environ.get("MMT_TESTS_HOME")
):
    os.environ["MMT_HOME"] = os.environ["MMT_TESTS_HOME"] = tempfile.mkdtemp(prefix="mmt-tests-home.")

# a test run started in the background (`pytest &`, nohup) inherits an ignored SIGINT, and so would every launcher
# the tests start, deaf to the Ctrl-C they send it: the tests' processes get the default disposition back
if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)

TESTS = Path(__file__).resolve().parent
# a test's tier is the folder it is in, and the marker it gets (pytest -m unit, -m "not e2e" ...)
TIERS = ("unit", "e2e", "conformance")


@pytest.hookimpl(tryfirst=True)  # before -m selects on the markers
def pytest_collection_modifyitems(config, items):
    """Mark each test with its tier (from its folder) and ``slurm`` when it needs the SLURM test cluster, so that
    no test has to say either."""
    for item in items:
        try:
            folder = item.path.relative_to(TESTS).parts[0]
        except ValueError:  # a test file given from outside tests/
            folder = None
        if folder in TIERS:
            item.add_marker(folder)
        fixtures = getattr(item, "fixturenames", ())
        if "slurm_cluster" in fixtures:
            item.add_marker("slurm")
        # under pytest-xdist (--dist loadgroup), the tests of one shared cluster run one after another on one worker:
        # they stop its daemons, count its queue and fill its nodes; the other tests run beside them. A parametrized
        # test that asks for the cluster only in its SLURM case carries the slurm marker alone.
        if "ray_cluster" in fixtures:
            item.add_marker(pytest.mark.xdist_group("ray_cluster"))
        elif item.get_closest_marker("slurm") is not None:
            item.add_marker(pytest.mark.xdist_group("slurm_cluster"))
    # the Ray tests last: their cluster starts with the first of them, and its daemons then never share the host's
    # two cores with the timing-sensitive tests of the other backends (in one process; pytest-xdist starts the
    # largest groups first)
    on_ray = [item for item in items if "ray_cluster" in getattr(item, "fixturenames", ())]
    if on_ray:
        items[:] = [item for item in items if "ray_cluster" not in getattr(item, "fixturenames", ())] + on_ray


@pytest.fixture
def tag(request) -> str:
    """A unique tag; after the test, no process carrying it may be left running.

    On a cluster the launcher returns once it has the job's result, without waiting for the allocation to drain: on
    SLURM the batch step and the ranks' interpreters end after it, on Ray the job's driver releases its actors and
    the raylets end their workers. There the wait is ``CLUSTER_DRAIN_S``: on a host loaded by the other test workers,
    a per-rank Lightning job's processes were still there 10 s after its launcher returned.
    """
    value = uuid.uuid4().hex
    yield value
    on_a_cluster = "ray_cluster" in request.fixturenames or request.node.get_closest_marker("slurm") is not None
    assert_none_left(value, CLUSTER_DRAIN_S if on_a_cluster else 10.0)


# ------------------------------------------------------------------------------------------------ SLURM cluster


@pytest.fixture(scope="session")
def slurm_cluster():
    """The project's SLURM test cluster on this host (three nodes: a 2-node job and a spare), started for the tests
    (and stopped if we started it).

    Skips where SLURM cannot run here (not root, no unshare); with MMT_REQUIRE_SLURM=1 (CI) it fails instead.
    """
    required = os.environ.get("MMT_REQUIRE_SLURM") == "1"
    why = why_no_cluster()
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
    env = cluster_env()
    os.environ.update(env)
    yield env
    # a job whose ranks all reported is concluded at once; SLURM may need a moment more for its epilog
    deadline = time.monotonic() + 15
    while True:
        leftover = queued()
        if not leftover or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    if started_here:
        subprocess.run([str(CLUSTER_SCRIPT), "stop"], capture_output=True, timeout=120)
    assert leftover == "", f"jobs left in the queue after the tests: {leftover}"


@pytest.fixture(autouse=True)
def _nothing_queued_after_a_slurm_test(request):
    """After every test on the SLURM cluster, no job of it may be queued or running (SLURM's epilog may take a
    moment after a job's ranks have all reported)."""
    yield
    if "slurm_cluster" not in request.fixturenames:
        return
    deadline = time.monotonic() + 15
    while queued() and time.monotonic() < deadline:
        time.sleep(0.5)
    left = queued()
    if left:
        subprocess.run(["scancel", "--full", *[line.split()[0] for line in left.splitlines()]], capture_output=True)
    assert left == "", f"jobs left in the queue after the test: {left}"


# ---------------------------------------------------------------------------------------- shared recipe package


@pytest.fixture(scope="session")
def shared_recipes(tmp_path_factory) -> Path:
    """The fixture recipe package (tests/fixtures/shared_recipes) installed into a fresh directory, as pip
    would install a shared recipe repo; put the returned path on PYTHONPATH to use it."""
    return install_shared_recipes(tmp_path_factory.mktemp("shared_recipes"))


# ------------------------------------------------------------------------------------------------ Ray cluster


@pytest.fixture(scope="session")
def ray_cluster():
    """The project's Ray test cluster on this host (scripts/ray_cluster.sh: a head and three workers, a 2-node job
    and a spare), started for the tests (and stopped if we started it); its address exported as
    RAY_API_SERVER_ADDRESS, which cluster=ray reads.

    Skips where Ray is not installed (scripts/setup_ray.sh) or its cluster cannot start here; with MMT_REQUIRE_RAY=1
    (CI) it fails instead."""
    import importlib.util

    required = os.environ.get("MMT_REQUIRE_RAY") == "1"
    script = str(TESTS.parent / "scripts" / "ray_cluster.sh")
    why = None
    if importlib.util.find_spec("ray") is None:
        why = "Ray is not installed here (scripts/setup_ray.sh installs it)"
    started_here = False
    if why is None and subprocess.run([script, "status"], capture_output=True).returncode != 0:
        start = subprocess.run([script, "start"], capture_output=True, text=True, timeout=300)
        started_here = True
        if start.returncode != 0:
            why = f"could not start the Ray test cluster: {start.stderr[-2000:]}"
    if why:
        if required:
            pytest.fail(f"Ray required (MMT_REQUIRE_RAY=1) but {why}")
        pytest.skip(why)
    out = subprocess.run([script, "env"], capture_output=True, text=True, check=True).stdout
    env = dict(line.removeprefix("export ").split("=", 1) for line in out.split("\n") if line.startswith("export "))
    os.environ.update(env)
    yield env
    if started_here:
        subprocess.run([script, "stop"], capture_output=True, timeout=120)


# ------------------------------------------------------------------------------------------------ container images


@pytest.fixture(scope="session")
def podman_image(tmp_path_factory) -> dict:
    """mmt's test image, built offline from this host's Python and venv by scripts/build_test_image.py (cached by
    content), the same rootfs without Python, and one of /bin/sh alone (no sleep, no python3):
    ``{"image": ..., "without_python": ..., "shell_only": ...}``.

    Podman here runs with runc and cgroupfs and without default ulimits (crun fails on this host's hybrid cgroups,
    and the default setrlimit fails in this sandbox): a test-only containers.conf, through CONTAINERS_CONF, which a
    user's machine does not need. Skips where podman or runc is not installed; with MMT_REQUIRE_CONTAINERS=1 (CI)
    it fails instead."""
    import shutil
    import sys

    required = os.environ.get("MMT_REQUIRE_CONTAINERS") == "1"
    missing = [tool for tool in ("podman", "runc") if shutil.which(tool) is None]
    if missing:
        why = f"{' and '.join(missing)} not installed (apt-get install podman runc)"
        if required:
            pytest.fail(f"containers required (MMT_REQUIRE_CONTAINERS=1) but {why}")
        pytest.skip(why)
    if "CONTAINERS_CONF" not in os.environ:
        conf = tmp_path_factory.mktemp("containers") / "containers.conf"
        conf.write_text('[containers]\ndefault_ulimits = []\n[engine]\ncgroup_manager = "cgroupfs"\nruntime = "runc"\n')
        os.environ["CONTAINERS_CONF"] = str(conf)
    script = str(TESTS.parent / "scripts" / "build_test_image.py")
    images = {}
    for key, extra in (("image", []), ("without_python", ["--without-python"]), ("shell_only", ["--shell-only"])):
        built = subprocess.run([sys.executable, script, *extra], capture_output=True, text=True, timeout=900)
        if built.returncode != 0:
            message = f"could not build the test image: {built.stderr[-2000:]}"
            if required:
                pytest.fail(message)
            pytest.skip(message)
        images[key] = built.stdout.strip().splitlines()[-1]
    return images


@pytest.fixture(scope="session")
def pypy_image(podman_image) -> str:
    """An image whose python3 is a real interpreter of another minor version than the launcher's: Debian's pypy3
    (bookworm's implements Python 3.9), packed by scripts/build_test_image.py --pypy. Skips where pypy3 is not
    installed (apt-get install pypy3); with MMT_REQUIRE_CONTAINERS=1 (CI) it fails instead."""
    import shutil
    import sys

    required = os.environ.get("MMT_REQUIRE_CONTAINERS") == "1"
    why = None
    if shutil.which("pypy3") is None:
        why = "pypy3 is not installed (apt-get install pypy3)"
    else:
        script = str(TESTS.parent / "scripts" / "build_test_image.py")
        built = subprocess.run([sys.executable, script, "--pypy"], capture_output=True, text=True, timeout=900)
        if built.returncode == 0:
            return built.stdout.strip().splitlines()[-1]
        why = f"could not build the pypy3 image: {built.stderr[-2000:]}"
    if required:
        pytest.fail(f"containers required (MMT_REQUIRE_CONTAINERS=1) but {why}")
    pytest.skip(why)
