"""One launch, whatever the front end. The Hydra launcher, the ``mmt`` CLI and the SDK each turn their own input
(a sweeper's batch, command-line flags, a ``Job.run`` call) into prepared jobs and hand them to a session, which
does the rest the same way for all three:

* a dry run: every job's plan rendered, nothing started;
* the registry: opened once for the launch (a launch still runs, unregistered, where it cannot be opened);
* detach: jobs that outlive the caller (SLURM's conclude themselves, local ones get a supervisor), and the one
  refusal that goes with it: a live page cannot outlive a launch that returns at once;
* attached: the local agent warmed before any thread starts, the plotter and the live page started and taken down
  with the launch, the engine run to the end (``mmt.launching.engine``), and the summary, also for a batch whose
  every job was refused.

What comes back says which of the three it was (``DryRun``, ``Detached``, ``Attached``); each front end turns that
into its own output (Hydra's JobReturns, the CLI's exit status, the SDK's handles).
"""

import gc
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, List, Optional, Sequence, Union

from omegaconf import DictConfig, OmegaConf

from mmt.backends.base import Backend
from mmt.core import launch_id
from mmt.core.errors import ConfigError
from mmt.core.states import ConsoleMode, values
from mmt.launching import engine, supervisor
from mmt.launching.console import Console
from mmt.launching.jobs import LaunchOptions, LaunchReport, NotStarted, PreparedJob, Submitted
from mmt.launching.prepare import host_preload
from mmt.launching.report import summarise
from mmt.monitor import plots
from mmt.planning import dryrun
from mmt.planning import validate as check
from mmt.records.registry import Registry, RegistryError


@dataclass(frozen=True)
class SessionSettings:
    """What a launch asks of the session (``hydra.launcher.*``), validated."""

    sweep_dir: Path
    console: ConsoleMode = ConsoleMode.rank0
    detach: bool = False
    dashboard: bool = False
    # the caller may launch again from this process (a sweeper's next batch): summary.png is left drawing, awaited
    # at the process's exit, not at the end of each launch
    plot_awaited_at_exit: bool = False

    @classmethod
    def of(cls, launcher_cfg: DictConfig, sweep_dir: Path) -> "SessionSettings":
        console = check.choice(
            "hydra.launcher.console", OmegaConf.select(launcher_cfg, "console", default="rank0"), values(ConsoleMode)
        )
        return cls(
            sweep_dir=Path(sweep_dir),
            console=ConsoleMode(console),
            detach=bool(OmegaConf.select(launcher_cfg, "detach")),
            dashboard=bool(OmegaConf.select(launcher_cfg, "dashboard")),
        )

    def refuse_what_cannot_be_done(self, what: str = "launch") -> None:
        """A live page lasts as long as an attached launch; a detached one returns at once. ``what``: the front
        end's word for it (a Hydra launch, a CLI or SDK run)."""
        if self.detach and self.dashboard:
            raise ConfigError(
                "hydra.launcher.dashboard",
                True,
                f"the live page lasts as long as an attached {what}, and a detached one returns at once",
                "leave it out, and run `mmt dashboard` when you want the page: it shows every registered job",
            )


@dataclass(frozen=True)
class DryRun:
    """Every job's plan as a dry run prints it; nothing was started."""

    backend: str
    renders: List[str]


@dataclass(frozen=True)
class Detached:
    """The jobs were submitted and run on without the caller."""

    submitted: List[Submitted]


@dataclass(frozen=True)
class Attached:
    """The jobs ran to their end (or the launch was interrupted or detached on a hangup), and were summarised."""

    report: LaunchReport


Outcome = Union[DryRun, Detached, Attached]


def open_registry() -> Optional[Registry]:
    """The job registry; a launch still runs (its job dirs are the truth) where the registry cannot be opened."""
    registry = Registry()
    try:
        registry.names_taken([])
    except RegistryError as exc:
        print(
            f"mmt: WARNING the job registry {registry.path} cannot be used ({exc}); jobs run unregistered",
            file=sys.stderr,
        )
        return None
    return registry


