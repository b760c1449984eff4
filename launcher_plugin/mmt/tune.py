"""The micro-batch tuner: the largest micro-batch a recipe fits in one device's memory, and the fastest one below it.

Each candidate runs the real recipe for a few steps in a fresh process (``mmt._trial``) under the machine's
memory budget per device, so an out-of-memory error or a kill ends that trial, not the search. The search
doubles from ``start`` until a candidate does not fit (or ``max_micro`` fits), then bisects the gap, never running
more than ``max_trials`` candidates. A safety margin caps the result at ``largest fit x (1 - margin)``: training
runs longer than a trial (validation and checkpoint peaks, fragmentation, DDP's gradient buckets: the trial runs
one process). Throughput often peaks below the memory maximum, between the powers of two the search measured, so
up to ``refine_trials`` more candidates probe around the fastest one, and the ``confirm_trials`` fastest are
measured twice; of the candidates that fit below the cap, the fastest (samples/s) is the limit. The entry goes into the recipe's tuned table with how it was measured.

Lightning's batch-size finder is not used: it refuses distributed strategies, tunes inside the live process (an
OOM can leave it unusable, and a kill ends everything), and in 2.6.6 returns ``max_val`` untried.

    python tune.py recipe=lm machine=cpu                  # writes recipes/tuned/lm.yaml
    python tune.py recipe=lm machine=cpu devices=2        # CPU: the node's memory shared by 2 processes
    python tune.py recipe=lm tune.budget_gb=1.5 tune.table=/tmp/lm.yaml   # a small budget, a scratch table
"""

from __future__ import annotations

import datetime
import json
import math
import os
import platform
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Tuple

from mmt import rank_env, tuned

GIB = 1024 ** 3


class TuneError(RuntimeError):
    """The search cannot give an answer (nothing fits, or the smallest candidate fails for another reason)."""


@dataclass(frozen=True)
class TuneSettings:
    budget_gb: float
    margin: float = 0.1
    start: int = 1
    max_micro: int = 1024
    max_trials: int = 16
    resolution: float = 0.05
    tie: float = 0.0
    trial_timeout_s: float = 600.0
    refine_trials: int = 4
    confirm_trials: int = 3

    def __post_init__(self) -> None:
        checks = [(self.budget_gb > 0, "tune.budget_gb must be > 0"),
                  (0 <= self.margin < 1, "tune.margin must be in [0, 1)"),
                  (1 <= self.start <= self.max_micro, "need 1 <= tune.start <= tune.max_micro"),
                  (self.max_trials >= 2, "tune.max_trials must be >= 2"),
                  (0 <= self.resolution < 1 and 0 <= self.tie < 1, "tune.resolution and tune.tie are in [0, 1)"),
                  (self.trial_timeout_s > 0, "tune.trial_timeout_s must be > 0"),
                  (self.refine_trials >= 0 and self.confirm_trials >= 0,
                   "tune.refine_trials and tune.confirm_trials must be >= 0")]
        for ok, message in checks:
            if not ok:
                raise ValueError(message)


@dataclass(frozen=True)
class Trial:
    micro: int
    fits: bool
    samples_per_s: Optional[float] = None
    why: str = ""  # why it does not fit: "oom: ...", "killed by SIGKILL", "error: ...", "timeout"
    seconds: float = 0.0
    peak_rss_mb: Optional[float] = None


def search(run: Callable[[int], Trial], settings: TuneSettings) -> List[Trial]:
    """Every trial run, in order: doubling from ``start`` to the first misfit, then bisection."""
    trials: List[Trial] = []

    def attempt(micro: int) -> Trial:
        trial = run(micro)
        assert trial.micro == micro
        trials.append(trial)
        return trial

    fit, misfit = 0, None  # largest known fit, smallest known misfit
    micro = settings.start
    while len(trials) < settings.max_trials:
        if attempt(micro).fits:
            fit = micro
            if micro == settings.max_micro:
                break
            micro = min(2 * micro, settings.max_micro)
        else:
            misfit = micro
            break
    while misfit is not None and misfit - fit > max(1, math.floor(fit * settings.resolution)) and \
            len(trials) < settings.max_trials:
        micro = (fit + misfit) // 2
        if attempt(micro).fits:
            fit = micro
        else:
            misfit = micro
    return trials


