"""A launch's snapshot of the project: taken once, before the first job is submitted, for every job of the launch.

``hydra.launcher.snapshot`` (docs/snapshots.md)::

    enabled: true      # false: the jobs import the live tree, as before
    exclude: []        # globs on paths relative to the project, or on names: [data, '*.ckpt']
    max_mb: 200        # a bigger project is refused before anything starts, naming its largest paths
    dir: null          # the store; null = $MMT_HOME/snapshots (a cluster's nodes must see it: the home dir)

The project is the git work tree that holds the app's file (the task function's module: ``train.py``), or the app's
folder without git. An app that is installed (its module under an interpreter's prefix) has nothing to snapshot: it
runs as installed.
"""

import inspect
import os
import sys
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Optional, Tuple

from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from mmt.core.errors import ConfigError
from mmt.core.snapshot import CodeSnapshot
from mmt.planning.validate import settings_block
from mmt.records.registry import home
from mmt.records.snapshot_files import EXCLUDE_KEY, KEY, list_project
from mmt.records.snapshot_store import SnapshotStore

DEFAULT_MAX_MB = 200.0
_FIELDS = ("enabled", "exclude", "max_mb", "dir")


@dataclass(frozen=True)
class SnapshotSettings:
    enabled: bool = True
    exclude: Tuple[str, ...] = ()
    max_mb: float = DEFAULT_MAX_MB
    dir: Optional[str] = None

    @classmethod
    def of(cls, launcher_cfg: DictConfig) -> "SnapshotSettings":
        """``hydra.launcher.snapshot``, validated: each bad value is one line naming the key."""
        raw = OmegaConf.select(launcher_cfg, "snapshot", default=None)
        if raw is None or isinstance(raw, bool):
            return cls(enabled=raw is not False)
        expected = "expected true, false, or {enabled, exclude, max_mb, dir}"
        given = settings_block(KEY, raw, _FIELDS, expected, f"e.g. {KEY}=false")
        enabled = given.get("enabled", True)
        if not isinstance(enabled, bool):
            raise ConfigError(f"{KEY}.enabled", enabled, "expected true or false")
        exclude = given.get("exclude") or []
        if isinstance(exclude, str):
            exclude = [exclude]
        if not isinstance(exclude, list) or not all(isinstance(p, str) and p.strip() for p in exclude):
            raise ConfigError(EXCLUDE_KEY, exclude, "expected a list of glob patterns", f"e.g. {EXCLUDE_KEY}=[data]")
        max_mb = given.get("max_mb", DEFAULT_MAX_MB)
        if isinstance(max_mb, bool) or not isinstance(max_mb, (int, float)) or max_mb <= 0:
            raise ConfigError(f"{KEY}.max_mb", max_mb, "expected a number of megabytes > 0", f"e.g. {KEY}.max_mb=500")
        folder = given.get("dir")
        if folder is not None and (not isinstance(folder, str) or not folder.strip()):
            raise ConfigError(f"{KEY}.dir", folder, "expected a directory, or null for $MMT_HOME/snapshots")
        return cls(
            enabled=enabled,
            exclude=tuple(p.strip().strip("/") for p in exclude),
            max_mb=float(max_mb),
            dir=folder,
        )

    def store(self) -> SnapshotStore:
        return SnapshotStore(Path(os.path.expanduser(self.dir)).absolute() if self.dir else home() / "snapshots")


@dataclass
class LaunchSnapshot:
    """The launch's snapshot, and whether this launch made its tree (then a launch refused before any job opened
    removes it again)."""

    snapshot: CodeSnapshot
    made: bool
    store: SnapshotStore
    # a dry run's: identified, not copied
    planned: bool = False

    def discard_if_unused(self) -> None:
        if self.made and not self.planned:
            self.store.release(self.snapshot.id, None)


def app_dir(task_function: Any) -> Optional[str]:
    """The folder of the app's own code (the task function's module file), or None when it is installed (under an
    interpreter's prefix: site-packages) or has no file."""
    try:
        path = inspect.getsourcefile(inspect.unwrap(task_function)) or inspect.getfile(task_function)
    except (TypeError, OSError):
        return None
    path = os.path.realpath(path)
    given = (sys.prefix, sys.base_prefix, sys.exec_prefix)
    prefixes = {os.path.realpath(p) for p in given} | {os.path.abspath(p) for p in given}
    if not os.path.isfile(path) or any(path.startswith(p.rstrip("/") + "/") for p in prefixes):
        return None
    return os.path.dirname(path)


def _run_dirs(config: DictConfig) -> Tuple[str, ...]:
    dirs = []
    for key in ("hydra.sweep.dir", "hydra.run.dir"):
        try:
            value = OmegaConf.select(config, key)
        except OmegaConfBaseException:  # an interpolation that does not resolve here (${now:} does)
            continue
        if isinstance(value, str) and value:
            dirs.append(os.path.abspath(value))
    return tuple(dirs)


def take(config: DictConfig, task_function: Any, dry_run: bool = False) -> Optional[LaunchSnapshot]:
    """The launch's snapshot (None: turned off, or an installed app), refused in one line before anything starts
    when it cannot be made. A dry run identifies it (its id, size and place) and copies nothing."""
    settings = SnapshotSettings.of(config.hydra.launcher)
    where = app_dir(task_function) if settings.enabled else None
    if where is None:
        return None
    store = settings.store()
    keep = _mmt_runtime()
    project = list_project(where, settings.exclude, _run_dirs(config))
    store.check_size(project, settings.max_mb)
    if dry_run:
        return LaunchSnapshot(replace(store.identify(project), keep=keep), made=False, store=store, planned=True)
    store.check_writable()
    snapshot, made = store.take(project)
    return LaunchSnapshot(replace(snapshot, keep=keep), made=made, store=store)


def _mmt_runtime() -> Tuple[str, ...]:
    """What is never read from a snapshot, even inside the project: mmt's own package folder (the running
    launcher's runtime, when the project is mmt's checkout), and the interpreter's (a virtualenv in the project)."""
    given = (sys.prefix, sys.base_prefix, sys.exec_prefix)
    prefixes = {os.path.realpath(p) for p in given} | {os.path.abspath(p) for p in given}
    package_home = Path(__file__).resolve().parents[2]  # mmt/launching/snapshot.py: the folder that holds mmt
    return (str(package_home), *sorted(prefixes))