def detached_submit(jobs: List[PreparedJob], backend: Backend[Any], options: LaunchOptions) -> List[Submitted]:
    """Start jobs that outlive this process: SLURM's conclude themselves; local ones get a supervisor."""
    if options.registry is None:
        raise ConfigError(
            "hydra.launcher.detach",
            True,
            "detached jobs are found again through the job registry, which cannot be opened here",
            "fix MMT_HOME (or ~/.mmt), or run attached",
        )
    if backend.survives_launcher:
        return engine.submit(jobs, backend, options)
    return supervisor.start(jobs, backend, options, launch_id.current().launch)


def start_plotter(sweep_dir: Path, job_dirs: Sequence[str]) -> None:
    """summary.png's drawer imports matplotlib while the jobs run, when the sweep will have a plot worth it."""
    if plots.sweep_may_be_drawn(sweep_dir, job_dirs):
        plots.Plotter.start()


def start_dashboard(sweep_dir: Path, console: Console) -> Any:
    """The live page for this launch (it ends with the launch)."""
    from mmt.dashboard.background import BackgroundDashboard  # the page's server: only when asked for

    page = BackgroundDashboard([sweep_dir])
    console.write(
        f"mmt: live page: {page.url or 'could not start (see the log above)'}  (later: mmt dashboard {sweep_dir})\n"
    )
    return page


class LaunchSession:
    def __init__(self, backend: Backend[Any], settings: SessionSettings, what: str = "launch") -> None:
        self.backend, self.settings, self.what = backend, settings, what

    def run(
        self,
        jobs: Sequence[PreparedJob],
        not_started: Sequence[NotStarted] = (),
        console: Optional[Console] = None,
    ) -> Outcome:
        """Dry-run, detach or run ``jobs``; ``not_started``: the batch's jobs refused before (rows of the summary)."""
        if any(job.plan.dry_run for job in jobs):
            return DryRun(self.backend.name, [dryrun.render(job.plan, self.backend.describe(job.plan)) for job in jobs])
        self.settings.refuse_what_cannot_be_done(self.what)
        options = LaunchOptions(
            sweep_dir=self.settings.sweep_dir, console=self.settings.console, registry=open_registry()
        )
        if self.settings.detach:
            return Detached(detached_submit(list(jobs), self.backend, options))
        return Attached(self._attached(jobs, not_started, options, console))

    def _attached(
        self,
        jobs: Sequence[PreparedJob],
        not_started: Sequence[NotStarted],
        options: LaunchOptions,
        console: Optional[Console],
    ) -> LaunchReport:
        if jobs:  # the local agent is forked before any thread of this process starts (mmt.agent.client)
            self.backend.warm_up(host_preload(jobs[0].plan), jobs[0].plan.snapshot)
        start_plotter(options.sweep_dir, [job.plan.job_dir for job in jobs])
        console = console or Console()
        page = start_dashboard(options.sweep_dir, console) if self.settings.dashboard else None
        # the prepared jobs live as long as the launch: out of the cyclic collector's sight while it watches, or
        # every full collection (reading a job's return value makes some) walks all of them: a 100-job sweep's
        # launcher spent 7 s of CPU in them. The young generations are collected first, so that little garbage is
        # kept with them (the rest is collected after the launch); a full collection would cost each batch of a
        # sweeper that sends one job at a time 17 ms
        gc.collect(1)
        gc.freeze()
        try:
            if jobs:
                return engine.launch(jobs, self.backend, options, console, not_started=not_started)
            report = LaunchReport(jobs=[])
            summarise(options.sweep_dir, report, console, not_started=not_started)
            return report
        finally:
            gc.unfreeze()
            if page is not None:
                page.close()
            if not self.settings.plot_awaited_at_exit:
                for unwritten in plots.Plotter.settle():
                    console.write(f"mmt: could not write {unwritten}\n")
            console.close()
