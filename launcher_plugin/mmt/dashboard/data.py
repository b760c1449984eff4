"""Reading job dirs for the dashboard: functions over the files named in :mod:`mmt.core.jobdir`, no web.

The page polls every ~1.5 s, so everything here is cheap to repeat: parsed files are cached per (size,
mtime), logs are read by byte range (never whole), and what is sent is capped. Every path is resolved and must
stay inside its job dir, so a symlink in a job dir cannot make the dashboard read anything else. Nothing is
unpickled.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import re
import stat
import threading
import time
from collections import Counter, OrderedDict
from collections.abc import Callable, Iterable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, BinaryIO

import yaml

from mmt.core.jobdir import (
    LOG_NAME,
    LOGS,
    METRICS,
    METRICS_NAME,
    PRIVATE,
    RESULT,
    ROLE_LOG_NAME,
    TRAINING_METRICS,
    JobDir,
)
from mmt.records import training
from mmt.records.node_metrics import parse_samples
from mmt.records.restarts import PendingRestart
from mmt.records.result_view import ResultView
from mmt.records.roles_file import read_roles
from mmt.records.roles_file import topology as topology_of_roles
from mmt.records.scheduler import SchedulerRecord, scheduler_record_of
from mmt.records.schema import EarlierRun

MAX_DEPTH = 4  # outputs/multirun/<date>/<time>/<job>
MAX_DIRS_SCANNED = 20_000
TAIL_BYTES = 64 * 1024  # first read of a log
MAX_CHUNK = 256 * 1024  # any later read of a log
MAX_POINTS = 900  # node samples sent per node and request (~15-30 min at 1-2 s)
MAX_CURVE_POINTS = 2000
MAX_CSV_BYTES = 8 * 1024 * 1024  # beyond that only the end of metrics.csv is read
MAX_JSON_BYTES = 4 * 1024 * 1024
MAX_METRICS_BYTES = 64 * 1024 * 1024  # the sampler keeps its files far smaller; refuse pathological ones

JOB_ID = re.compile(r"[0-9a-f]{16}")

NODE_SERIES = (
    "cpu_percent",
    "mem_used_bytes",
    "mem_total_bytes",
    "job_cpu_percent",
    "job_rss_bytes",
    "job_processes",
    "net_sent_bytes_per_s",
    "net_recv_bytes_per_s",
    "disk_read_bytes_per_s",
    "disk_write_bytes_per_s",
)
GPU_SERIES = ("util_percent", "mem_used_bytes", "mem_total_bytes", "power_w", "temp_c")


# -------------------------------------------------------------------------------------------- small helpers


def number(value: Any) -> float | None:
    """A finite int/float, else None (JSON has no NaN, and a bool is not a measurement)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return value if math.isfinite(value) else None


def clean(value: Any) -> Any:
    """``value`` with every non-finite float as None: JSON responses refuse the NaN that Python reads."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {str(k): clean(v) for k, v in value.items()}
    if isinstance(value, list):
        return [clean(v) for v in value]
    return value


def to_number(text: str) -> float | None:
    try:
        return number(float(text))
    except ValueError:
        return None


def opaque_id(path: Path) -> str:
    """The id the API uses for a job or a sweep: a hash of its resolved path, never the path itself."""
    return hashlib.sha256(str(path).encode()).hexdigest()[:16]


def inside(root: Path, *parts: str) -> Path | None:
    """``root/parts`` with every symlink resolved, or None when that leaves ``root``."""
    try:
        root = root.resolve()
        path = root.joinpath(*parts).resolve()
    except (OSError, RuntimeError):  # RuntimeError: a symlink loop
        return None
    return path if path.is_relative_to(root) else None


def open_regular(path: Path) -> BinaryIO | None:
    """A binary reader for a regular file, or None: no symlink swapped in after resolving, no FIFO to hang."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError:
        return None
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        return None
    return os.fdopen(fd, "rb")


