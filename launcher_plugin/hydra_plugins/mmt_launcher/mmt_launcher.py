"""The Hydra launchers: one thin class per backend; the work happens in ``_core`` and the backend modules.

Imported during Hydra's plugin discovery, so heavy modules are imported lazily, inside ``launch()``.
"""

import logging
from typing import Any, ClassVar, Optional, Sequence

from hydra.core.utils import JobReturn
from hydra.plugins.launcher import Launcher
from hydra.types import HydraContext, TaskFunction
from omegaconf import DictConfig

log = logging.getLogger(__name__)


class MMTLauncher(Launcher):
    """Expands each sweep job into a multi-node run: N nodes x M processes, one output dir, one JobReturn."""

    BACKEND: ClassVar[str] = ""

    def __init__(self, **params: Any) -> None:
        # Per-job values (num_nodes, devices, machine ...) are deliberately NOT taken from ``params``: Hydra
        # resolves them once against the master config. They are read from each job's composed config.
        self.config: Optional[DictConfig] = None
        self.task_function: Optional[TaskFunction] = None
        self.hydra_context: Optional[HydraContext] = None

    def setup(self, *, hydra_context: HydraContext, task_function: TaskFunction, config: DictConfig) -> None:
        self.config = config
        self.hydra_context = hydra_context
        self.task_function = task_function

    def launch(self, job_overrides: Sequence[Sequence[str]], initial_job_idx: int) -> Sequence[JobReturn]:
        # lazy import to ensure plugin discovery remains fast
        from . import _core

        assert self.config is not None and self.hydra_context is not None and self.task_function is not None
        return _core.launch(self, job_overrides, initial_job_idx)

    def make_backend(self, launcher_cfg: DictConfig) -> Any:
        raise NotImplementedError(f"{type(self).__name__} has no backend")


class MMTLocalLauncher(MMTLauncher):
    """``hydra/launcher=mmt_local`` (``cluster=local``): N simulated nodes x M processes on this host."""

    BACKEND = "local"

    def make_backend(self, launcher_cfg: DictConfig) -> Any:
        from ._local import LocalBackend, LocalSettings

        return LocalBackend(LocalSettings.from_config(launcher_cfg))


class MMTSlurmLauncher(MMTLauncher):
    """``hydra/launcher=mmt_slurm`` (``cluster=slurm``): one SLURM job of N nodes x M tasks per sweep job."""

    BACKEND = "slurm"

    def make_backend(self, launcher_cfg: DictConfig) -> Any:
        from ._slurm import SlurmBackend

        return SlurmBackend.from_config(launcher_cfg)
