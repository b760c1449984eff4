"""Watching a job: machine metrics sampled by the node agents, the sampler benchmark's verdict, progress in the terminal
(a real pty) and in plain logs, and the live page started for a launch. (The sampler and NVML on their own:
tests/unit/test_monitoring.py.)"""

import importlib.util
import json
import os
import pty
import select
import subprocess
import sys
import time
import urllib.request

import pytest

from helpers.app import app_command, app_env, results, run_app
from helpers.paths import REPO
from helpers.processes import wait_gone
from mmt.monitor.sampler import NodeSampler, read_samples, thin


def test_every_node_is_sampled_at_the_interval_and_cpu_hosts_have_no_gpu_fields(tmp_path, tag):
    done = run_app(
        "recipe=probe",
        "num_nodes=2",
        "devices=2",
        "recipe.hold_s=4",
        "hydra.launcher.metrics_interval_s=0.5",
        sweep_dir=tmp_path,
        tag=tag,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    for node in (0, 1):
        samples = read_samples(tmp_path / "0" / "metrics" / f"node{node}.jsonl")
        assert len(samples) >= 6, len(samples)
        assert {s["node"] for s in samples} == {node}
        gaps = [b["t"] - a["t"] for a, b in zip(samples, samples[1:])]
        assert 0.3 < sorted(gaps)[len(gaps) // 2] < 1.0, gaps  # the median gap is the interval
        assert all("gpus" not in s for s in samples)  # absent, not zeros, on this CPU host
        for key in ("cpu_percent", "job_cpu_percent"):  # the host's CPU and the job's own processes'
            assert all(isinstance(s.get(key), (int, float)) and s[key] >= 0 for s in samples), key
        assert max(s["job_cpu_percent"] for s in samples) > 0, "the job's ranks used no CPU at all?"
        for key in ("disk_read_bytes_per_s", "disk_write_bytes_per_s"):  # rates: from the second sample on
            assert all(isinstance(s.get(key), (int, float)) and s[key] >= 0 for s in samples[1:]), key
        last = samples[-1]
        assert last["mem_total_bytes"] > last["mem_used_bytes"] > 0 and last["job_processes"] >= 2
        assert last["job_rss_bytes"] > 10 << 20 and "net_recv_bytes_per_s" in last


def test_sampling_can_be_switched_off(tmp_path, tag):
    done = run_app("recipe=probe", "hydra.launcher.metrics_interval_s=0", sweep_dir=tmp_path, tag=tag)
    assert done.returncode == 0 and not (tmp_path / "0" / "metrics").exists()


BENCH_SAMPLER = REPO / "benchmarks" / "bench_sampler.py"
# the benchmark with its two measurements replaced by the given CPU rates (the real run takes a minute): its
# verdict and exit status, in a process of its own, as CI sees them
FAKE_MEASUREMENTS = """
import sys
sys.path.insert(0, sys.argv[1])
import bench_sampler

with_sampling, without = float(sys.argv[2]), float(sys.argv[3])  # the agent's CPU seconds per second
bench_sampler.end_to_end = lambda interval_s, hold_s, scratch: {
    "agent_cpu_per_s": with_sampling if interval_s else without, "window_s": 10.0}
bench_sampler.sampler_alone = lambda samples: 1e-4
bench_sampler.main(["--rounds", "1", *sys.argv[4:]])
"""


def _bench_verdict(with_sampling: float, without: float, *options: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [
            sys.executable,
            "-c",
            FAKE_MEASUREMENTS,
            str(BENCH_SAMPLER.parent),
            str(with_sampling),
            str(without),
            *options,
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_the_sampler_benchmark_fails_at_one_percent_of_a_core_or_more():
    over = _bench_verdict(0.05, 0.02)  # the sampler: 3 % of a core
    assert over.returncode == 1, over.stderr
    [message] = over.stderr.splitlines()
    assert "3.00 % of one core" in message and "under 1.00 %" in message, message
    assert "(a) the host agent" in over.stdout  # the numbers are printed before the verdict
    within = _bench_verdict(0.025, 0.02)  # 0.5 %
    assert within.returncode == 0 and within.stderr == "", within.stderr
    assert _bench_verdict(0.05, 0.02, "--max-share-percent", "5").returncode == 0

    spec = importlib.util.spec_from_file_location("bench_sampler", BENCH_SAMPLER)
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    assert bench.build_parser().parse_args([]).max_share_percent == 1.0
    with pytest.raises(SystemExit) as verdict:  # 1 % itself is over: the budget is "under 1 %"
        bench.enforce_budget(1.0, 1.0)
    assert verdict.value.code != 0
    assert bench.enforce_budget(0.99, 1.0) is None


# ------------------------------------------------------------------------------------------------ progress


LM_SHORT = ("num_nodes=2", "devices=2", "recipe.max_steps=30", "recipe.val_check_interval=15")


def test_plain_progress_lines_when_stdout_is_not_a_terminal(tmp_path, tag):
    done = run_app(*LM_SHORT, sweep_dir=tmp_path, tag=tag, MMT_PROGRESS_EVERY_S="1")
    assert done.returncode == 0, done.stderr[-2000:]
    lines = [line for line in done.stdout.splitlines() if line.startswith("[mmt] ")]
    assert lines, done.stdout
    assert any(" 1 running, 0 done | #0 step " in line and "/30 loss " in line for line in lines), lines
    assert any(" eta " in line for line in lines), lines


def test_a_live_status_block_on_a_terminal_keeps_rank_zero_readable(tmp_path, tag):
    main, secondary = pty.openpty()
    launcher = subprocess.Popen(
        app_command(*LM_SHORT, sweep_dir=tmp_path),
        cwd=REPO,
        env=app_env(tag, COLUMNS="160"),
        stdin=secondary,
        stdout=secondary,
        stderr=secondary,
        close_fds=True,
    )
    os.close(secondary)
    screen = b""
    while True:
        ready, _, _ = select.select([main], [], [], 1.0)
        if ready:
            try:
                chunk = os.read(main, 65536)
            except OSError:  # the other end closed
                break
            if not chunk:
                break
            screen += chunk
        elif launcher.poll() is not None:
            break
    launcher.wait(timeout=30)
    os.close(main)
    text = screen.decode(errors="replace")
    assert launcher.returncode == 0, text[-3000:]
    assert "mmt: 0 pending, 1 running, 0 done" in text  # the block's title while the job runs
    assert "/30" in text  # the job's step against its total
    assert "[#0 n0 r0] lm: 30 steps on 4 ranks" in text  # rank 0's prefixed line, whole
    assert "mmt summary" in text


# ------------------------------------------------------------------------------------------------ the live page


def test_a_launch_can_serve_its_live_page_and_takes_it_down_at_the_end(tmp_path, tag):
    launcher = subprocess.Popen(
        app_command("recipe=probe", "recipe.hold_s=5", "hydra.launcher.dashboard=true", sweep_dir=tmp_path),
        cwd=REPO,
        env=app_env(tag),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    url = None
    deadline = time.monotonic() + 60
    while url is None and time.monotonic() < deadline:
        line = launcher.stdout.readline()
        if "mmt: live page: http://127.0.0.1:" in line:
            url = line.split("live page: ")[1].split()[0]
    assert url is not None
    with urllib.request.urlopen(url + "api/jobs", timeout=10) as response:
        listing = json.loads(response.read())
    assert any(job["status"] in ("RUNNING", "PENDING") for sweep in listing["sweeps"] for job in sweep["jobs"]), listing
    launcher.communicate(timeout=60)
    assert results(tmp_path)[0]["status"] == "COMPLETED"
    assert wait_gone(tag, timeout_s=10) == []  # the page went with the launch
    with pytest.raises(OSError):
        urllib.request.urlopen(url, timeout=3)


def test_a_long_run_keeps_its_metrics_file_bounded(tmp_path):
    path = tmp_path / "node0.jsonl"
    sampler = NodeSampler(path, 0, interval_s=0.001, max_bytes=20_000)
    for _ in range(2000):
        sampler.sample([os.getpid()])
    samples = read_samples(path)
    assert path.stat().st_size < 3 * 20_000
    assert samples[0]["t"] <= samples[-1]["t"] and len(samples) < 2000  # thinned, first and last kept
    before = len(samples)
    thin(path)
    assert len(read_samples(path)) < before
