"""Machine metrics of one node of a job, sampled by the node agent into ``<job dir>/metrics/node<n>.jsonl``.

One JSON object per line, every ``interval_s``::

    {"t": unix time, "node": n, "host": name,
     "cpu_percent": host CPU %, "mem_used_bytes", "mem_total_bytes",
     "job_cpu_percent": CPU % of the job's processes on this node (and their children; can exceed 100),
     "job_rss_bytes", "job_processes",
     "net_sent_bytes_per_s", "net_recv_bytes_per_s", "disk_read_bytes_per_s", "disk_write_bytes_per_s",
     "gpus": [{"index", "name", "util_percent", "mem_used_bytes", "mem_total_bytes", "power_w", "temp_c"}]}

``gpus`` is there only where NVML sees GPUs for the node (never zeros on a CPU host). Simulated local nodes share
the host: the host figures are the host's, the job figures their own processes'. The agent samples in its main
loop (it runs no threads: it forks). A file past ``max_bytes`` is thinned (every other sample of its older part
dropped), so a long run keeps its whole history at a coarser resolution and the file stays bounded.
"""

import json
import os
import socket
import sys
import time
from pathlib import Path
from typing import Any, Dict, Iterable, List, Optional

import psutil

from mmt.core import proctree
from mmt.core.jobdir import open_for_append, write_atomic
from mmt.records.node_metrics import read_samples  # noqa: F401 - the sampler's readers read through it

MAX_BYTES = 1 << 20
# what every Linux host with NVIDIA's driver loaded has, a container given GPUs included
NVIDIA_CONTROL_DEVICE = "/dev/nvidiactl"
_KEEP_RECENT = 0.25  # the newest quarter of the samples is never thinned


class GpuReader:
    """NVML, for the GPUs one node may use (its CUDA_VISIBLE_DEVICES: indices or UUIDs); nothing without NVML."""

    def __init__(self, visible: Optional[str]) -> None:
        self.handles: List[Any] = []
        self.indices: List[int] = []
        if sys.platform == "linux" and not os.path.exists(NVIDIA_CONTROL_DEVICE):
            return  # no NVIDIA driver here (NVML needs its device): a CPU host pays no NVML import and load
        try:
            import pynvml

            pynvml.nvmlInit()
        except Exception:  # noqa: BLE001 - no library (ImportError), no driver (NVMLError, OSError): no GPU fields
            return
        self.nvml = pynvml
        count = pynvml.nvmlDeviceGetCount()
        wanted = [v.strip() for v in visible.split(",")] if visible not in (None, "") else None
        if visible == "":
            return  # a CPU job on a GPU host
        for index in range(count):
            handle = pynvml.nvmlDeviceGetHandleByIndex(index)
            uuid = pynvml.nvmlDeviceGetUUID(handle)
            uuid = uuid.decode() if isinstance(uuid, bytes) else uuid
            if wanted is None or str(index) in wanted or uuid in wanted:
                self.handles.append(handle)
                self.indices.append(index)

    def read(self) -> List[Dict[str, Any]]:
        found = []
        for index, handle in zip(self.indices, self.handles):
            nvml = self.nvml
            name = nvml.nvmlDeviceGetName(handle)
            memory = nvml.nvmlDeviceGetMemoryInfo(handle)
            record = {
                "index": index,
                "name": name.decode() if isinstance(name, bytes) else name,
                "util_percent": float(nvml.nvmlDeviceGetUtilizationRates(handle).gpu),
                "mem_used_bytes": int(memory.used),
                "mem_total_bytes": int(memory.total),
            }
            try:
                record["power_w"] = nvml.nvmlDeviceGetPowerUsage(handle) / 1000.0
            except nvml.NVMLError:
                pass
            try:
                record["temp_c"] = float(nvml.nvmlDeviceGetTemperature(handle, nvml.NVML_TEMPERATURE_GPU))
            except nvml.NVMLError:
                pass
            found.append(record)
        return found