def refine(run: Callable[[int], Trial], trials: List[Trial], settings: TuneSettings) -> List[Trial]:
    """Up to ``refine_trials`` more candidates around the fastest one below the margin cap, appended to ``trials``.

    The search measures powers of two and points near the memory limit; throughput usually peaks somewhere in
    between, so probe the midpoints between the fastest candidate and its measured neighbours, and repeat around
    whichever is then fastest.
    """
    budget = settings.refine_trials
    while budget > 0:
        _, _, cap = choose(trials, settings)
        fitting = {t.micro: t.samples_per_s for t in trials if t.fits and t.samples_per_s and t.micro <= cap}
        if not fitting:
            break
        ordered = sorted(fitting)
        best = max(ordered, key=lambda m: fitting[m])
        at = ordered.index(best)
        neighbours = ordered[max(0, at - 1):at] + ordered[at + 1:at + 2]
        tried = {t.micro for t in trials}
        points = [p for p in ((best + n) // 2 for n in neighbours) if p not in tried]
        if not points:
            break
        for point in points[:budget]:
            trials.append(run(point))
            budget -= 1
    return trials


def confirm(run: Callable[[int], Trial], trials: List[Trial], settings: TuneSettings) -> List[Trial]:
    """Measure the ``confirm_trials`` fastest candidates below the cap again; keep the mean of both runs.

    One short trial is noisy (other work on the host, frequency changes), and the fastest of many noisy numbers
    is biased upwards: a second measurement of the contenders keeps a lucky one from being chosen. A contender
    that does not fit the second time is dropped (memory that close to the edge is no limit to rely on).
    """
    _, _, cap = choose(trials, settings)
    contenders = sorted((t for t in trials if t.fits and t.samples_per_s and t.micro <= cap),
                        key=lambda t: -t.samples_per_s)[:settings.confirm_trials]
    for first in contenders:
        again = run(first.micro)
        trials.remove(first)
        if again.fits and again.samples_per_s:
            trials.append(Trial(first.micro, True, samples_per_s=(first.samples_per_s + again.samples_per_s) / 2,
                                seconds=first.seconds + again.seconds, peak_rss_mb=again.peak_rss_mb))
        else:
            trials.append(again)
    return trials


def sweep(run: Callable[[int], Trial], settings: TuneSettings) -> List[Trial]:
    """Every candidate from ``start`` up to the first misfit or ``max_micro`` (no trial limit): to check search()."""
    trials: List[Trial] = []
    for micro in range(settings.start, settings.max_micro + 1):
        trials.append(run(micro))
        if not trials[-1].fits:
            break
    return trials


def choose(trials: List[Trial], settings: TuneSettings) -> Tuple[Optional[Trial], int, int]:
    """(the limit's trial, largest fit, margin cap): the fastest fitting candidate at or below the cap.

    Candidates within ``tie`` of the fastest count as equally fast (trials are short and noisy): the smallest of
    them wins, for its memory headroom; a plateau of throughput is no reason to sit near the memory limit.
    """
    fitting = [t for t in trials if t.fits and t.samples_per_s]
    largest = max((t.micro for t in fitting), default=0)
    cap = max(1, math.floor(largest * (1 - settings.margin))) if largest else 0
    below = [t for t in fitting if t.micro <= cap]
    if not below:
        return None, largest, cap
    best = max(t.samples_per_s for t in below)
    fast = [t for t in below if t.samples_per_s >= best * (1 - settings.tie)]
    return min(fast, key=lambda t: t.micro), largest, cap


class TrialRunner:
    """Runs one candidate of ``recipe`` (a resolved recipe config with ``_target_``) in a fresh process."""

    def __init__(self, recipe: Dict[str, Any], *, accelerator: str, budget_gb: float, threads: int,
                 workdir: Path, timeout_s: float) -> None:
        self.recipe, self.accelerator, self.threads = recipe, accelerator, threads
        self.budget_bytes = int(budget_gb * GIB)
        self.workdir, self.timeout_s = workdir, timeout_s

    def _env(self, micro: int, job_dir: Path) -> Dict[str, str]:
        with socket.socket() as probe:  # a free port, should the recipe form a (single-rank) process group
            probe.bind(("127.0.0.1", 0))
            port = probe.getsockname()[1]
        env = rank_env.rank_env(rank_env.RankPlace(0, 0, 1, 1), master_addr="127.0.0.1", master_port=port,
                                job_dir=str(job_dir), job_id=f"tune-{micro}", base_env=os.environ, job_env={},
                                cores_per_node=self.threads, extra=rank_env.batch_env(micro, micro, 1))
        env["OMP_NUM_THREADS"] = str(self.threads)  # a device's share of the node, as in a job
        # one device: the first visible GPU; a CPU trial on a GPU host keeps its hands off the GPUs
        visible = os.environ.get("CUDA_VISIBLE_DEVICES", "0").split(",")[0]
        env["CUDA_VISIBLE_DEVICES"] = visible if self.accelerator == "gpu" else ""
        return env

    def __call__(self, micro: int) -> Trial:
        job_dir = Path(tempfile.mkdtemp(prefix=f"micro{micro}.", dir=self.workdir))
        spec = {"recipe": self.recipe, "accelerator": self.accelerator, "budget_bytes": self.budget_bytes,
                "sys_path": list(sys.path), "result": str(job_dir / "result.json"), "tuner_pid": os.getpid()}
        (job_dir / "spec.json").write_text(json.dumps(spec))
        started = time.monotonic()
        with open(self.workdir / f"micro{micro}.log", "w") as log:
            process = subprocess.Popen([sys.executable, "-m", "mmt._trial", str(job_dir / "spec.json")],
                                       env=self._env(micro, job_dir), stdout=log, stderr=subprocess.STDOUT,
                                       stdin=subprocess.DEVNULL, start_new_session=True)
            try:
                code = process.wait(timeout=self.timeout_s)
            except subprocess.TimeoutExpired:
                _kill(process)
                shutil.rmtree(job_dir, ignore_errors=True)
                return Trial(micro, False, why=f"timeout after {self.timeout_s:g} s", seconds=self.timeout_s)
            except BaseException:  # Ctrl-C: the trial (in a session of its own) goes with us
                _kill(process)
                raise
        seconds = time.monotonic() - started
        try:
            record = json.loads((job_dir / "result.json").read_text())
        except (OSError, ValueError):
            record = {}
        shutil.rmtree(job_dir, ignore_errors=True)  # the trial's checkpoints and metrics; its log stays
        if code == 0 and record.get("status") == "fits":
            return Trial(micro, True, samples_per_s=record["samples_per_s"], seconds=seconds,
                         peak_rss_mb=record.get("peak_rss_mb"))
        if code < 0:
            why = f"killed by {_signal_name(-code)}"
        elif record.get("status") in ("oom", "error"):
            why = f"{record['status']}: {record.get('error', '')}"
        else:
            why = f"exit {code} without a report"
        return Trial(micro, False, why=why, seconds=seconds, peak_rss_mb=record.get("peak_rss_mb"))


def _kill(process: subprocess.Popen) -> None:
    try:
        os.killpg(process.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    process.wait()


def _signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"


def budget_gb(machine: Dict[str, Any], devices: int, override: Optional[float]) -> float:
    """Memory per device: the override, else the GPU's memory, else the node's memory shared by its processes."""
    if override is not None:
        return float(override)
    budget = tuned.device_memory_gb(gpus=machine.get("gpus"), gpu_memory_gb=machine.get("gpu_memory_gb"),
                                    memory_gb=machine.get("memory_gb"), devices=devices)
    if budget is None:
        stated = "gpu_memory_gb" if machine.get("gpus") else "memory_gb"
        raise TuneError(f"machine {machine.get('name')!r} states no {stated}; set tune.budget_gb")
    return budget


def _versions() -> Dict[str, str]:
    from importlib import metadata

    found = {"python": platform.python_version()}
    for name in ("torch", "lightning", "mmt"):
        try:
            found[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            pass
    return found


def _host(load_before: float) -> Dict[str, Any]:
    """Where it was measured; the load averages flag measurements disturbed by other work on the host."""
    memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / GIB
    return {"cpus": len(os.sched_getaffinity(0)), "memory_gb": round(memory, 1), "platform": platform.platform(),
            "load_avg_1m_before": round(load_before, 2), "load_avg_1m_after": round(os.getloadavg()[0], 2)}


def entry(*, recipe: str, machine: str, precision: str, settings: TuneSettings, trials: List[Trial],
          chosen: Trial, largest: int, cap: int, enforced_by: str,
          recipe_overrides: Dict[str, Any], load_before: float, runs: int) -> Dict[str, Any]:
    """The table entry, with everything needed to judge or redo it."""
    return {
        "recipe": recipe,
        "machine": machine,
        "precision": tuned.normalize_precision(precision),
        "memory_per_device_gb": round(settings.budget_gb, 3),
        "micro_batch": chosen.micro,
        "samples_per_s": round(chosen.samples_per_s or 0.0, 2),
        "max_fit": largest,
        "margin_cap": cap,
        "capped_by_max_micro": largest == settings.max_micro,
        # samples/s of each candidate that fits; why the others do not (oom, killed by ..., error, timeout)
        "candidates": {t.micro: round(t.samples_per_s, 2) if t.fits else t.why.split(":")[0]
                       for t in sorted(trials, key=lambda t: t.micro)},
        "search": {"start": settings.start, "max_micro": settings.max_micro, "max_trials": settings.max_trials,
                   "resolution": settings.resolution, "margin": settings.margin, "tie": settings.tie,
                   "refine_trials": settings.refine_trials, "confirm_trials": settings.confirm_trials,
                   "trials": runs, "seconds": round(sum(t.seconds for t in trials), 1),
                   "budget_enforced_by": enforced_by},
        "trial_recipe": recipe_overrides,
        "tuned_at": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "versions": _versions(),
        "host": _host(load_before),
    }


def _describe(trial: Trial) -> str:
    if trial.fits:
        return f"micro {trial.micro:>5}: fits, {trial.samples_per_s:.1f} samples/s ({trial.seconds:.1f} s)"
    return f"micro {trial.micro:>5}: does not fit ({trial.why}) ({trial.seconds:.1f} s)"


def run(cfg: Any, workdir: Path, out: Any = sys.stdout) -> Dict[str, Any]:
    """Tune the recipe of a composed app config (``tune.py``'s); write and return the table entry."""
    from omegaconf import OmegaConf

    def section(key: str) -> Dict[str, Any]:
        node = OmegaConf.select(cfg, key, default=None)
        return OmegaConf.to_container(node, resolve=True) if node is not None else {}

    batch, options, machine = section("batch"), section("tune"), section("machine")
    if not batch.get("recipe") or not (options.get("table") or batch.get("table")):
        raise TuneError("the recipe's config has no batch.recipe / batch.table: there is no table to tune for. "
                        "HINT: add a batch section (see conf/recipe/lm.yaml)")
    if not machine.get("name"):
        raise TuneError("no machine: pick one with machine=<name>")
    devices = OmegaConf.select(cfg, "devices", default=None) or (machine.get("gpus") or 1)
    settings = TuneSettings(
        budget_gb=budget_gb(machine, devices, options.get("budget_gb")),
        **{k: options[k] for k in ("margin", "start", "max_micro", "max_trials", "resolution", "tie",
                                   "trial_timeout_s", "refine_trials", "confirm_trials")
           if options.get(k) is not None})
    recipe = section("recipe")
    recipe.update(options.get("recipe") or {})
    path = tuned.table_path(str(options.get("table") or batch["table"]))
    accelerator = str(machine.get("accelerator", "cpu"))
    threads = max(1, len(os.sched_getaffinity(0)) // devices)
    workdir.mkdir(parents=True, exist_ok=True)
    print(f"tune: recipe {batch['recipe']} on {machine['name']} ({accelerator}), "
          f"precision {batch.get('precision')}, "
          f"{settings.budget_gb:g} GiB per device, {threads} threads; candidates {settings.start}.."
          f"{settings.max_micro}, at most {settings.max_trials} trials; logs in {workdir}", file=out, flush=True)
    load_before = os.getloadavg()[0]
    if load_before > len(os.sched_getaffinity(0)):  # every CPU already busy (our own last trial adds ~1)
        print(f"tune: WARNING the host is busy (load {load_before:.1f} on {len(os.sched_getaffinity(0))} CPUs): "
              "samples/s will be disturbed; the entry records the load", file=out, flush=True)
    runner = TrialRunner(recipe, accelerator=accelerator, budget_gb=settings.budget_gb, threads=threads,
                         workdir=workdir, timeout_s=settings.trial_timeout_s)

    runs = []

    def logged(micro: int) -> Trial:
        runs.append(micro)
        trial = runner(micro)
        print("tune: " + _describe(trial), file=out, flush=True)
        if not trial.fits and trial.why.startswith("error") and micro == settings.start:
            raise TuneError(f"the first candidate failed for another reason than memory: {trial.why}. "
                            f"Log: {workdir / f'micro{micro}.log'}")
        return trial

    mode = options.get("mode") or "search"
    if mode not in ("search", "sweep"):
        raise TuneError(f"tune.mode={mode!r}: expected search or sweep")
    trials = search(logged, settings) if mode == "search" else sweep(logged, settings)
    _, _, cap = choose(trials, settings)
    if cap and not any(t.micro == cap for t in trials):
        trials.append(logged(cap))  # measure what the margin leaves, so that it can be chosen
    if mode == "search":
        refine(logged, trials, settings)
        confirm(logged, trials, settings)
    chosen, largest, cap = choose(trials, settings)
    if chosen is None:
        raise TuneError(f"no candidate fits {settings.budget_gb:g} GiB per device: " +
                        "; ".join(_describe(t) for t in trials))
    result = entry(recipe=str(batch["recipe"]), machine=str(machine["name"]),
                   precision=str(batch.get("precision", "32-true")), settings=settings, trials=trials,
                   chosen=chosen, largest=largest, cap=cap,
                   enforced_by="torch.cuda.set_per_process_memory_fraction" if accelerator == "gpu"
                   else "RLIMIT_DATA", recipe_overrides=options.get("recipe") or {}, load_before=load_before, runs=len(runs))
    tuned.write_entry(path, result)
    print(f"tune: largest fit {largest}, margin cap {cap}; limit {chosen.micro} "
          f"({chosen.samples_per_s:.1f} samples/s) written to {path}", file=out, flush=True)
    return result
