"""The snapshot store: each launch's copy of the project, content-addressed, shared by the launches that did not
change a file.

``<store>`` (``hydra.launcher.snapshot.dir``; default ``$MMT_HOME/snapshots``, private)::

    blobs/ab/abcd...        every file's content once, named by its SHA-256, read-only
    trees/<id>/             a snapshot: the project's files as hard links to their blobs (copies where the
                            filesystem has no hard links), symlinks as they were; <id> digests every path and content
    trees/<id>.json         what it is (the source, the commit, whether the tree was dirty, its size)
    trees/<id>.<commit>.diff  a launch's uncommitted changes against its commit (git's binary diff)
    users/<id>/<job id>     the jobs that run from it: a snapshot goes with the last of them (``mmt delete``)
    index/<source>.json     what each file's content was at its last launch, by its size, times and inode, so an
                            unchanged file is never read again

A launch of an unchanged project reads no file and writes nothing but its users' marks: its tree is the last one.
"""

import errno
import hashlib
import json
import os
import shutil
import stat
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Dict, Iterable, Optional, Tuple

from mmt.core.errors import ConfigError
from mmt.core.jobdir import make_private_dir, write_atomic
from mmt.core.snapshot import CodeSnapshot
from mmt.records.snapshot_files import KEY, Project, ProjectFile, largest

DIR_KEY = f"{KEY}.dir"
# a file changed this recently may change again within its timestamp's granularity: its content is not cached
RACY_S = 2.0
_CHUNK = 1 << 20


def _mb(size: int) -> str:
    return f"{size / 1e6:.1f} MB"


