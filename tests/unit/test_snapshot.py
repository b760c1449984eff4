"""A launch's snapshot, piece by piece (real files, real git; docs/snapshots.md): what a project lists, what the store
makes of it and reuses, when a snapshot goes, how a process's paths move into it, and every setting's one-line
refusal. The whole launch, edits after it and every backend: tests/e2e/test_snapshot.py, test_slurm_snapshot.py."""

import os
import subprocess
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from mmt.core.errors import ConfigError
from mmt.core.snapshot import CodeSnapshot, remapped_path
from mmt.launching.snapshot import SnapshotSettings
from mmt.records.snapshot_files import excluded, list_project
from mmt.records.snapshot_store import SnapshotStore


def _git(root: Path, *args: str) -> None:
    subprocess.run(["git", "-C", str(root), *args], check=True, capture_output=True)


@pytest.fixture
def repo(tmp_path) -> Path:
    root = tmp_path / "repo"
    (root / "pkg").mkdir(parents=True)
    (root / "pkg" / "a.py").write_text("A = 1\n")
    (root / "run.sh").write_text("#!/bin/sh\n")
    (root / "run.sh").chmod(0o755)
    (root / ".gitignore").write_text("ignored/\n")
    _git(root, "init", "-q")
    _git(root, "add", "-A")
    _git(root, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "x")
    return root


def test_a_git_project_lists_tracked_and_untracked_files_as_they_are_on_disk(repo):
    (repo / "new.py").write_text("")  # untracked, not ignored: in
    (repo / "ignored").mkdir()
    (repo / "ignored" / "big.bin").write_text("x")  # ignored: out
    (repo / "pkg" / "a.py").unlink()  # a tracked file deleted: out, as the launch's tree has it
    (repo / "pkg" / "__pycache__").mkdir()
    (repo / "pkg" / "__pycache__" / "a.cpython-311.pyc").write_text("")
    project = list_project(str(repo / "pkg"), (), ())
    assert project.root == str(repo) and project.git and project.dirty and project.commit
    assert sorted(f.rel for f in project.files) == [".gitignore", "new.py", "run.sh"]
    assert next(f for f in project.files if f.rel == "run.sh").executable


def test_a_folder_without_git_is_walked_leaving_out_virtualenvs_the_sweep_dir_and_excludes(tmp_path):
    root = tmp_path / "app"
    for rel in ("app.py", "venv/pyvenv.cfg", "venv/lib/x.py", "multirun/1/result.json", "data/x.npy", "w.ckpt"):
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text("")
    project = list_project(str(root), ("data", "*.ckpt"), (str(root / "multirun" / "1"),))
    assert not project.git and not project.dirty and project.commit is None
    assert [f.rel for f in project.files] == ["app.py"]


def test_excludes_match_paths_and_names_and_folders_above_them():
    assert excluded("data/train/x.bin", ["data"]) and excluded("a/b/w.ckpt", ["*.ckpt"])
    assert excluded("notebooks/x.ipynb", ["notebooks/*.ipynb"]) and not excluded("src/x.ipynb", ["notebooks/*.ipynb"])
    assert excluded("pkg/.git/config", []) and excluded("pkg/mod.pyc", [])
    assert not excluded("database.py", ["data"])


def test_symlinks_inside_stay_links_and_one_that_leaves_is_refused_in_one_line(repo, tmp_path):
    os.symlink("pkg/a.py", repo / "rel")
    os.symlink(str(repo / "pkg"), repo / "abs")
    links = {f.rel: f.link for f in list_project(str(repo), (), ()).files if f.link}
    assert links == {"rel": "pkg/a.py", "abs": "pkg"}  # an absolute target inside becomes relative
    os.symlink("/etc", repo / "out")
    with pytest.raises(ConfigError, match=r"^Invalid hydra.launcher.snapshot='out': this symlink leaves the project"):
        list_project(str(repo), (), ())
    assert list_project(str(repo), ("out",), ()).files  # excluded: fine


