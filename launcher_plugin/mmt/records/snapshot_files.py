"""What a launch's snapshot holds: the project that holds the app, listed once, before anything is copied.

The project is the git work tree that holds the app's file (tracked files, untracked files that ``.gitignore`` does
not exclude, submodules and nested repos), or the app's folder where there is no git. Never: ``.git``, Python's
caches, virtualenvs (a folder with ``pyvenv.cfg``), mmt's own ``.mmt``, the sweep and run dirs of the launch (the
top folder of each inside the project: ``multirun/``, ``outputs/``), and what ``hydra.launcher.snapshot.exclude``
names. Every refusal is a :class:`ConfigError` of one line, raised before anything is copied.
"""

import fnmatch
import os
import stat
import subprocess
from dataclasses import dataclass
from typing import Dict, List, Optional, Sequence, Tuple

from mmt.core.errors import ConfigError
from mmt.core.jobdir import PRIVATE

KEY = "hydra.launcher.snapshot"
EXCLUDE_KEY = f"{KEY}.exclude"
# never part of a snapshot, whatever the listing says (names of a path's components)
NEVER_NAMES = frozenset({".git", "__pycache__", PRIVATE, ".pytest_cache", ".mypy_cache", ".ruff_cache"})
NEVER_SUFFIXES = (".pyc", ".pyo")


@dataclass(frozen=True)
class ProjectFile:
    """One entry of the project: a regular file (``link`` None) or a symlink inside the project."""

    rel: str
    size: int
    executable: bool
    # what identifies the file's content without reading it again (the store's cache key)
    stamp: Tuple[int, int, int, int]
    link: Optional[str] = None


@dataclass(frozen=True)
class Project:
    root: str
    files: Tuple[ProjectFile, ...]
    commit: Optional[str]
    dirty: bool
    # git's toplevel (None: the app's folder, no git)
    git: bool

    @property
    def size_bytes(self) -> int:
        return sum(f.size for f in self.files)


def excluded(rel: str, patterns: Sequence[str]) -> bool:
    """Whether ``rel`` (or a folder above it) matches one of ``patterns`` (globs on the path relative to the project,
    or on a single name: ``data``, ``*.ckpt``, ``notebooks/*.ipynb``)."""
    parts = rel.split("/")
    if any(part in NEVER_NAMES for part in parts) or rel.endswith(NEVER_SUFFIXES):
        return True
    for i in range(1, len(parts) + 1):
        prefix, name = "/".join(parts[:i]), parts[i - 1]
        if any(fnmatch.fnmatchcase(prefix, p) or fnmatch.fnmatchcase(name, p) for p in patterns):
            return True
    return False


def list_project(app_dir: str, patterns: Sequence[str], skip_dirs: Sequence[str]) -> Project:
    """The project holding ``app_dir``, as a snapshot takes it. ``skip_dirs``: absolute folders never taken (the
    launch's sweep and run dirs)."""
    asked = _ask_git(app_dir)
    root = asked[0] if asked is not None else os.path.realpath(app_dir)
    skipped = {_top_inside(os.path.realpath(d), root) for d in skip_dirs} - {None}
    never = [*patterns, *sorted(s for s in skipped if s)]
    names, commit, dirty = asked[1:] if asked is not None else (_walk(root, never), None, False)
    venvs: Dict[str, bool] = {}
    files = []
    for rel in names:
        if excluded(rel, never) or _in_venv(root, rel, venvs):
            continue
        entry = _entry(root, rel)
        if entry is not None:
            files.append(entry)
    return Project(root=root, files=tuple(files), commit=commit, dirty=dirty, git=asked is not None)


def _ask_git(app_dir: str) -> Optional[Tuple[str, List[str], Optional[str], bool]]:
    """(the work tree's root, its files, HEAD's commit, whether it differs from HEAD) for the git work tree that holds
    ``app_dir``; None outside git. Three questions asked at once, from the app's folder: one wait, not three."""
    try:
        head = _git(app_dir, "rev-parse", "--show-toplevel", "--verify", "-q", "HEAD")
    except OSError:  # no git on this machine: the app's folder
        return None
    listing = _git(app_dir, "ls-files", "-z", "--full-name", "--cached", "--others", "--exclude-standard", "--", ":/")
    status = _git(app_dir, "status", "--porcelain", "-z", "--ignore-submodules=none")
    lines = head.communicate()[0].decode().split()
    out, changes = listing.communicate()[0], status.communicate()[0]
    if not lines:
        return None
    root = os.path.realpath(lines[0])
    return root, _names(root, out), (lines[1] if len(lines) > 1 else None), bool(changes)


