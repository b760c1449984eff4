"""Facts about this host the local backend needs: free ports, CPU cores, GPUs. No torch import (too slow)."""

import os
import shutil
import socket
import subprocess
from typing import List, Set


class PortAllocator:
    """Free TCP ports for MASTER_PORT, never the same one twice in one launcher run.

    A fixed port (torchrun's 29500) makes concurrent jobs collide, and a TCPStore accepts ranks of another job.
    """

    def __init__(self, host: str) -> None:
        self.host = host
        self._given: Set[int] = set()

    def allocate(self) -> int:
        for _ in range(100):
            with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
                probe.bind((self.host, 0))
                port = probe.getsockname()[1]
            if port not in self._given:
                self._given.add(port)
                return port
        raise RuntimeError(f"no free TCP port found on {self.host}")


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