class FileCache:
    """Parsed files keyed by path and invalidated by (size, mtime): a poll re-parses only what changed."""

    def __init__(self, size: int = 4096) -> None:  # a few small files per job, a big sweep included
        self._items: OrderedDict[tuple[str, Path], tuple[tuple[int, int], Any]] = OrderedDict()
        self._size = size
        self._lock = threading.Lock()

    def get(self, kind: str, path: Path, parse: Callable[[Path, os.stat_result], Any]) -> Any:
        try:
            st = path.stat()
        except OSError:
            return None
        version = (st.st_size, st.st_mtime_ns)
        key = (kind, path)
        with self._lock:
            hit = self._items.get(key)
            if hit and hit[0] == version:
                self._items.move_to_end(key)
                return hit[1]
        value = parse(path, st)
        with self._lock:
            self._items[key] = (version, value)
            self._items.move_to_end(key)
            while len(self._items) > self._size:
                self._items.popitem(last=False)
        return value


CACHE = FileCache()


def _parse_small(path: Path, st: os.stat_result, parse: Any, errors: tuple) -> Any:
    """A small regular file parsed, or None (too large, not a regular file, unparsable)."""
    if st.st_size > MAX_JSON_BYTES:
        return None
    handle = open_regular(path)
    if handle is None:
        return None
    with handle:
        try:
            return parse(handle.read())
        except (*errors, UnicodeDecodeError):  # being rewritten by a non-atomic writer, or not ours
            return None


def _parse_json(path: Path, st: os.stat_result) -> dict[str, Any] | None:
    value = _parse_small(path, st, json.loads, (ValueError,))
    return value if isinstance(value, dict) else None


def _parse_yaml(path: Path, st: os.stat_result) -> Any:
    return _parse_small(path, st, yaml.safe_load, (yaml.YAMLError,))


def read_json(root: Path, *parts: str) -> dict[str, Any] | None:
    path = inside(root, *parts)
    return CACHE.get("json", path, _parse_json) if path else None


def read_yaml(root: Path, *parts: str) -> Any:
    path = inside(root, *parts)
    return CACHE.get("yaml", path, _parse_yaml) if path else None


# ----------------------------------------------------------------------------------------------- discovery


def is_job_dir(path: Path) -> bool:
    """What the engine leaves in every job dir: a result, rank logs, or its private dir."""
    jd = JobDir(path)
    return jd.result.is_file() or jd.logs.is_dir() or jd.private.is_dir()


def _walk(path: Path, depth: int, found: set, budget: list[int]) -> None:
    if is_job_dir(path):
        found.add(path)
        return  # a job dir's own subdirs are never jobs
    if depth >= MAX_DEPTH:
        return
    try:
        entries = sorted(os.scandir(path), key=lambda e: e.name)
    except OSError:
        return
    for entry in entries:
        # hidden dirs are Hydra's, mmt's or submitit's records; symlinked dirs could lead anywhere
        if entry.name.startswith(".") or not entry.is_dir(follow_symlinks=False):
            continue
        budget[0] -= 1
        if budget[0] < 0:
            return
        _walk(Path(entry.path), depth + 1, found, budget)


def _job_order(path: Path) -> tuple[str, int, str]:
    return (str(path.parent), int(path.name) if path.name.isdigit() else 1 << 62, path.name)


def discover(roots: Iterable[Path], extra: Iterable[Path] = ()) -> list[Path]:
    """Job dirs under ``roots`` (a sweep dir, a job dir, or a parent such as ``outputs/``, searched
    ``MAX_DEPTH`` levels down) plus the ``extra`` job dirs (the registry's), resolved, in sweep, job order."""
    found: set = set()
    budget = [MAX_DIRS_SCANNED]
    for root in roots:
        try:
            root = Path(root).resolve()
        except (OSError, RuntimeError):
            continue
        if root.is_dir():
            _walk(root, 0, found, budget)
    for job in extra:
        try:
            job = Path(job).resolve()
        except (OSError, RuntimeError):
            continue
        if job.is_dir():
            found.add(job)
    return sorted(found, key=_job_order)


