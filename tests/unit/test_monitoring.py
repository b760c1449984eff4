"""Machine metrics without a job: NVML reports every GPU there is and nothing on a
CPU host. (Sampling by real node agents, progress on a terminal and the live page: tests/e2e/test_monitoring.py.)"""

import os

import pytest

from mmt.monitor.sampler import GpuReader, NodeSampler, read_samples


def _nvidia_gpus() -> int:
    try:
        import pynvml

        pynvml.nvmlInit()
        return pynvml.nvmlDeviceGetCount()
    except Exception:
        return 0


def _why_no_nvml() -> str:
    """Why the NVML test cannot run here, in words: no nvidia-ml-py, or no GPU and driver for it to read."""
    try:
        import pynvml  # noqa: F401
    except ImportError:
        return "nvidia-ml-py (pynvml) is not installed: NVML cannot be read here"
    return "no NVIDIA GPU and driver on this host: NVML has nothing to read"


@pytest.mark.skipif(_nvidia_gpus() == 0, reason=_why_no_nvml())
def test_nvml_reports_every_visible_gpu(tmp_path):
    gpus = GpuReader(None).read()
    assert len(gpus) == _nvidia_gpus()
    for gpu in gpus:
        assert 0 <= gpu["util_percent"] <= 100 and gpu["mem_total_bytes"] >= gpu["mem_used_bytes"] > 0
        assert "name" in gpu
        # the issue asks for power and temperature per GPU; a datacentre GPU reports both
        assert gpu.get("power_w", 0) > 0, gpu
        assert 0 < gpu.get("temp_c", 0) < 130, gpu
    assert GpuReader("").read() == []  # a CPU job on a GPU host

    # what the node agent writes: one sample of the node holds the same GPUs
    path = tmp_path / "metrics" / "node0.jsonl"
    NodeSampler(path, 0, interval_s=1.0).sample([os.getpid()])
    [written] = read_samples(path)
    assert [gpu["index"] for gpu in written["gpus"]] == [gpu["index"] for gpu in gpus]
    for gpu in written["gpus"]:
        assert {"name", "util_percent", "mem_used_bytes", "mem_total_bytes", "power_w", "temp_c"} <= set(gpu)


def test_on_a_cpu_host_nvml_reports_nothing_at_all():
    if _nvidia_gpus():
        pytest.skip("this host has GPUs")
    assert GpuReader(None).read() == []
