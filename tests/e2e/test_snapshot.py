"""The code that runs is the code you launched (docs/snapshots.md), on cluster=local: a Hydra app of its own in a
git repo, whose jobs wait at a gate while the test edits, adds and deletes its files (as `git checkout` of another
branch does), then import them late. Every job, the queued one and a restart included, returns the values of the
code as launched, with the uncommitted edit made before the launch; with snapshots off, the same test sees the
edits (the control that shows the test can fail)."""

import json
import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from helpers.processes import TAG_VAR, wait_until
from helpers.snapshot_app import LAUNCHED, app_run, edit_after_launch, git, make_app, results

LOCAL = ("hydra/launcher=mmt_local", "hydra.launcher.metrics_interval_s=0")
MMT = str(Path(sys.executable).with_name("mmt"))


@pytest.fixture
def app(tmp_path) -> Path:
    return make_app(tmp_path / "project")


@pytest.fixture
def store(tmp_path) -> Path:
    return tmp_path / "store"


def _launch_edit_and_open(app: Path, store: Path, tag: str, *overrides: str) -> subprocess.Popen:
    """Launch; once job 0 waits at its gate, edit the tree, then open the gate."""
    gate = app.parent / "gate"
    process = app_run(app, *LOCAL, f"gate={gate}", f"hydra.launcher.snapshot.dir={store}", *overrides, tag=tag)
    wait_until(lambda: (app.parent / "started.0.0").exists() or process.poll() is not None, 120, "job 0 at its gate")
    assert process.poll() is None, (app.parent / "out.txt").read_text()[-3000:]
    edit_after_launch(app)
    gate.touch()
    assert process.wait(timeout=180) == 0, (app.parent / "out.txt").read_text()[-3000:]
    return process


def _expect_launched(value: dict, app: Path, snapshot_dir: str) -> None:
    assert {k: value[k] for k in LAUNCHED} == LAUNCHED, value
    assert value["data"] == "data as launched"  # Path(__file__).parent / "data.txt": the snapshot's copy
    assert value["app_dir"] == snapshot_dir and value["late_file"] == f"{snapshot_dir}/late.py"
    assert value["snapshot_dir"] == snapshot_dir
    # what a job still reads from the live directory: Hydra's original cwd, and paths made absolute against it
    assert value["original_cwd"] == str(app) and value["absolute"] == str(app / "data.txt")


def test_a_queued_job_and_a_running_one_run_the_code_as_launched(app, store, tag):
    _launch_edit_and_open(app, store, tag, "x=0,1", "hydra.launcher.max_parallel_jobs=1")
    first, second = results(app / "multirun" / os.listdir(app / "multirun")[0] / os.listdir(_day(app))[0])
    snapshot = first["snapshot"]
    assert second["snapshot"] == snapshot  # one snapshot for the launch
    assert snapshot["commit"] == git(app, "rev-parse", "HEAD").strip() and snapshot["dirty"] is True
    assert snapshot["source"] == str(app) and Path(snapshot["dir"]).parent == store / "trees"
    for result in (first, second):
        assert result["status"] == "COMPLETED"
        _expect_launched(result["return_value"], app, snapshot["dir"])
    # the uncommitted diff is kept with the job, owner-only; the sweep dir is not in it
    job_dir = _sweep(app) / "0"
    diff = (job_dir / "snapshot.diff").read_text()
    assert '+VALUE = "uncommitted at launch"' in diff and "multirun" not in diff
    assert stat.S_IMODE((job_dir / "snapshot.diff").stat().st_mode) == 0o600
    assert json.loads((job_dir / "snapshot.json").read_text())["id"] == snapshot["id"]
    # the snapshot holds the project, not its sweep dir nor .git; its files are read-only
    tree = Path(snapshot["dir"])
    assert sorted(p.name for p in tree.iterdir()) == sorted(
        [".gitignore", "app.py", "conf", "data.txt", "gone_later.py", "late.py", "tools"]
    )
    assert not os.access(tree / "late.py", os.W_OK) or os.geteuid() == 0
    assert stat.S_IMODE((tree / "late.py").stat().st_mode) == 0o444


def test_with_snapshots_off_the_jobs_run_the_live_tree(app, store, tag):
    _launch_edit_and_open(app, store, tag, "hydra.launcher.snapshot.enabled=false")
    [result] = results(_sweep(app))
    value = result["return_value"]
    assert value["late"] == "edited after the launch" and value["gone"] is None and value["added"] is True
    assert "snapshot" not in result and not store.exists()


