"""A launch's code snapshot as every process of its jobs uses it: which tree was copied where, and running from it.

The launcher copies the project that holds the app (its git work tree, or the app's folder) once per launch into a
content-addressed store (``mmt.records.snapshot_store``); this module is the other half, in every process that
imports the job's code (the node agents before their preload, the ranks before their payload is unpickled, the
detached supervisor): :func:`activate` makes the imports that would read the live tree read the snapshot instead.

* ``sys.path`` entries inside the project point into the snapshot (the app's folder, ``recipes/``, a ``.pth`` of an
  editable install in ``src`` layout);
* a meta-path finder, first in line, sends a top-level import that another finder would take from the live tree (an
  editable install's own finder, setuptools' ``__editable__`` mapping) to the same place in the snapshot;
* modules already imported from the project (a forked agent inherits the launcher's) get their ``__file__`` and
  ``__path__`` moved, so their late submodule imports and ``Path(__file__).parent / ...`` read the snapshot too.

mmt's own package is never moved, even when the project is mmt's checkout: it is the launcher's runtime, already
imported by the process that activates the snapshot, as Hydra and torch are.
"""

import importlib.abc
import importlib.machinery
import os
import sys
from dataclasses import dataclass
from typing import Any, List, Optional, Sequence, Tuple

# where a process of a job finds its snapshot: the snapshot's root, set in every rank's environment
SNAPSHOT_DIR_VAR = "MMT_SNAPSHOT_DIR"


@dataclass(frozen=True)
class CodeSnapshot:
    """One launch's copy of the project, as its jobs run it."""

    # the snapshot's id: a digest of every file's path, mode and content
    id: str
    # the snapshot: a read-only tree, the project's files at the launch
    root: str
    # the live project it was taken from (a git work tree, or the app's folder)
    source: str
    # the commit checked out at the launch (None outside git), and whether the tree differed from it
    commit: Optional[str]
    dirty: bool
    files: int
    size_bytes: int
    # folders inside ``source`` that are never moved (mmt's own package, when the project is mmt's checkout)
    keep: Tuple[str, ...] = ()

    def remap(self, path: str) -> str:
        """``path`` in the snapshot when it is inside the live project (and not kept); else ``path`` itself."""
        if not path:
            return path
        absolute = os.path.abspath(path)
        if not _inside(absolute, self.source) or any(_inside(absolute, kept) for kept in self.keep):
            return path
        rest = os.path.relpath(absolute, self.source)
        return self.root if rest == "." else os.path.join(self.root, rest)

    def moved(self, path: str) -> str:
        """``path`` in the snapshot when the snapshot has it; else ``path`` itself (what the snapshot leaves out,
        an ignored build dir or a virtualenv inside the project, is still read where it is)."""
        moved = self.remap(path)
        return moved if moved != path and os.path.exists(moved) else path

    def provenance(self) -> dict:
        """What a job's records say of the code it ran (``result.json``, ``mmt inspect``, the live page)."""
        return {"id": self.id, "commit": self.commit, "dirty": self.dirty, "source": self.source, "dir": self.root}


def binds(snapshot: Optional[CodeSnapshot]) -> List[str]:
    """A container's bind mount of the snapshot, at the same path and read-only (its processes import from it)."""
    return [] if snapshot is None else [f"{snapshot.root}:{snapshot.root}:ro"]


def _inside(path: str, folder: str) -> bool:
    return path == folder or path.startswith(folder.rstrip("/") + "/")


_active: Optional[CodeSnapshot] = None


def activate(snapshot: Optional[CodeSnapshot]) -> None:
    """From now on this process imports the project from ``snapshot`` (nothing for None; once per snapshot)."""
    global _active
    if snapshot is None:
        return
    sys.path[:] = remapped_path(snapshot, sys.path)
    os.environ[SNAPSHOT_DIR_VAR] = snapshot.root  # a rank forked from an active agent gets an environment of its own
    if _active == snapshot:
        return
    _active = snapshot
    _move_imported(snapshot)
    sys.meta_path.insert(0, SnapshotFinder(snapshot))
    sys.path_importer_cache.clear()


def remapped_path(snapshot: CodeSnapshot, path: Sequence[str]) -> list:
    """``sys.path`` as it reads in the snapshot ('' is the working directory, as Python reads it)."""
    return [snapshot.moved(os.getcwd() if entry == "" else entry) for entry in path]


def _move_imported(snapshot: CodeSnapshot) -> None:
    for module in list(sys.modules.values()):
        origin = getattr(module, "__file__", None)
        if isinstance(origin, str):
            moved = snapshot.moved(origin)
            if moved != origin:
                module.__file__ = moved
        locations = getattr(module, "__path__", None)
        if isinstance(locations, list):
            locations[:] = [snapshot.moved(entry) for entry in locations]
        spec = getattr(module, "__spec__", None)
        search = getattr(spec, "submodule_search_locations", None)
        if isinstance(search, list) and search is not locations:
            search[:] = [snapshot.moved(entry) for entry in search]


def moved_function(function: Any, snapshot: Optional[CodeSnapshot]) -> Any:
    """A task function pickled by value (the app's ``__main__``): its ``__file__`` global names the snapshot."""
    scope = getattr(function, "__globals__", None)
    if snapshot is not None and isinstance(scope, dict) and isinstance(scope.get("__file__"), str):
        scope["__file__"] = snapshot.moved(scope["__file__"])
    return function


class SnapshotFinder(importlib.abc.MetaPathFinder):
    """First on ``sys.meta_path``: a top-level module that the other finders would load from the live project is
    loaded from the snapshot instead. It asks them itself, in their order, so an import is searched once."""

    def __init__(self, snapshot: CodeSnapshot) -> None:
        self.snapshot = snapshot

    def find_spec(self, fullname: str, path: Any = None, target: Any = None) -> Any:
        if path is not None:  # a submodule: its package's __path__ is the snapshot's already
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(fullname, path, target)
            if spec is not None:
                return self._moved(fullname, spec)
        return None

    def _moved(self, fullname: str, spec: Any) -> Any:
        locations = list(spec.submodule_search_locations or [])
        where = locations[0] if locations else spec.origin
        if not isinstance(where, str) or self.snapshot.remap(where) == where:
            return spec
        parent = os.path.dirname(self.snapshot.remap(where.rstrip("/")))
        moved = importlib.machinery.PathFinder.find_spec(fullname, [parent])
        return moved if moved is not None else spec