def _top_inside(path: str, root: str) -> Optional[str]:
    """The first folder of ``path`` below ``root``, when ``path`` is inside it (the whole of ``multirun/``)."""
    if path == root or not path.startswith(root.rstrip("/") + "/"):
        return None
    return os.path.relpath(path, root).split("/")[0]


def _git(root: str, *args: str) -> "subprocess.Popen[bytes]":
    return subprocess.Popen(["git", "-C", root, *args], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)


def _names(root: str, listed: bytes, prefix: str = "") -> List[str]:
    """The files of ``git ls-files -z`` output, a submodule's or a nested repo's walked in turn (git names a nested
    repo with a trailing slash; a submodule is a folder, looked for only where ``.gitmodules`` says there are any)."""
    names: List[str] = []
    submodules = os.path.exists(os.path.join(root, ".gitmodules"))
    for raw in listed.split(b"\0"):
        if not raw:
            continue
        rel = os.fsdecode(raw).rstrip("/")
        full = os.path.join(root, rel)
        folder = raw.endswith(b"/") or (submodules and os.path.isdir(full) and not os.path.islink(full))
        if folder:  # a submodule, or a repo nested untracked
            inner = _git(full, "ls-files", "-z", "--cached", "--others", "--exclude-standard").communicate()[0]
            names.extend(_names(full, inner, prefix=f"{prefix}{rel}/"))
        else:
            names.append(f"{prefix}{rel}")
    return list(dict.fromkeys(names))


def _walk(root: str, never: Sequence[str]) -> List[str]:
    names: List[str] = []
    for folder, dirs, files in os.walk(root):
        rel_dir = os.path.relpath(folder, root)
        rel_dir = "" if rel_dir == "." else rel_dir + "/"
        dirs[:] = sorted(
            d
            for d in dirs
            if not excluded(rel_dir + d, never) and not os.path.exists(os.path.join(folder, d, "pyvenv.cfg"))
        )
        names.extend(rel_dir + f for f in sorted(files))
        # a symlink to a folder is not walked into: it is an entry of its own (checked like any symlink)
        names.extend(rel_dir + d for d in dirs if os.path.islink(os.path.join(folder, d)))
    return names


def _in_venv(root: str, rel: str, seen: Dict[str, bool]) -> bool:
    folder = os.path.dirname(rel)
    while folder:
        if folder not in seen:
            seen[folder] = os.path.exists(os.path.join(root, folder, "pyvenv.cfg"))
        if seen[folder]:
            return True
        folder = os.path.dirname(folder)
    return False


def _entry(root: str, rel: str) -> Optional[ProjectFile]:
    path = os.path.join(root, rel)
    try:
        info = os.lstat(path)
    except FileNotFoundError:  # tracked, deleted in the work tree: the deletion is part of the launch's tree
        return None
    stamp = (info.st_size, info.st_mtime_ns, info.st_ino, info.st_ctime_ns)
    if stat.S_ISLNK(info.st_mode):
        target = os.readlink(path)
        resolved = os.path.realpath(path)
        if resolved != root and not resolved.startswith(root.rstrip("/") + "/"):
            raise ConfigError(
                KEY,
                rel,
                f"this symlink leaves the project ({rel} -> {target}); a snapshot holds only the project's own files",
                f"exclude it (hydra.launcher.snapshot.exclude=[{rel}]), or turn snapshots off "
                "(hydra.launcher.snapshot.enabled=false)",
            )
        # an absolute target inside the project points at the snapshot's copy, relative to the link
        inside = os.path.relpath(resolved, os.path.join(root, os.path.dirname(rel)))
        return ProjectFile(rel, 0, False, stamp, link=inside if os.path.isabs(target) else target)
    if not stat.S_ISREG(info.st_mode):
        return None  # a socket, a fifo: nothing code imports
    if not os.access(path, os.R_OK):
        raise ConfigError(
            KEY,
            rel,
            f"{path} cannot be read (permission denied), so it cannot be part of the snapshot",
            f"make it readable, or exclude it: hydra.launcher.snapshot.exclude=[{rel}]",
        )
    return ProjectFile(rel, info.st_size, bool(info.st_mode & stat.S_IXUSR), stamp)


def largest(project: Project, count: int = 3) -> List[Tuple[str, int]]:
    """The biggest folders and files of the project (two levels deep), largest first: what a refusal names."""
    sizes: Dict[str, int] = {}
    for entry in project.files:
        key = "/".join(entry.rel.split("/")[:2])
        sizes[key] = sizes.get(key, 0) + entry.size
    return sorted(sizes.items(), key=lambda item: -item[1])[:count]