def test_a_restart_after_an_edit_runs_the_launched_code(app, store, tag):
    _launch_edit_and_open(
        app, store, tag, "fail_once=true", "hydra.launcher.max_restarts=1", "hydra.launcher.restart_backoff_s=0"
    )
    [result] = results(_sweep(app))
    assert result["status"] == "COMPLETED" and result["restarts"] == 1, result
    _expect_launched(result["return_value"], app, result["snapshot"]["dir"])


def test_a_detached_job_runs_the_launched_code(app, store, tag):
    gate = app.parent / "gate"
    env = {"MMT_HOME": str(app.parent / "home")}
    done = subprocess.run(
        [sys.executable, "app.py", "-m", *LOCAL, f"gate={gate}", f"hydra.launcher.snapshot.dir={store}"]
        + ["hydra.launcher.detach=true", "hydra.launcher.name=snap"],
        cwd=app,
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    wait_until(lambda: (app.parent / "started.0.0").exists(), 120, "the detached job at its gate")
    edit_after_launch(app)
    gate.touch()
    waited = subprocess.run([MMT, "wait", "snap-0"], env={**os.environ, **env}, capture_output=True, text=True)
    assert waited.returncode == 0, waited.stdout + waited.stderr
    [result] = results(_sweep(app))
    _expect_launched(result["return_value"], app, result["snapshot"]["dir"])
    # mmt inspect and the live page say which code the job ran
    shown = subprocess.run([MMT, "inspect", "snap-0"], env={**os.environ, **env}, capture_output=True, text=True)
    head = git(app, "rev-parse", "HEAD").strip()
    code = f"code          snapshot {result['snapshot']['id']} of {app} (commit {head} + uncommitted changes"
    assert code in shown.stdout, shown.stdout
    from mmt.dashboard.data import job_detail

    assert job_detail("snap-0", _sweep(app) / "0")["code"] == result["snapshot"]


def test_an_unchanged_project_reuses_its_snapshot_and_it_goes_with_its_last_job(app, store, tag):
    gate = app.parent / "gate"
    gate.touch()
    env = {"MMT_HOME": str(app.parent / "home")}
    for sweep in ("a", "b"):
        process = app_run(
            app,
            *LOCAL,
            f"gate={gate}",
            f"hydra.launcher.snapshot.dir={store}",
            f"hydra.launcher.name=run-{sweep}",
            f"hydra.sweep.dir={app / 'multirun' / sweep}",
            tag=tag,
            **env,
        )
        assert process.wait(timeout=180) == 0, (app.parent / "out.txt").read_text()[-3000:]
    [a], [b] = results(app / "multirun" / "a"), results(app / "multirun" / "b")
    assert a["snapshot"]["id"] == b["snapshot"]["id"]  # nothing changed: the same tree, made once
    tree = Path(a["snapshot"]["dir"])
    blobs = list((store / "blobs").glob("*/*"))
    assert len(blobs) == 8 and (tree / "late.py").stat().st_nlink == 2  # a hard link to its blob
    mmt = [MMT, "delete", "-y"]
    gone = subprocess.run([*mmt, "run-a-0"], env={**os.environ, **env}, capture_output=True, text=True)
    assert gone.returncode == 0 and "snapshot" not in gone.stdout and tree.is_dir(), gone.stdout + gone.stderr
    gone = subprocess.run([*mmt, "run-b-0"], env={**os.environ, **env}, capture_output=True, text=True)
    assert gone.returncode == 0, gone.stderr
    assert f"snapshot {a['snapshot']['id']} removed" in gone.stdout
    assert not tree.exists() and list((store / "blobs").glob("*/*")) == []


def test_the_dry_run_says_which_snapshot_the_jobs_will_run_and_copies_nothing(app, store, tag):
    process = app_run(
        app,
        *LOCAL,
        f"gate={app.parent / 'gate'}",
        f"hydra.launcher.snapshot.dir={store}",
        "hydra.launcher.dry_run=true",
        tag=tag,
    )
    assert process.wait(timeout=120) == 0
    out = (app.parent / "out.txt").read_text()
    head = git(app, "rev-parse", "HEAD").strip()[:12]
    line = next(line for line in out.splitlines() if line.startswith("  code "))
    assert f"of {app} (commit {head} + uncommitted changes; 8 files, 0.0 MB) in {store}/trees/" in line, out
    assert not (store / "trees").exists()


def _symlink_out(app: Path, store: Path) -> list:
    os.symlink("/etc/hostname", app / "hostname")
    return [f"hydra.launcher.snapshot.dir={store}"]


def _too_big(app: Path, store: Path) -> list:
    (app / "weights.bin").write_bytes(b"\0" * 3_000_000)
    return [f"hydra.launcher.snapshot.dir={store}", "hydra.launcher.snapshot.max_mb=2"]


def _store_not_writable(app: Path, store: Path) -> list:
    store.write_text("a file, not a dir")
    return [f"hydra.launcher.snapshot.dir={store}/inside"]


@pytest.mark.parametrize(
    "setup, expected",
    [
        (
            _symlink_out,
            "Invalid hydra.launcher.snapshot='hostname': this symlink leaves the project (hostname -> /etc/",
        ),
        (_too_big, "over the snapshot's limit of 2 MB; largest: weights.bin (3.0 MB), "),
        (_store_not_writable, "the snapshot store cannot be written"),
        (lambda app, store: ["hydra.launcher.snapshot.max_mb=abc"], "Invalid hydra.launcher.snapshot.max_mb='abc'"),
        (
            lambda app, store: ["hydra.launcher.snapshot.exclude=3"],
            "Invalid hydra.launcher.snapshot.exclude=3: expected a list of glob patterns",
        ),
    ],
    ids=["symlink-out", "too-big", "store-not-writable", "max-mb", "exclude"],
)
def test_a_snapshot_that_cannot_be_made_is_one_line_and_nothing_starts(app, store, tag, setup, expected):
    overrides = setup(app, store)
    process = app_run(app, *LOCAL, f"gate={app.parent / 'gate'}", *overrides, tag=tag)
    assert process.wait(timeout=120) != 0
    out = (app.parent / "out.txt").read_text()
    first = out.strip().splitlines()[0]
    assert expected in first and "HINT: " in first, out
    assert "Traceback" not in out and "HYDRA_FULL_ERROR" in out.strip().splitlines()[-1], out  # Hydra's own hint
    sweeps = list((app / "multirun").glob("*/*")) if (app / "multirun").exists() else []
    assert not any(p.name.isdigit() for sweep in sweeps for p in sweep.iterdir()), "a job dir was made"
    assert not (store / "trees").exists() or list((store / "trees").iterdir()) == []


def test_a_full_disk_is_one_line_and_leaves_no_partial_snapshot(app, tmp_path, tag):
    if os.geteuid() != 0:
        pytest.skip("mounting a small tmpfs (a full disk) needs root")
    small = tmp_path / "small"
    small.mkdir()
    (app / "big.txt").write_bytes(os.urandom(200_000))
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=128k", "tmpfs", str(small)], check=True)
    try:
        process = app_run(app, *LOCAL, f"gate={app.parent / 'gate'}", f"hydra.launcher.snapshot.dir={small}", tag=tag)
        assert process.wait(timeout=120) != 0
        out = (app.parent / "out.txt").read_text()
        assert "the launch's snapshot could not be made: the disk that holds it is full" in out, out
        assert "Traceback" not in out
        assert not list((small / "trees").glob("*")) and not list((small / "blobs").glob("*/.incoming.*"))
    finally:
        subprocess.run(["umount", str(small)], check=False)


def test_excluded_paths_ignored_files_and_virtualenvs_stay_out(app, store, tag):
    (app / "data").mkdir()
    (app / "data" / "big.npy").write_bytes(b"x" * 100)
    (app / "notes.ckpt").write_text("x")
    (app / "ignored.log").write_text("x")
    (app / ".gitignore").write_text("multirun/\noutputs/\n*.log\n")
    (app / "venv").mkdir()
    (app / "venv" / "pyvenv.cfg").write_text("home = /usr\n")
    (app / "venv" / "lib.py").write_text("x")
    (app.parent / "gate").touch()
    process = app_run(
        app,
        *LOCAL,
        f"gate={app.parent / 'gate'}",
        f"hydra.launcher.snapshot.dir={store}",
        "hydra.launcher.snapshot.exclude=[data,'*.ckpt']",
        tag=tag,
    )
    assert process.wait(timeout=180) == 0, (app.parent / "out.txt").read_text()[-3000:]
    [result] = results(_sweep(app))
    names = {p.relative_to(result["snapshot"]["dir"]).as_posix() for p in Path(result["snapshot"]["dir"]).rglob("*")}
    assert "late.py" in names and "tools/util.py" in names
    assert not names & {"data", "data/big.npy", "notes.ckpt", "ignored.log", "venv", "venv/lib.py", "multirun"}


def _day(app: Path) -> Path:
    return app / "multirun" / os.listdir(app / "multirun")[0]


def _sweep(app: Path) -> Path:
    return _day(app) / os.listdir(_day(app))[0]


EDITABLE_APP = """
import time
from pathlib import Path

import hydra

import mypkg  # imported by the launcher too, from the live tree: its late submodule must not be


@hydra.main(version_base="1.3", config_path=None)
def main(cfg):
    gate = Path(cfg.gate)
    (gate.parent / "started").touch()
    while not gate.exists():
        time.sleep(0.05)
    from mypkg import late

    return {"late": late.VALUE, "file": late.__file__, "pkg": mypkg.__file__}


if __name__ == "__main__":
    main()
"""


@pytest.mark.parametrize("start_method", ["fork", "spawn"])
def test_a_package_installed_in_editable_mode_is_imported_from_the_snapshot(tmp_path, store, tag, start_method):
    """``pip install -e .`` of the project (setuptools' editable finder, not a path in sys.path), in a virtualenv of
    its own that sees mmt's environment: the package's modules come from the snapshot, not from where the finder
    points; in a rank forked from the agent (which inherited the launcher's import of the package) and in a fresh
    interpreter (start_method=spawn: the finder asked anew)."""
    venv, project = tmp_path / "venv", tmp_path / "project"
    base = Path(sys.base_prefix) / "bin" / "python3"  # a virtualenv of its own, made by the base interpreter
    subprocess.run([str(base), "-m", "venv", "--without-pip", str(venv)], check=True)
    site = next(venv.glob("lib/python3*/site-packages"))
    here = next(p for p in sys.path if p.endswith("site-packages") and Path(p).is_dir())
    (site / "zz_mmt_tests.pth").write_text(f"import site; site.addsitedir({here!r})\n")
    (project / "mypkg").mkdir(parents=True)
    (project / "pyproject.toml").write_text(
        '[build-system]\nrequires = ["setuptools>=64"]\nbuild-backend = "setuptools.build_meta"\n'
        '[project]\nname = "mypkg-snapshot-test"\nversion = "0.1"\n[tool.setuptools]\npackages = ["mypkg"]\n'
    )
    (project / "mypkg" / "__init__.py").write_text("")
    (project / "mypkg" / "late.py").write_text('VALUE = "as launched"\n')
    (project / "scripts").mkdir()
    (project / "scripts" / "app.py").write_text(EDITABLE_APP)  # not beside the package: only the finder finds it
    git(project, "init", "-q")
    python = str(venv / "bin" / "python")
    install = [python, "-m", "pip", "install", "-q", "--no-deps", "--no-build-isolation", "-e", str(project)]
    subprocess.run(install, check=True, capture_output=True)
    assert list(site.glob("__editable___mypkg_snapshot_test*finder.py")), "not setuptools' editable finder"
    gate = tmp_path / "gate"
    with open(tmp_path / "out.txt", "w") as out:
        process = subprocess.Popen(
            [python, "scripts/app.py", "-m", *LOCAL, f"+gate={gate}", f"hydra.launcher.snapshot.dir={store}"]
            + [f"hydra.launcher.start_method={start_method}"],
            cwd=project,
            env={**os.environ, TAG_VAR: tag},
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    wait_until(lambda: (tmp_path / "started").exists() or process.poll() is not None, 120, "the job at its gate")
    (project / "mypkg" / "late.py").write_text('VALUE = "edited after the launch"\n')
    gate.touch()
    assert process.wait(timeout=120) == 0, (tmp_path / "out.txt").read_text()[-3000:]
    [result] = results(next((project / "multirun").glob("*/*")))
    tree = result["snapshot"]["dir"]
    assert result["return_value"] == {
        "late": "as launched",
        "file": f"{tree}/mypkg/late.py",
        "pkg": f"{tree}/mypkg/__init__.py",
    }


def test_a_job_in_a_container_image_runs_the_code_as_launched(podman_image, app, store, tag):
    """The snapshot is mounted into every node's container at its own path, read-only: the ranks, forked in the
    image's Python, import the code as launched."""
    image = podman_image["image"]
    mount = f"hydra.launcher.container_mounts=[{app.parent}:{app.parent}]"  # the gate, beside the project
    _launch_edit_and_open(app, store, tag, f"hydra.launcher.image={image}", mount)
    [result] = results(_sweep(app))
    assert result["status"] == "COMPLETED", result
    _expect_launched(result["return_value"], app, result["snapshot"]["dir"])
