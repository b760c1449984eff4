"""A running launch's records, brought back from the cluster in one rsync for every job of the launch (which
files: mmt.remote.records)."""

from pathlib import Path

from mmt.remote.connection import Connection
from mmt.remote.records import rsync_filters


def fetch(connection: Connection, remote_sweep_dir: str, local_sweep_dir: Path) -> bool:
    """The launch's records brought into its sweep dir here (only what changed); False when the cluster could not
    be reached (the next poll tries again)."""
    local_sweep_dir.mkdir(parents=True, exist_ok=True)
    done = connection.rsync(
        ["-a", "--prune-empty-dirs", *rsync_filters(), f":{remote_sweep_dir.rstrip('/')}/", f"{local_sweep_dir}/"],
        timeout=300,
    )
    return done.returncode in (0, 24)  # 24: a file vanished while it was read (a log set aside): the rest came
