"""What mmt knows of a backend before importing it: a record light enough for Hydra's plugin scan (every Hydra app on
the interpreter imports it), the CLI's help, and every line that names one of the backend's jobs.

A backend is one package: its :class:`BackendSpec` (in its ``__init__``), its ``Backend`` class (``target``), its
``hydra.launcher`` config dataclass (``config``) and its ``cluster/<name>.yaml`` (under ``conf``). mmt's own are
listed in :mod:`mmt.backends.registry`; another package registers its own with ``registry.register(SPEC)`` from a
module of Hydra's plugin namespace (``hydra_plugins/<anything>.py``), which Hydra imports at its plugin scan and mmt's
CLI imports when it meets a backend name it does not know (docs/backends.md).
"""

from dataclasses import dataclass
from typing import Optional

# the Hydra launcher every backend's launcher config names (one class: what differs is the backend)
LAUNCHER_TARGET = "hydra_plugins.mmt_launcher.mmt_launcher.MMTLauncher"


@dataclass(frozen=True)
class BackendSpec:
    """One backend, by name, as the front ends see it."""

    #: ``cluster=<name>``, and the name the job registry and every record store
    name: str
    #: ``package.module:Class``: the :class:`mmt.backends.base.Backend`, imported on first use
    target: str
    #: what one of its jobs is called where a user reads it: ``SLURM job``, ``Ray job``; None where its jobs have no
    #: id of a scheduler's (local)
    noun: Optional[str] = None
    #: one line: what ``cluster=<name>`` runs, for ``--cluster``'s help and the docs
    help: str = ""
    #: ``package.module:Class``: its ``hydra.launcher`` config, a dataclass on :class:`mmt.backends.job_conf.JobConf`,
    #: stored in Hydra's ConfigStore as ``hydra/launcher=mmt_<name>`` (imported at Hydra's plugin scan: keep it light);
    #: None for a backend that Hydra apps do not select (one that engine code drives directly)
    config: Optional[str] = None
    #: the Python package holding ``cluster/<name>.yaml`` (Hydra's search path gets ``pkg://<conf>``)
    conf: Optional[str] = None
    #: ``package.module:function``: on a login node reached over SSH (mmt.remote), why the backend's cluster cannot be
    #: used from there (its commands missing, its controller silent), or None; checked before anything starts, so
    #: light to import. None for a backend that is not driven over SSH (``Backend.runs_over_ssh``)
    cluster_check: Optional[str] = None

    @classmethod
    def of_package(cls, package: str, backend: str, config: str, noun: Optional[str], help: str) -> "BackendSpec":
        """A backend laid out as mmt's own are: ``<package>.backend:<backend>``, ``<package>.config:<config>``, and
        ``<package>/conf/cluster/<name>.yaml``; named by the package's last part."""
        name = package.rsplit(".", 1)[-1]
        target, conf = f"{package}.backend:{backend}", f"{package}.conf"
        return cls(name, target, noun=noun, help=help, config=f"{package}.config:{config}", conf=conf)

    @property
    def launcher(self) -> str:
        """The name of its launcher config in Hydra's ``hydra/launcher`` group."""
        return f"mmt_{self.name}"

    def job(self, scheduler_id: object) -> str:
        """``SLURM job 123``, ``Ray job mmt-x-20261205T...``: one of its jobs, named as a user knows it."""
        return f"{self.noun or f'{self.name} job'} {scheduler_id}"