class SnapshotStore:
    def __init__(self, root: Path) -> None:
        self.root = Path(root)

    @property
    def trees(self) -> Path:
        return self.root / "trees"

    def tree(self, snapshot_id: str) -> Path:
        return self.trees / snapshot_id

    def users(self, snapshot_id: str) -> Path:
        return self.root / "users" / snapshot_id

    def check_writable(self) -> None:
        """One line before anything is copied when the store cannot be made or written."""
        existing = next(p for p in [self.root, *self.root.parents] if p.exists())
        if not existing.is_dir() or not os.access(existing, os.W_OK | os.X_OK):
            raise ConfigError(
                DIR_KEY,
                str(self.root),
                f"the snapshot store cannot be written ({existing} is not a writable directory)",
                "point hydra.launcher.snapshot.dir at a writable directory (on a filesystem every node mounts, "
                "for a cluster), or turn snapshots off: hydra.launcher.snapshot.enabled=false",
            )

    @staticmethod
    def check_size(project: Project, max_mb: float) -> None:
        size = project.size_bytes
        if size <= max_mb * 1e6:
            return
        biggest = ", ".join(f"{path} ({_mb(n)})" for path, n in largest(project))
        raise ConfigError(
            KEY,
            project.root,
            f"the project is {_mb(size)} in {len(project.files)} files, over the snapshot's limit of {max_mb:g} MB; "
            f"largest: {biggest}",
            "exclude what the jobs do not import (hydra.launcher.snapshot.exclude=[data,'*.ckpt']), add it to "
            ".gitignore, or raise hydra.launcher.snapshot.max_mb",
        )

    def identify(self, project: Project) -> CodeSnapshot:
        """The snapshot a launch of ``project`` would run from, copying nothing (a dry run's): its id as the index
        knows the files, a file it does not know read once."""
        indexed = _indexed(self._load_index(project.root), project)
        digests = {
            entry.rel: indexed.get(entry.rel) or _digest(project.root, entry)
            for entry in project.files
            if entry.link is None
        }
        return self._described(project, _tree_id(project.files, digests))

    def take(self, project: Project) -> Tuple[CodeSnapshot, bool]:
        """The project's snapshot, made now or found: (the snapshot, whether this call made its tree). A project
        whose files the index knows, and whose tree exists, reads no file and writes nothing."""
        make_private_dir(self.root)
        index = self._load_index(project.root)
        stamps = {entry.rel: entry.stamp for entry in project.files if entry.link is None}
        digests = _indexed(index, project)
        known = len(digests) == len(stamps)
        try:
            snapshot_id = _tree_id(project.files, digests) if known else ""
            made = not (known and self._complete(snapshot_id))
            if made:  # every file's blob, copied where the store lacks it, then the tree
                digests = {e.rel: self._blob(project.root, e, index) for e in project.files if e.link is None}
                snapshot_id = _tree_id(project.files, digests)
                made = not self._complete(snapshot_id)
                if made:
                    self._build(snapshot_id, project, digests)
            if not known or len(index) != len(stamps):  # an unchanged project's index stays as it is
                self._save_index(project.root, project.files, digests)
        except OSError as exc:
            raise _store_error(self.root, exc) from None
        snapshot = self._described(project, snapshot_id)
        if made:
            meta = {**snapshot.provenance(), "files": snapshot.files, "size_bytes": snapshot.size_bytes}
            write_atomic(self._meta(snapshot_id), json.dumps(meta, indent=1).encode(), private=True)
        if project.dirty and project.commit and not self.diff(snapshot).exists():
            self._save_diff(project, self.diff(snapshot))
        return snapshot, made

    def _described(self, project: Project, snapshot_id: str) -> CodeSnapshot:
        return CodeSnapshot(
            id=snapshot_id,
            root=str(self.tree(snapshot_id)),
            source=project.root,
            commit=project.commit,
            dirty=project.dirty,
            files=len(project.files),
            size_bytes=project.size_bytes,
        )

    def _complete(self, snapshot_id: str) -> bool:
        """A tree whose record was written after it: a tree without one is incomplete, never reused."""
        return self.tree(snapshot_id).is_dir() and self._meta(snapshot_id).exists()

    def diff(self, snapshot: CodeSnapshot) -> Path:
        """The uncommitted changes a launch of ``snapshot`` had against its commit (one tree may be launched from
        several commits: the same files committed, or not)."""
        return self.trees / f"{snapshot.id}.{snapshot.commit}.diff"

    def _meta(self, snapshot_id: str) -> Path:
        return self.trees / f"{snapshot_id}.json"

    # ---- users: a snapshot lives as long as a job that runs from it

    def add_user(self, snapshot_id: str, job_id: str) -> None:
        folder = self.users(snapshot_id)
        folder.mkdir(parents=True, exist_ok=True)
        (folder / job_id).touch()

    def release(self, snapshot_id: str, job_id: Optional[str]) -> bool:
        """Job ``job_id`` no longer uses the snapshot (None: nothing registered it); the snapshot is removed when no
        job does. Whether it was removed."""
        folder = self.users(snapshot_id)
        if job_id:
            (folder / job_id).unlink(missing_ok=True)
        if folder.is_dir() and any(folder.iterdir()):
            return False
        if folder.is_dir():
            folder.rmdir()
        self._meta(snapshot_id).unlink(missing_ok=True)  # first: a tree without it is incomplete, never reused
        _remove_tree(self.tree(snapshot_id))
        for diff in self.trees.glob(f"{snapshot_id}.*.diff"):
            diff.unlink(missing_ok=True)
        self._collect_blobs()
        return True

    def _collect_blobs(self) -> None:
        """Blobs no tree links any more (a copied tree never did: its blob goes as soon as it is unused here)."""
        for blob in (self.root / "blobs").glob("*/*"):
            try:
                if blob.stat().st_nlink <= 1:
                    blob.unlink()
            except FileNotFoundError:
                pass

    # ---- making one

    def _blob(self, source: str, entry: ProjectFile, index: Dict[str, list]) -> str:
        known = index.get(entry.rel)
        if known and tuple(known[0]) == entry.stamp and self._blob_path(known[1], entry.executable).exists():
            return str(known[1])
        blobs = self.root / "blobs"
        blobs.mkdir(exist_ok=True)
        digest = hashlib.sha256()
        fd, tmp = tempfile.mkstemp(dir=blobs, prefix=".incoming.")
        try:
            with os.fdopen(fd, "wb") as out, open(os.path.join(source, entry.rel), "rb") as src:
                while chunk := src.read(_CHUNK):
                    digest.update(chunk)
                    out.write(chunk)
            name = digest.hexdigest()
            target = self._blob_path(name, entry.executable)
            if target.exists():
                os.unlink(tmp)
            else:
                target.parent.mkdir(exist_ok=True)
                os.chmod(tmp, 0o555 if entry.executable else 0o444)
                os.replace(tmp, target)
            return name
        except PermissionError as exc:
            os.unlink(tmp)
            raise ConfigError(
                KEY,
                entry.rel,
                f"{exc.filename} cannot be read ({exc.strerror}), so it cannot be part of the snapshot",
                f"make it readable, or exclude it: hydra.launcher.snapshot.exclude=[{entry.rel}]",
            ) from None
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise

    def _blob_path(self, digest: str, executable: bool) -> Path:
        # an executable file's blob is another inode than the same content's plain one: a hard link shares its mode
        return self.root / "blobs" / digest[:2] / (digest + ("x" if executable else ""))

    def _build(self, snapshot_id: str, project: Project, digests: Dict[str, str]) -> None:
        self.trees.mkdir(exist_ok=True)
        building = Path(tempfile.mkdtemp(dir=self.trees, prefix=f".{snapshot_id}."))
        try:
            for entry in project.files:
                target = building / entry.rel
                target.parent.mkdir(parents=True, exist_ok=True)
                if entry.link is not None:
                    os.symlink(entry.link, target)
                    continue
                blob = self._blob_path(digests[entry.rel], entry.executable)
                _link_or_copy(blob, target, entry.executable)
            tree = self.tree(snapshot_id)
            if tree.exists():  # an incomplete one (its record missing), or another launch's twin: replaced
                _remove_tree(tree)
            os.rename(building, tree)
        except BaseException:
            _remove_tree(building)
            raise

    def _save_diff(self, project: Project, target: Path) -> None:
        """The launch's uncommitted changes: git's binary diff against HEAD of every tracked file, and of the untracked
        files the snapshot holds, through a copy of the index (the user's own index is never touched)."""
        source = project.root
        with tempfile.TemporaryDirectory(dir=self.root) as scratch:
            git_dir = subprocess.run(
                ["git", "-C", source, "rev-parse", "--git-dir"], capture_output=True, text=True, check=False
            ).stdout.strip()
            index_copy = os.path.join(scratch, "index")
            real_index = os.path.join(source, git_dir, "index")
            if os.path.exists(real_index):
                shutil.copyfile(real_index, index_copy)
            env = {**os.environ, "GIT_INDEX_FILE": index_copy}
            subprocess.run(["git", "-C", source, "add", "-u"], env=env, capture_output=True, check=False)
            listed = b"\0".join(os.fsencode(f.rel) for f in project.files)
            subprocess.run(
                ["git", "-C", source, "add", "--pathspec-from-file=-", "--pathspec-file-nul"],
                input=listed,
                env=env,
                capture_output=True,
                check=False,
            )
            done = subprocess.run(
                ["git", "-C", source, "diff", "--cached", "--binary", "HEAD"], env=env, capture_output=True
            )
            if done.returncode == 0:
                write_atomic(target, done.stdout, private=True)

    # ---- the index: what each file's content was, by its stamp

    def _index_path(self, source: str) -> Path:
        return self.root / "index" / (hashlib.sha256(source.encode()).hexdigest()[:24] + ".json")

    def _load_index(self, source: str) -> Dict[str, list]:
        try:
            data = json.loads(self._index_path(source).read_bytes())
        except (OSError, ValueError):
            return {}
        return data if isinstance(data, dict) else {}

    def _save_index(self, source: str, files: Iterable[ProjectFile], digests: Dict[str, str]) -> None:
        racy = (time.time() - RACY_S) * 1e9
        index = {f.rel: [list(f.stamp), digests[f.rel]] for f in files if f.link is None and f.stamp[1] < racy}
        write_atomic(self._index_path(source), json.dumps(index).encode(), private=True)


