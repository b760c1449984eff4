"""Running the tuner: each candidate micro-batch in a fresh process under the per-device memory budget, the search
over them (``mmt.tune.search``), and the entry it writes into the recipe's tuned table (``mmt.planning.tuned``)."""

from __future__ import annotations

import datetime
import json
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
from typing import Any, Dict, List, Optional

from mmt.core import rank_env
from mmt.planning import tuned
from mmt.tune.search import Trial, TuneError, TuneSettings, choose, confirm, refine, search, sweep

GIB = 1024**3

# what a trial writes: whether the micro-batch fits and how fast it ran (mmt.tune.trial)
TRIAL_RECORD = "trial.json"


class TrialRunner:
    """Runs one candidate of ``recipe`` (a resolved recipe config with ``_target_``) in a fresh process."""

    def __init__(
        self,
        recipe: Dict[str, Any],
        *,
        accelerator: str,
        budget_gb: float,
        threads: int,
        workdir: Path,
        timeout_s: float,
    ) -> None:
        self.recipe, self.accelerator, self.threads = recipe, accelerator, threads
        self.budget_bytes = int(budget_gb * GIB)
        self.workdir, self.timeout_s = workdir, timeout_s

    def _env(self, micro: int, job_dir: Path) -> Dict[str, str]:
        with socket.socket() as probe:  # a free port, should the recipe form a (single-rank) process group
            probe.bind(("127.0.0.1", 0))
            port = probe.getsockname()[1]
        env = rank_env.scrubbed(os.environ)
        env.update(
            rank_env.contract_env(
                rank_env.RankPlace(0, 0, 1, 1),
                per_node=False,
                master_addr="127.0.0.1",
                master_port=port,
                job_dir=str(job_dir),
                job_id=f"tune-{micro}",
                extra=rank_env.batch_env(micro, micro, 1),
            )
        )
        env["OMP_NUM_THREADS"] = str(self.threads)  # a device's share of the node, as in a job
        # one device: the first visible GPU; a CPU trial on a GPU host keeps its hands off the GPUs
        visible = os.environ.get("CUDA_VISIBLE_DEVICES", "0").split(",")[0]
        env["CUDA_VISIBLE_DEVICES"] = visible if self.accelerator == "gpu" else ""
        return env

    def __call__(self, micro: int) -> Trial:
        job_dir = Path(tempfile.mkdtemp(prefix=f"micro{micro}.", dir=self.workdir))
        spec = {
            "recipe": self.recipe,
            "accelerator": self.accelerator,
            "budget_bytes": self.budget_bytes,
            "sys_path": list(sys.path),
            # the trial's own record (fits or not, samples/s), not a job's result.json: another schema, another name
            "result": str(job_dir / TRIAL_RECORD),
            "tuner_pid": os.getpid(),
        }
        (job_dir / "spec.json").write_text(json.dumps(spec))
        started = time.monotonic()
        with open(self.workdir / f"micro{micro}.log", "w") as log:
            process = subprocess.Popen(
                [sys.executable, "-m", "mmt.tune.trial", str(job_dir / "spec.json")],
                env=self._env(micro, job_dir),
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
            )
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
            record = json.loads((job_dir / TRIAL_RECORD).read_text())
        except (OSError, ValueError):
            record = {}
        shutil.rmtree(job_dir, ignore_errors=True)  # the trial's checkpoints and metrics; its log stays
        if code == 0 and record.get("status") == "fits":
            return Trial(
                micro,
                True,
                samples_per_s=record["samples_per_s"],
                seconds=seconds,
                peak_rss_mb=record.get("peak_rss_mb"),
            )
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
    budget = tuned.device_memory_gb(
        gpus=machine.get("gpus"),
        gpu_memory_gb=machine.get("gpu_memory_gb"),
        memory_gb=machine.get("memory_gb"),
        devices=devices,
    )
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
    return {
        "cpus": len(os.sched_getaffinity(0)),
        "memory_gb": round(memory, 1),
        "platform": platform.platform(),
        "load_avg_1m_before": round(load_before, 2),
        "load_avg_1m_after": round(os.getloadavg()[0], 2),
    }


