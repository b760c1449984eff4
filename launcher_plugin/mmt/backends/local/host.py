"""Facts about this host the local backend needs: a port for each job, CPU cores, GPUs. No torch import (too slow).

**MASTER_PORT without a race.** Choosing a port by binding port 0 and closing it leaves a window before rank 0
binds it, in which any process's outgoing connection or ``bind(0)`` can take it (rank 0 then fails with
EADDRINUSE). mmt keeps the port bound, not listening, with SO_REUSEADDR, for as long as the job runs: Linux never
hands a bound port to ``bind(0)`` or to an outgoing connection, while rank 0's TCPStore (which sets SO_REUSEADDR
too) can still bind and listen on it.
"""

import os
import shutil
import socket
import subprocess
from typing import Dict, List


class PortReservations:
    """A free TCP port per job, held until the job ends."""

    def __init__(self, host: str) -> None:
        self.host = host
        self._held: Dict[int, socket.socket] = {}

    def reserve(self) -> int:
        family = socket.AF_INET6 if ":" in self.host else socket.AF_INET
        sock = socket.socket(family, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((self.host, 0))
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
