"""Facts about this host the local backend needs: a port for each job, CPU cores, GPUs. No torch import (too slow).

**MASTER_PORT without a race**: each job's port is held from the moment it is chosen until the job ends
(``mmt.core.ports``); so is every port a job's framework needs (one per TensorFlow worker, JAX's coordinator).
"""

import os
import shutil
import socket
import subprocess
from typing import Dict, List

from mmt.core.ports import hold_port


class PortReservations:
    """Free TCP ports for jobs (MASTER_PORT, the framework's), each held until released when its job ends."""

    def __init__(self, host: str) -> None:
        self.host = host
        self._held: Dict[int, socket.socket] = {}

    def reserve(self) -> int:
        sock = hold_port(self.host)
        port = sock.getsockname()[1]
        self._held[port] = sock
        return port

    def release(self, port: int) -> None:
        sock = self._held.pop(port, None)
        if sock is not None:
            sock.close()

    def release_all(self) -> None:
        for port in list(self._held):
            self.release(port)


def cpu_cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:
        return os.cpu_count() or 1


def visible_gpus() -> List[str]:
    """The GPU ids this process may use: CUDA_VISIBLE_DEVICES if set, else what nvidia-smi lists."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        return [g for g in visible.split(",") if g.strip() and g.strip() != "-1"]
    if shutil.which("nvidia-smi") is None:
        return []
    try:
        listing = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=10).stdout
    except (OSError, subprocess.TimeoutExpired):
        return []
    return [str(i) for i, line in enumerate(line for line in listing.splitlines() if line.startswith("GPU "))]
