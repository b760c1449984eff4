"""Job dirs as the engine and the recipes leave them, for ``mmt dashboard`` to read, and a client for its API."""

import json
import time
import warnings
from pathlib import Path

from mmt.dashboard import data
from mmt.dashboard.app import create_app

with warnings.catch_warnings():  # starlette >= 1.x would rather drive httpx2; httpx is what the tests install
    warnings.simplefilter("ignore")
    from starlette.testclient import TestClient

SECRET = "root:x:0:0:secret-outside-the-job-dirs"


def make_job(
    root: Path, *, result=None, owner=None, logs=None, metrics=None, csv=None, config=None, overrides=None
) -> Path:
    """A job dir as the engine and the recipes leave it."""
    root.mkdir(parents=True, exist_ok=True)
    if result is not None:
        (root / "result.json").write_text(json.dumps(result))
    if owner is not None:
        (root / ".mmt").mkdir(mode=0o700, exist_ok=True)
        (root / ".mmt" / "owner.json").write_text(json.dumps(owner))
    for name, text in (logs or {}).items():
        (root / "logs").mkdir(exist_ok=True)
        (root / "logs" / name).write_text(text)
    for node, lines in (metrics or {}).items():
        (root / "metrics").mkdir(exist_ok=True)
        (root / "metrics" / f"node{node}.jsonl").write_text(lines)
    if csv is not None:
        (root / "metrics.csv").write_text(csv)
    if config is not None or overrides is not None:
        (root / ".hydra").mkdir(exist_ok=True)
        (root / ".hydra" / "config.yaml").write_text(json.dumps(config or {}))  # JSON is YAML
        (root / ".hydra" / "overrides.yaml").write_text(json.dumps(overrides or []))
    return root


def result_record(num, status="COMPLETED", overrides=(), metric=6.3, attempt="a1", **extra):
    record = {
        "job": num,
        "name": f"train-{num}",
        "attempt": attempt,
        "overrides": list(overrides),
        "status": status,
        "num_nodes": 2,
        "devices": 2,
        "world_size": 4,
        "machine": "cpu",
        "duration_s": 12.5,
        "stop_latency_s": None,
        "scheduler_id": None,
        "started_at": 1000.0,
        "ended_at": 1012.5,
        "summary_metric": "val_loss",
        "return_value": {"val_loss": metric} if status == "COMPLETED" else None,
        "failure": None,
        "error": None,
    }
    return {**record, **extra}


def sample(t, node=0, gpus=None, **extra):
    record = {
        "t": t,
        "node": node,
        "host": "box",
        "cpu_percent": 50.0,
        "mem_used_bytes": 6 << 30,
        "mem_total_bytes": 16 << 30,
        "job_cpu_percent": 180.0,
        "job_rss_bytes": 1 << 30,
        "job_processes": 2,
        "net_sent_bytes_per_s": 1e5,
        "net_recv_bytes_per_s": 2e5,
        "disk_read_bytes_per_s": 0.0,
        "disk_write_bytes_per_s": 4e4,
    }
    if gpus is not None:
        record["gpus"] = gpus
    return json.dumps({**record, **extra}) + "\n"


FAILURE = {
    "rank": 1,
    "node_rank": 0,
    "exit_code": 1,
    "signal": None,
    "exception": "ProbeFault: injected failure on rank 1",
    "traceback": 'Traceback (most recent call last):\n  File "probe.py", line 31, in _inject\n'
    "recipes.probe.ProbeFault: injected failure on rank 1\n",
    "log": "/x/logs/node0.rank1.log",
    "whole_node": False,
    "missing_result": False,
}


def make_outputs(tmp_path: Path) -> Path:
    """outputs/multirun/<date>/<time>/<job>: a finished sweep of three jobs (one failed) and a running job."""
    sweep = tmp_path / "outputs" / "multirun" / "2026-12-02" / "10-47-40"
    for num, lr in enumerate(("0.1", "1.0")):
        make_job(
            sweep / str(num),
            result=result_record(num, overrides=[f"recipe.lr={lr}", "num_nodes=2"], metric=6.0 - num),
            logs={"node0.rank0.log": "hello\n"},
        )
    failed = result_record(
        2,
        "FAILED",
        overrides=["recipe.lr=10", "num_nodes=2"],
        failure=FAILURE,
        error="job 2: rank 1 (node 0) raised ProbeFault",
    )
    make_job(sweep / "2", result=failed, logs={"node0.rank0.log": "", "node0.rank1.log": "boom\n"})
    running = tmp_path / "outputs" / "multirun" / "2026-12-02" / "11-00-00" / "0"
    make_job(
        running,
        owner={
            "attempt": "a2",
            "name": "train-run",
            "backend": "local",
            "job_id": 0,
            "host": "box",
            "pid": 1,
            "started": time.time() - 5,
        },
        logs={f"node{n}.rank{r}.log": "" for n in range(2) for r in (2 * n, 2 * n + 1)},
        config={"num_nodes": 2, "devices": None, "machine": {"name": "cpu", "gpus": 0}},
        overrides=["num_nodes=2"],
    )
    return tmp_path / "outputs"


def client_for(*roots, **kwargs) -> TestClient:
    return TestClient(create_app(list(roots), **kwargs), base_url="http://127.0.0.1")


def job_id(path: Path) -> str:
    return data.opaque_id(path.resolve())