def entry(
    *,
    recipe: str,
    machine: str,
    precision: str,
    settings: TuneSettings,
    trials: List[Trial],
    chosen: Trial,
    largest: int,
    cap: int,
    enforced_by: str,
    recipe_overrides: Dict[str, Any],
    load_before: float,
    runs: int,
) -> Dict[str, Any]:
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
        "candidates": {
            t.micro: round(t.samples_per_s or 0.0, 2) if t.fits else t.why.split(":")[0]
            for t in sorted(trials, key=lambda t: t.micro)
        },
        "search": {
            "start": settings.start,
            "max_micro": settings.max_micro,
            "max_trials": settings.max_trials,
            "resolution": settings.resolution,
            "margin": settings.margin,
            "tie": settings.tie,
            "refine_trials": settings.refine_trials,
            "confirm_trials": settings.confirm_trials,
            "trials": runs,
            "seconds": round(sum(t.seconds for t in trials), 1),
            "budget_enforced_by": enforced_by,
        },
        "trial_recipe": recipe_overrides,
        "tuned_at": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "versions": _versions(),
        "host": _host(load_before),
    }


def _describe(trial: Trial) -> str:
    if trial.fits:
        return f"micro {trial.micro:>5}: fits, {trial.samples_per_s:.1f} samples/s ({trial.seconds:.1f} s)"
    return f"micro {trial.micro:>5}: does not fit ({trial.why}) ({trial.seconds:.1f} s)"


# the tune.* options that TuneSettings takes as they are (when set)
_SEARCH_OPTIONS = (
    "margin",
    "start",
    "max_micro",
    "max_trials",
    "resolution",
    "tie",
    "trial_timeout_s",
    "refine_trials",
    "confirm_trials",
)
_MODES = ("search", "sweep")


def _section(cfg: Any, key: str) -> Dict[str, Any]:
    """A section of the composed config as a plain dict (empty when it is missing or not a mapping)."""
    from omegaconf import OmegaConf

    node = OmegaConf.select(cfg, key, default=None)
    value = OmegaConf.to_container(node, resolve=True) if node is not None else {}
    return {str(k): v for k, v in value.items()} if isinstance(value, dict) else {}


@dataclass(frozen=True)
class _Target:
    """What is tuned: the recipe's batch section, the tune options, the machine and its devices."""

    batch: Dict[str, Any]
    options: Dict[str, Any]
    machine: Dict[str, Any]
    devices: int

    @classmethod
    def of(cls, cfg: Any) -> "_Target":
        from omegaconf import OmegaConf

        batch, options, machine = _section(cfg, "batch"), _section(cfg, "tune"), _section(cfg, "machine")
        if not batch.get("recipe") or not (options.get("table") or batch.get("table")):
            raise TuneError(
                "the recipe's config has no batch.recipe / batch.table: there is no table to tune for. "
                "HINT: add a batch section (see conf/recipe/lm.yaml)"
            )
        if not machine.get("name"):
            raise TuneError("no machine: pick one with machine=<name>")
        devices = OmegaConf.select(cfg, "devices", default=None) or (machine.get("gpus") or 1)
        return cls(batch, options, machine, devices)

    @property
    def accelerator(self) -> str:
        return str(self.machine.get("accelerator", "cpu"))

    def settings(self) -> TuneSettings:
        budget = budget_gb(self.machine, self.devices, self.options.get("budget_gb"))
        given = {k: self.options[k] for k in _SEARCH_OPTIONS if self.options.get(k) is not None}
        return TuneSettings(budget_gb=budget, **given)

    def recipe(self, cfg: Any) -> Dict[str, Any]:
        """The recipe a trial runs: the app's, with the tuner's overrides (``tune.recipe``)."""
        recipe = _section(cfg, "recipe")
        recipe.update(self.options.get("recipe") or {})
        return recipe

    def table(self) -> Path:
        return tuned.table_path(str(self.options.get("table") or self.batch["table"]))