def _indexed(index: Dict[str, list], project: Project) -> Dict[str, str]:
    """The content digests the index still vouches for: each file whose size, times and inode are as it saw them."""
    return {
        entry.rel: str(index[entry.rel][1])
        for entry in project.files
        if entry.link is None and entry.rel in index and tuple(index[entry.rel][0]) == entry.stamp
    }


def _digest(source: str, entry: ProjectFile) -> str:
    digest = hashlib.sha256()
    with open(os.path.join(source, entry.rel), "rb") as handle:
        while chunk := handle.read(_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def _tree_id(files: Iterable[ProjectFile], digests: Dict[str, str]) -> str:
    digest = hashlib.sha256()
    for entry in sorted(files, key=lambda f: f.rel):
        what = f"link:{entry.link}" if entry.link is not None else f"{int(entry.executable)}:{digests[entry.rel]}"
        digest.update(f"{entry.rel}\0{what}\n".encode())
    return digest.hexdigest()[:16]


def _link_or_copy(blob: Path, target: Path, executable: bool) -> None:
    try:
        os.link(blob, target)
    except OSError as exc:  # another filesystem, no hard links, or too many links to one file
        if exc.errno not in (errno.EXDEV, errno.EPERM, errno.EMLINK, errno.ENOTSUP):
            raise
        shutil.copyfile(blob, target)
        os.chmod(target, 0o555 if executable else 0o444)


def _remove_tree(tree: Path) -> None:
    """A tree, its read-only files included (their folders are made writable first)."""
    if not tree.exists():
        return
    for folder, _dirs, _files in os.walk(tree):
        os.chmod(folder, stat.S_IRWXU)
    shutil.rmtree(tree, ignore_errors=True)


def _store_error(root: Path, exc: OSError) -> ConfigError:
    if exc.errno == errno.ENOSPC:
        why = f"the disk that holds it is full ({exc.filename or root})"
    else:
        why = f"it could not be written: {exc.strerror} ({exc.filename or root})"
    return ConfigError(
        DIR_KEY,
        str(root),
        f"the launch's snapshot could not be made: {why}; nothing was started",
        "free some space or point hydra.launcher.snapshot.dir elsewhere, or turn snapshots off: "
        "hydra.launcher.snapshot.enabled=false",
    )