class NodeSampler:
    def __init__(
        self,
        path: Path,
        node_rank: int,
        interval_s: float,
        visible_gpus: Optional[str] = None,
        max_bytes: int = MAX_BYTES,
    ) -> None:
        self.path, self.node_rank, self.interval_s, self.max_bytes = path, node_rank, interval_s, max_bytes
        self.host = socket.gethostname()
        self.gpus = GpuReader(visible_gpus)
        self._processes: Dict[int, psutil.Process] = {}
        self._last: Optional[Dict[str, Any]] = None
        self._next = 0.0
        self._lines = 0
        path.parent.mkdir(parents=True, exist_ok=True)

    def due(self, now: float) -> bool:
        return self.interval_s > 0 and now >= self._next

    def _counters(self) -> Dict[str, Any]:
        net, disk = psutil.net_io_counters(), psutil.disk_io_counters()
        return {"t": time.time(), "cpu": psutil.cpu_times(), "net": net, "disk": disk}

    def _job(self, roots: Iterable[int]) -> Dict[str, Any]:
        """CPU % and RSS of the job's processes on this node, their children included."""
        alive: Dict[int, psutil.Process] = {}
        for root in roots:
            for pid in proctree.family(root):
                if pid in alive:
                    continue
                try:
                    alive[pid] = self._processes.get(pid) or psutil.Process(pid)
                except psutil.Error:
                    continue
        cpu, rss = 0.0, 0
        for process in alive.values():
            try:
                with process.oneshot():
                    cpu += process.cpu_percent(None)  # since this object's previous call (0.0 the first time)
                    rss += process.memory_info().rss
            except psutil.Error:
                continue
        self._processes = alive
        return {"job_cpu_percent": round(cpu, 1), "job_rss_bytes": rss, "job_processes": len(alive)}

    def sample(self, roots: Iterable[int]) -> None:
        """Append one sample; ``roots``: the pids of the job's processes on this node."""
        now = time.monotonic()
        self._next = now + self.interval_s
        counters = self._counters()
        memory = psutil.virtual_memory()
        record: Dict[str, Any] = {
            "t": round(counters["t"], 3),
            "node": self.node_rank,
            "host": self.host,
            "cpu_percent": _cpu_percent(self._last, counters),
            "mem_used_bytes": int(memory.total - memory.available),
            "mem_total_bytes": int(memory.total),
            **self._job(roots),
            **_rates(self._last, counters),
        }
        gpus = self.gpus.read()
        if gpus:
            record["gpus"] = gpus
        self._last = counters
        with open(open_for_append(self.path, 0o666), "a") as handle:  # never through a symlink planted there
            handle.write(json.dumps(record) + "\n")
        self._lines += 1
        if self._lines % 64 == 0 and self.path.stat().st_size > self.max_bytes:
            thin(self.path)


def _cpu_percent(last: Optional[Dict[str, Any]], now: Dict[str, Any]) -> Optional[float]:
    if last is None:
        return round(psutil.cpu_percent(interval=None), 1)
    busy = lambda times: sum(times) - times.idle - getattr(times, "iowait", 0.0)  # noqa: E731
    total = sum(now["cpu"]) - sum(last["cpu"])
    return round(100.0 * (busy(now["cpu"]) - busy(last["cpu"])) / total, 1) if total > 0 else 0.0


def _rates(last: Optional[Dict[str, Any]], now: Dict[str, Any]) -> Dict[str, float]:
    if last is None:
        return {}
    elapsed = max(1e-6, now["t"] - last["t"])
    rates = {}
    if now["net"] is not None and last["net"] is not None:
        rates["net_sent_bytes_per_s"] = round((now["net"].bytes_sent - last["net"].bytes_sent) / elapsed, 1)
        rates["net_recv_bytes_per_s"] = round((now["net"].bytes_recv - last["net"].bytes_recv) / elapsed, 1)
    if now["disk"] is not None and last["disk"] is not None:
        rates["disk_read_bytes_per_s"] = round((now["disk"].read_bytes - last["disk"].read_bytes) / elapsed, 1)
        rates["disk_write_bytes_per_s"] = round((now["disk"].write_bytes - last["disk"].write_bytes) / elapsed, 1)
    return rates


def thin(path: Path) -> None:
    """Halve the older samples of a metrics file: its whole history stays, at a coarser resolution."""
    lines = path.read_text().splitlines(keepends=True)
    complete = [line for line in lines if line.endswith("\n")]
    keep_from = int(len(complete) * (1 - _KEEP_RECENT))
    kept = complete[:keep_from:2] + complete[keep_from:]
    write_atomic(path, "".join(kept).encode())