def _announce(target: _Target, settings: TuneSettings, threads: int, workdir: Path, out: Any) -> float:
    """Say what is tuned, and warn of a busy host; returns the load average before the first trial."""
    print(
        f"tune: recipe {target.batch['recipe']} on {target.machine['name']} ({target.accelerator}), "
        f"precision {target.batch.get('precision')}, "
        f"{settings.budget_gb:g} GiB per device, {threads} threads; candidates {settings.start}.."
        f"{settings.max_micro}, at most {settings.max_trials} trials; logs in {workdir}",
        file=out,
        flush=True,
    )
    load_before = os.getloadavg()[0]
    if load_before > len(os.sched_getaffinity(0)):  # every CPU already busy (our own last trial adds ~1)
        print(
            f"tune: WARNING the host is busy (load {load_before:.1f} on {len(os.sched_getaffinity(0))} CPUs): "
            "samples/s will be disturbed; the entry records the load",
            file=out,
            flush=True,
        )
    return load_before


class _LoggedRunner:
    """The trial runner as the search calls it: each trial counted and printed; the first candidate failing for
    another reason than memory stops the tuner."""

    def __init__(self, runner: TrialRunner, settings: TuneSettings, workdir: Path, out: Any) -> None:
        self.runner, self.settings, self.workdir, self.out = runner, settings, workdir, out
        self.runs: List[int] = []

    def __call__(self, micro: int) -> Trial:
        self.runs.append(micro)
        trial = self.runner(micro)
        print("tune: " + _describe(trial), file=self.out, flush=True)
        if not trial.fits and trial.why.startswith("error") and micro == self.settings.start:
            raise TuneError(
                f"the first candidate failed for another reason than memory: {trial.why}. "
                f"Log: {self.workdir / f'micro{micro}.log'}"
            )
        return trial


def _measure(logged: _LoggedRunner, settings: TuneSettings, mode: str) -> List[Trial]:
    """Every trial of the search (or the sweep), with the margin's cap measured so that it can be chosen."""
    if mode not in _MODES:
        raise TuneError(f"tune.mode={mode!r}: expected search or sweep")
    trials = search(logged, settings) if mode == "search" else sweep(logged, settings)
    _, _, cap = choose(trials, settings)
    if cap and not any(t.micro == cap for t in trials):
        trials.append(logged(cap))  # measure what the margin leaves, so that it can be chosen
    if mode == "search":
        refine(logged, trials, settings)
        confirm(logged, trials, settings)
    return trials


def run(cfg: Any, workdir: Path, out: Any = sys.stdout) -> Dict[str, Any]:
    """Tune the recipe of a composed app config (``tune.py``'s); write and return the table entry."""
    target = _Target.of(cfg)
    settings = target.settings()
    recipe = target.recipe(cfg)
    path = target.table()
    threads = max(1, len(os.sched_getaffinity(0)) // target.devices)
    workdir.mkdir(parents=True, exist_ok=True)
    load_before = _announce(target, settings, threads, workdir, out)
    runner = TrialRunner(
        recipe,
        accelerator=target.accelerator,
        budget_gb=settings.budget_gb,
        threads=threads,
        workdir=workdir,
        timeout_s=settings.trial_timeout_s,
    )
    logged = _LoggedRunner(runner, settings, workdir, out)
    trials = _measure(logged, settings, target.options.get("mode") or "search")
    chosen, largest, cap = choose(trials, settings)
    if chosen is None:
        raise TuneError(
            f"no candidate fits {settings.budget_gb:g} GiB per device: " + "; ".join(_describe(t) for t in trials)
        )
    result = entry(
        recipe=str(target.batch["recipe"]),
        machine=str(target.machine["name"]),
        precision=str(target.batch.get("precision", "32-true")),
        settings=settings,
        trials=trials,
        chosen=chosen,
        largest=largest,
        cap=cap,
        enforced_by="torch.cuda.set_per_process_memory_fraction" if target.accelerator == "gpu" else "RLIMIT_DATA",
        recipe_overrides=target.options.get("recipe") or {},
        load_before=load_before,
        runs=len(logged.runs),
    )
    tuned.write_entry(path, result)
    print(
        f"tune: largest fit {largest}, margin cap {cap}; limit {chosen.micro} "
        f"({chosen.samples_per_s:.1f} samples/s) written to {path}",
        file=out,
        flush=True,
    )
    return result
