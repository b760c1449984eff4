"""The Hydra launcher: a thin class; the work happens in ``_core`` (the Hydra adapter) and ``mmt.launching``.

Imported during Hydra's plugin discovery, so the engine is imported lazily, inside ``setup()``/``launch()``. A
launcher keeps its backend (and the local host agent) for as long as it lives: every batch a sweeper hands it runs
on the same agent, which imported the recipe's modules once.
"""

import weakref
from typing import TYPE_CHECKING, Any, Optional, Sequence

from hydra.core.utils import JobReturn
from hydra.plugins.launcher import Launcher
from hydra.types import HydraContext, TaskFunction
from omegaconf import DictConfig

if TYPE_CHECKING:  # the engine is imported lazily (plugin discovery stays light)
    from mmt.backends.base import Backend
    from mmt.launching.snapshot import LaunchSnapshot
    from mmt.remote.launch import RemoteLaunch


class MMTLauncher(Launcher):
    """Expands each sweep job into a multi-node run: N nodes x M processes, one output dir, one JobReturn. The
    backend is the launcher config's ``backend`` (a name in ``mmt.backends.registry``)."""

    def __init__(self, **params: Any) -> None:
        # Per-job values (num_nodes, devices, machine ...) are deliberately NOT taken from ``params``: Hydra
        # resolves them once against the master config. They are read from each job's composed config.
        self.config: Optional[DictConfig] = None
        self.task_function: Optional[TaskFunction] = None
        self.hydra_context: Optional[HydraContext] = None
        self.backend: Optional["Backend[Any]"] = None
        self.snapshot: Optional["LaunchSnapshot"] = None
        # the cluster reached over SSH (hydra.launcher.ssh), or None: the jobs run from here
        self.remote: Optional["RemoteLaunch"] = None

    def setup(self, *, hydra_context: HydraContext, task_function: TaskFunction, config: DictConfig) -> None:
        from mmt.launching import prepare
        from mmt.remote import settings as ssh

        self.config = config
        self.hydra_context = hydra_context
        self.task_function = task_function
        prepare.check_sweep_dir(config)
        prepare.keep_composed_jobs(hydra_context)  # the sweeper composes each job to check it; launch() reuses it
        self.backend = prepare.make_backend(config.hydra.launcher)
        target = ssh.of(config.hydra.launcher)
        if target is not None:
            from mmt.remote.launch import RemoteLaunch

            # one connection for the launch, opened (and the cluster checked) while the snapshot is taken here
            self.remote = RemoteLaunch.for_backend(target, self.backend)
            weakref.finalize(self, self.remote.close)
            self.remote.open()
        # the sweep dir is this launch's from here on, before the sweeper writes the sweep's record (multirun.yaml):
        # of two launches into one sweep dir, the second is refused now, whatever the timing
        sweep = prepare.claim_sweep(config, self.backend)
        weakref.finalize(self, sweep.release)
        # the agent lives as long as this launcher: every batch of the sweep, then it goes (at the latest, with the
        # process; an app that launches in-process again gets a new launcher and a new agent)
        weakref.finalize(self, self.backend.close)
        # the code every job of the launch runs, copied once now: an edit after this line reaches no job
        self.snapshot = prepare.take_snapshot(config, task_function)
        if self.snapshot is not None:  # a launch refused before any job opened leaves no snapshot behind
            weakref.finalize(self, self.snapshot.discard_if_unused)
        if self.remote is not None:
            self.remote.local_snapshot = self.snapshot  # synced when the first batch is launched
            return
        # the agent's interpreter starts now, while the sweeper checks the batch
        prepare.warm_up(self.backend, config, self.snapshot)

    def launch(self, job_overrides: Sequence[Sequence[str]], initial_job_idx: int) -> Sequence[JobReturn]:
        from hydra_plugins.mmt_launcher import _core

        assert self.config is not None and self.hydra_context is not None and self.task_function is not None
        assert self.backend is not None
        return _core.launch(self, job_overrides, initial_job_idx)


# mmt's own backends name a class of their own, for Hydra's plugin list (``hydra/launcher`` choices, --info plugins);
# a backend of another package names MMTLauncher itself (mmt.backends.spec.LAUNCHER_TARGET)


class MMTLocalLauncher(MMTLauncher):
    """``hydra/launcher=mmt_local`` (``cluster=local``): N simulated nodes x M processes on this host."""


class MMTSlurmLauncher(MMTLauncher):
    """``hydra/launcher=mmt_slurm`` (``cluster=slurm``): one SLURM job of N nodes per sweep job."""


class MMTRayLauncher(MMTLauncher):
    """``hydra/launcher=mmt_ray`` (``cluster=ray``): one Ray job per sweep job, its nodes one placement group."""