class Catalog:
    """The job dirs the dashboard may serve, by opaque id, rediscovered at most every ``ttl_s``.

    Only dirs found here are ever read: the API never takes a path from the client.
    """

    def __init__(
        self, roots: Iterable[Path], extra: Callable[[], list[Path]] | None = None, ttl_s: float = 1.0
    ) -> None:
        self.roots = [Path(r) for r in roots]
        self.extra = extra
        self.ttl_s = ttl_s
        self._lock = threading.Lock()
        self._at = -math.inf
        self._jobs: dict[str, Path] = {}

    def _refresh(self) -> None:
        try:
            extra = list(self.extra()) if self.extra else []
        except Exception:  # noqa: BLE001 (the registry is not ours: a broken entry must not take the page down)
            extra = []
        jobs = discover(self.roots, extra)
        self._jobs = {opaque_id(path): path for path in jobs}
        self._at = time.monotonic()

    def jobs(self) -> dict[str, Path]:
        with self._lock:
            if time.monotonic() - self._at >= self.ttl_s:
                self._refresh()
            return dict(self._jobs)

    def lookup(self, job_id: str) -> Path | None:
        if not JOB_ID.fullmatch(job_id):
            return None
        return self.jobs().get(job_id)


# ----------------------------------------------------------------------------------------------------- a job


@dataclass(frozen=True)
class LogFile:
    name: str
    node: int
    rank: int | None  # None: a per-node command's log
    # a job with roles: the role (its logs are logs/<role>/..., numbered in the role's own world)
    role: str | None = None


def is_log_name(name: str) -> bool:
    """A name the page may ask for: ``node0.rank0.log``, or a role's ``trainer/node0.rank0.log``."""
    return bool(LOG_NAME.fullmatch(name) or ROLE_LOG_NAME.fullmatch(name))


def log_files(root: Path) -> list[LogFile]:
    """The job's log files, by node and rank; a name that resolves outside the job dir is left out."""
    logs = inside(root, LOGS)
    if logs is None:
        return []
    try:
        entries = list(os.scandir(logs))
    except OSError:
        return []
    found = []
    for entry in entries:
        if entry.is_dir(follow_symlinks=False) and entry.name != "previous":
            found += [replace(f, name=f"{entry.name}/{f.name}", role=entry.name) for f in _logs_in(root, entry.name)]
    found += _logs_in(root, None, entries)
    roles = [f.role for f in found]
    # the primary role first: its rank 0 is the job's, whose log the roles file names first
    order = {role: i for i, role in enumerate(_role_order(root) or sorted(set(r for r in roles if r)))}
    return sorted(
        found, key=lambda f: (-1 if f.role is None else order.get(f.role, 99), f.node, -1 if f.rank is None else f.rank)
    )


def _roles_shape(root: Path) -> str | None:
    roles = read_roles(root)
    return topology_of_roles(roles) if roles else None


def _role_order(root: Path) -> list[str]:
    roles = read_roles(root)
    return [shape.name for shape in roles] if roles else []


def _logs_in(root: Path, role: str | None, entries: list[os.DirEntry] | None = None) -> list[LogFile]:
    """The process logs in ``logs/`` (or a role's ``logs/<role>/``)."""
    parts = (LOGS,) if role is None else (LOGS, role)
    if entries is None:
        where = inside(root, *parts)
        try:
            entries = list(os.scandir(where)) if where is not None else []
        except OSError:
            return []
    found = []
    for entry in entries:
        match = LOG_NAME.fullmatch(entry.name)
        if not match:
            continue
        path = inside(root, *parts, entry.name)
        if path is None or not path.is_file():
            continue
        found.append(LogFile(entry.name, int(match[1]), int(match[2]) if match[2] is not None else None))
    return found