def test_the_store_copies_once_links_the_rest_and_an_unchanged_project_makes_nothing_new(repo, tmp_path):
    store = SnapshotStore(tmp_path / "store")
    first, made = store.take(list_project(str(repo), (), ()))
    assert made and Path(first.root, "pkg", "a.py").read_text() == "A = 1\n"
    assert os.access(Path(first.root, "run.sh"), os.X_OK) and Path(first.root, "pkg", "a.py").stat().st_nlink == 2
    again, made = store.take(list_project(str(repo), (), ()))
    assert not made and again == first
    (repo / "pkg" / "a.py").write_text("A = 2\n")
    edited, made = store.take(list_project(str(repo), (), ()))
    assert made and edited.id != first.id and Path(edited.root, "pkg", "a.py").read_text() == "A = 2\n"
    assert Path(first.root, "pkg", "a.py").read_text() == "A = 1\n"  # the earlier snapshot is untouched
    assert Path(edited.root, "run.sh").stat().st_ino == Path(first.root, "run.sh").stat().st_ino  # one blob
    assert store.diff(edited).read_text().count("+A = 2") == 1 and not store.diff(first).exists()


def test_the_size_limit_names_the_largest_paths(repo):
    (repo / "weights").mkdir()
    (repo / "weights" / "w.bin").write_bytes(b"\0" * 2_000_000)
    with pytest.raises(ConfigError, match=r"largest: weights/w.bin \(2.0 MB\), .*HINT: exclude what the jobs"):
        SnapshotStore.check_size(list_project(str(repo), (), ()), 1.0)


def test_a_snapshot_goes_with_its_last_user_and_takes_its_unlinked_blobs(repo, tmp_path):
    store = SnapshotStore(tmp_path / "store")
    snapshot, _ = store.take(list_project(str(repo), (), ()))
    store.add_user(snapshot.id, "job-a")
    store.add_user(snapshot.id, "job-b")
    assert not store.release(snapshot.id, "job-a") and Path(snapshot.root).is_dir()
    assert store.release(snapshot.id, "job-b") and not Path(snapshot.root).exists()
    assert list((tmp_path / "store" / "blobs").glob("*/*")) == []


def test_paths_move_into_the_snapshot_only_where_it_has_them(tmp_path):
    live, snap = tmp_path / "live", tmp_path / "snap"
    for root in (live, snap):
        (root / "recipes").mkdir(parents=True)
    (live / ".venv" / "lib").mkdir(parents=True)
    snapshot = CodeSnapshot("x", str(snap), str(live), None, False, 1, 1, keep=(str(live / "kept"),))
    moved = remapped_path(snapshot, [str(live), str(live / "recipes"), str(live / ".venv" / "lib"), "/usr/lib"])
    assert moved == [str(snap), str(snap / "recipes"), str(live / ".venv" / "lib"), "/usr/lib"]
    assert snapshot.remap(str(live / "kept" / "mmt")) == str(live / "kept" / "mmt")


@pytest.mark.parametrize(
    "value, message",
    [
        (3, r"Invalid hydra.launcher.snapshot=3: expected true, false, or \{enabled, exclude, max_mb, dir\}"),
        ({"enabled": "yes"}, r"Invalid hydra.launcher.snapshot.enabled='yes': expected true or false"),
        ({"max_mb": -1}, r"Invalid hydra.launcher.snapshot.max_mb=-1: expected a number of megabytes > 0"),
        ({"exclude": [1]}, r"Invalid hydra.launcher.snapshot.exclude=\[1\]: expected a list of glob patterns"),
        ({"dir": ""}, r"Invalid hydra.launcher.snapshot.dir='': expected a directory"),
        ({"size": 1}, r"Invalid hydra.launcher.snapshot.size=1: expected one of"),
    ],
)
def test_each_bad_setting_is_one_line_naming_its_key(value, message):
    with pytest.raises(ConfigError, match=message):
        SnapshotSettings.of(OmegaConf.create({"snapshot": value}))


def test_settings_default_to_on_and_false_turns_them_off():
    assert SnapshotSettings.of(OmegaConf.create({})).enabled
    assert not SnapshotSettings.of(OmegaConf.create({"snapshot": False})).enabled
    given = SnapshotSettings.of(OmegaConf.create({"snapshot": {"exclude": "data/", "max_mb": 5}}))
    assert given.exclude == ("data",) and given.max_mb == 5.0 and given.dir is None


def test_an_app_under_the_interpreters_prefix_has_no_project():
    from mmt.launching.snapshot import app_dir

    assert app_dir(subprocess.run) is None  # the standard library: installed
    assert app_dir(test_an_app_under_the_interpreters_prefix_has_no_project) == str(Path(__file__).parent)