def log_path(root: Path, name: str) -> Path | None:
    """The log file ``name`` of the job, only if it is one of the job's own listed logs."""
    if not is_log_name(name) or name not in {f.name for f in log_files(root)}:
        return None
    return inside(root, LOGS, name)


def _hydra_config(root: Path) -> dict[str, Any]:
    config = read_yaml(root, ".hydra", "config.yaml")
    return config if isinstance(config, dict) else {}


def overrides(root: Path, result: ResultView | None) -> list[str]:
    if result and result.overrides:
        return list(result.overrides)
    listed = read_yaml(root, ".hydra", "overrides.yaml")
    return [str(o) for o in listed] if isinstance(listed, list) else []


def _int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def topology(root: Path, result: ResultView | None) -> tuple[int | None, int | None, str | None]:
    """(nodes, devices per node, machine): from the result once there is one, else from this run's composed
    config and its log names (a running job's plan is a pickle, which the dashboard never loads)."""
    if result:
        return result.num_nodes, result.devices, result.machine
    config = _hydra_config(root)
    machine = config.get("machine")
    machine_name = machine.get("name") if isinstance(machine, dict) else machine
    if not isinstance(machine_name, str):
        machine_name = None
    nodes, devices = _int(config.get("num_nodes")), _int(config.get("devices"))
    logs = log_files(root)
    if logs:
        log_nodes = len({f.node for f in logs})
        nodes = nodes or log_nodes
        rank_logs = [f for f in logs if f.rank is not None]
        if devices is None and rank_logs:
            devices = max(1, len(rank_logs) // log_nodes)
    if devices is None and isinstance(machine, dict) and _int(machine.get("gpus")) is not None:
        devices = machine["gpus"] or 1  # the launcher's rule for devices=null
    return nodes, devices, machine_name


def metric(result: ResultView | dict[str, Any] | None) -> tuple[str | None, float | None]:
    """The job's summary metric, as the console summary and summary.png show it (:mod:`mmt.records.metric`)."""
    if not result:
        return None, None
    chosen = (result if isinstance(result, ResultView) else ResultView.of(result)).metric()
    return chosen.name, chosen.value


ATTEMPT_ID = re.compile(r"[0-9A-Za-z_.-]{1,64}")


def scheduler_view(root: Path, attempt: Any) -> SchedulerRecord | None:
    """What the scheduler last said of that attempt (``scheduler.json``: why it waits, that it can never start, since
    when the scheduler does not answer), as the launcher or ``mmt list`` recorded it; the page never asks SLURM."""
    if not isinstance(attempt, str) or not ATTEMPT_ID.fullmatch(attempt) or attempt in (".", ".."):
        return None
    path = JobDir(root).attempt(attempt).scheduler
    return scheduler_record_of(read_json(root, *path.relative_to(root).parts))


def restart_view(root: Path, attempt: Any) -> PendingRestart | None:
    """The restart that attempt waits for, between a failed run and the next (``restarting.json``), if it does."""
    if not isinstance(attempt, str) or not ATTEMPT_ID.fullmatch(attempt) or attempt in (".", ".."):
        return None
    path = JobDir(root).attempt(attempt).pending_restart_file
    data = read_json(root, *path.relative_to(root).parts)
    failed = EarlierRun.of(data.get("failed")) if data else None
    next_at = number(data.get("next_at")) if data else None
    why = data.get("why") if data else None
    if failed is None or next_at is None:
        return None
    return PendingRestart(failed, next_at, why if isinstance(why, str) else "")


def job_state(root: Path) -> tuple[str, ResultView | None, dict[str, Any] | None]:
    """(status, this run's result or None, owner record or None)."""
    found = read_json(root, RESULT)
    result = ResultView.of(found) if found is not None else None
    owner = read_json(root, PRIVATE, JobDir(root).owner.name)
    # an owner whose attempt has no result yet is running (or waits in the scheduler's queue); a result.json of an
    # older attempt says nothing now
    if owner is not None and (result is None or result.attempt != owner.get("attempt")):
        if restart_view(root, owner.get("attempt")) is not None:
            return "RESTARTING", None, owner
        view = scheduler_view(root, owner.get("attempt"))
        return ("PENDING" if view is not None and view.state == "PENDING" else "RUNNING"), None, owner
    if result:
        return result.status, result, owner
    return "PENDING", None, owner


def job_summary(job_id: str, root: Path, now: float | None = None) -> dict[str, Any]:
    """What the job list shows: status, topology, machine, duration, metric."""
    now = time.time() if now is None else now
    status, final, owner = job_state(root)
    running = status in ("RUNNING", "RESTARTING")
    nodes, devices, machine = topology(root, final)
    if final:
        duration, started = final.duration_s, final.started_at
    else:
        started = number(owner.get("started")) if owner else None
        duration = max(0.0, now - started) if running and started else None
    metric_name, metric_value = metric(final)
    attempt = final.attempt if final else (owner or {}).get("attempt")
    view = scheduler_view(root, attempt)
    restarting = restart_view(root, attempt) if status == "RESTARTING" else None
    return clean(
        {
            "id": job_id,
            "num": root.name,
            "name": str((final.name if final else (owner or {}).get("name")) or root.name),
            "sweep": opaque_id(root.parent),
            "status": status,
            "num_nodes": nodes,
            "devices": devices,
            # a job with roles: each role's shape (``trainer 2 x 2 + scorer 1 x 1``), from its roles file
            "roles": _roles_shape(root),
            "machine": machine,
            "duration_s": duration,
            "started_at": started,
            "metric_name": metric_name,
            "metric": metric_value,
            "overrides": overrides(root, final),
            "backend": owner.get("backend") if owner else None,
            "scheduler_id": final.scheduler_id if final else (owner or {}).get("scheduler_id"),
            # SLURM's pending reason while the job waits (or the one that failed it), and what the status alone does not
            # say: why it waits, that it can never start, since when the scheduler does not answer
            "reason": view.reason if view is not None and (view.never_starts or not final) else None,
            "note": restarting.describe() if restarting else view.note(final=bool(final)) if view else None,
        }
    )


def _mtime_ns(root: Path, *parts: str) -> int | None:
    path = inside(root, *parts)
    try:
        return path.stat().st_mtime_ns if path else None
    except OSError:
        return None


def job_detail(job_id: str, root: Path) -> dict[str, Any]:
    """The job page's header: the summary, the failure with its traceback, its logs and metric files."""
    summary = job_summary(job_id, root)
    _, result, _ = job_state(root)
    return clean(
        {
            **summary,
            "path": str(root),
            "error": result.error if result else None,
            "failure": result.failure if result else None,
            "logs": [{"name": f.name, "node": f.node, "rank": f.rank, "role": f.role} for f in log_files(root)],
            "metric_nodes": [node for node, _ in metrics_files(root)],
            "curves_version": _mtime_ns(root, TRAINING_METRICS),
            "return_value": result.return_value if result else None,
            # the runs that failed and were restarted, each with its failure and duration (hydra.launcher.max_restarts)
            "earlier_runs": result.earlier_runs if result else [],
            # the code it runs: its launch's snapshot (id, commit, dirty, source, dir); None: the live tree
            "code": code_view(root),
        }
    )


def code_view(root: Path) -> dict[str, Any] | None:
    """The job's ``snapshot.json``, the fields the page shows (a view: whatever is there, never refused)."""
    data = read_json(root, JobDir(root).snapshot.name)
    if not isinstance(data, dict) or not isinstance(data.get("id"), str):
        return None
    return {key: data.get(key) for key in ("id", "commit", "dirty", "source", "dir")}


# ------------------------------------------------------------------------------------------------------- logs


def read_log(
    path: Path, offset: int | None, whole_lines: bool = True, tail: int = TAIL_BYTES, limit: int = MAX_CHUNK
) -> dict[str, Any] | None:
    """A byte range of a log: its last ``tail`` bytes (``offset`` None, or past the end: the file was
    truncated), else from ``offset``, at most ``limit`` bytes. ``whole_lines``: stop after the last complete
    line, so that a line being written (or a UTF-8 sequence) is never split; ``next``: where to go on."""
    handle = open_regular(path)
    if handle is None:
        return None
    with handle:
        size = os.fstat(handle.fileno()).st_size
        reset = offset is None or offset > size
        start = max(0, size - tail) if offset is None or reset else offset
        handle.seek(start)
        data = handle.read(min(size - start, limit))
    if reset and start > 0:  # begin at a line's start
        cut = data.find(b"\n") + 1
        data, start = data[cut:], start + cut
    if whole_lines:
        last = data.rfind(b"\n")
        if last >= 0:
            data = data[: last + 1]
        elif len(data) < limit:  # only the start of a line: wait for the rest (a longer line is sent cut)
            data = b""
    end = start + len(data)
    return {
        "offset": start,
        "next": end,
        "size": size,
        "reset": reset,
        "more": end < size,
        "text": data.decode("utf-8", errors="replace"),
    }


# ---------------------------------------------------------------------------------------------- node metrics


def metrics_files(root: Path) -> list[tuple[int, Path]]:
    folder = inside(root, METRICS)
    if folder is None:
        return []
    try:
        names = [entry.name for entry in os.scandir(folder)]
    except OSError:
        return []
    found = []
    for name in names:
        match = METRICS_NAME.fullmatch(name)
        path = inside(root, METRICS, name) if match else None
        if match is not None and path is not None and path.is_file():
            found.append((int(match[1]), path))
    return sorted(found)


def _parse_metrics(path: Path, st: os.stat_result) -> list[dict[str, Any]]:
    if st.st_size > MAX_METRICS_BYTES:
        return []
    handle = open_regular(path)
    if handle is None:
        return []
    with handle:
        return parse_samples(handle.read())


def thin(items: list[Any], limit: int) -> list[Any]:
    """At most ``limit`` items spread evenly over ``items``, the last one always kept."""
    if len(items) <= limit:
        return items
    if limit <= 1:
        return items[-1:]
    step = (len(items) - 1) / (limit - 1)
    return [items[round(i * step)] for i in range(limit)]


def node_series(node: int, samples: list[dict[str, Any]]) -> dict[str, Any]:
    """Column arrays for one node's charts; GPUs only as the samples report them (absent on CPU nodes)."""
    gpu_ids: dict[int, str] = {}
    for sample in samples:
        for gpu in sample.get("gpus") or ():
            if isinstance(gpu, dict) and _int(gpu.get("index")) is not None:
                gpu_ids[gpu["index"]] = str(gpu.get("name") or gpu_ids.get(gpu["index"]) or "")
    gpus = []
    for index in sorted(gpu_ids):
        per_sample = []
        for sample in samples:
            found = [g for g in sample.get("gpus") or () if isinstance(g, dict) and g.get("index") == index]
            per_sample.append(found[0] if found else {})
        gpus.append(
            {
                "index": index,
                "name": gpu_ids[index],
                "series": {key: [number(g.get(key)) for g in per_sample] for key in GPU_SERIES},
            }
        )
    host = next((str(s["host"]) for s in reversed(samples) if s.get("host")), None)
    return {
        "node": node,
        "host": host,
        "t": [s["t"] for s in samples],
        "series": {key: [number(s.get(key)) for s in samples] for key in NODE_SERIES},
        "gpus": gpus,
    }


def node_metrics(root: Path, since: float | None = None, limit: int = MAX_POINTS) -> list[dict[str, Any]]:
    """Every node's samples after ``since`` (all when None), thinned to ``limit`` per node."""
    nodes = []
    for node, path in metrics_files(root):
        samples = CACHE.get("metrics", path, _parse_metrics) or []
        if since is not None:
            samples = [s for s in samples if s["t"] > since]
        nodes.append(node_series(node, thin(samples, limit)))
    return nodes


# ----------------------------------------------------------------------------------------- training curves


def parse_curves(text: str) -> dict[str, Any]:
    """metrics.csv's text as the page draws it: one row per step, each column a series with None where a step has
    no value; ``restarts``: the steps where a later run took over (:mod:`mmt.records.training`)."""
    return _curves(training.parse(text))


def _curves(metrics: training.TrainingMetrics) -> dict[str, Any]:
    return {
        "step": list(metrics.steps),
        "series": {name: list(values) for name, values in metrics.series.items()},
        "restarts": list(metrics.restarts),
    }


def _parse_csv(path: Path, st: os.stat_result) -> dict[str, Any]:
    return _curves(training.read(path, MAX_CSV_BYTES))


def training_curves(root: Path, limit: int = MAX_CURVE_POINTS) -> dict[str, Any]:
    path = inside(root, TRAINING_METRICS)
    curves = CACHE.get("curves", path, _parse_csv) if path else None
    if not curves:
        return {"step": [], "series": {}, "restarts": []}
    keep = thin(list(range(len(curves["step"]))), limit)
    return {
        "step": [curves["step"][i] for i in keep],
        "series": {n: [values[i] for i in keep] for n, values in curves["series"].items()},
        "restarts": curves.get("restarts", []),
    }


# ----------------------------------------------------------------------------------------------------- sweeps


def _override_key(text: str) -> str:
    return text.lstrip("+~")


def swept_parameters(jobs: list[dict[str, Any]]) -> dict[str, Any]:
    """The metric against each swept parameter: a parameter is swept when the jobs' overrides differ on it.
    Numeric values are plotted as numbers; others as categories (x = their index)."""
    parsed = []
    for job in jobs:
        pairs = (o.split("=", 1) for o in job.get("overrides") or () if "=" in o)
        parsed.append({_override_key(k): v for k, v in pairs})
    keys: list[str] = []
    for given in parsed:
        keys += [k for k in given if k not in keys]
    names = Counter(j["metric_name"] for j in jobs if j.get("metric_name"))
    params = []
    for key in keys:
        values = [p.get(key) for p in parsed]
        if len(set(values)) < 2:
            continue
        numeric = all(v is not None and to_number(v) is not None for v in values)
        categories = None if numeric else list(dict.fromkeys("" if v is None else v for v in values))
        points = []
        for job, value in zip(jobs, values):
            x = to_number(value or "") if categories is None else categories.index("" if value is None else value)
            points.append(
                {
                    "job": job["id"],
                    "num": job["num"],
                    "x": x,
                    "label": value,
                    "metric": job.get("metric"),
                    "status": job["status"],
                }
            )
        params.append(
            {"name": key, "numeric": numeric, "categories": categories, "points": sorted(points, key=lambda p: p["x"])}
        )
    return {"metric_name": names.most_common(1)[0][0] if names else None, "params": params}


def sweeps(catalog_jobs: dict[str, Path]) -> list[dict[str, Any]]:
    """The job list, grouped by sweep (the job dir's parent), in discovery order."""
    now = time.time()
    grouped: dict[Path, dict[str, Any]] = {}
    for job_id, root in catalog_jobs.items():
        sweep = grouped.setdefault(
            root.parent,
            {
                "id": opaque_id(root.parent),
                "path": str(root.parent),
                "name": "/".join(root.parent.parts[-3:]),
                "jobs": [],
            },
        )
        sweep["jobs"].append(job_summary(job_id, root, now))
    for sweep in grouped.values():
        sweep["counts"] = dict(Counter(j["status"] for j in sweep["jobs"]))
    return list(grouped.values())
