"""The launcher configs of every backend, stored in Hydra's ConfigStore as ``hydra/launcher=mmt_<backend>``
(``mmt_local``, ``mmt_slurm``, ``mmt_ray``, and any a package outside mmt registers): each backend's package brings its
own (:mod:`mmt.backends.spec`); this module stores mmt's own at Hydra's plugin scan.

Imported during Hydra's plugin discovery (by every Hydra app on this interpreter): standard library, Hydra,
OmegaConf, the backends' light ``config`` modules and the standard-library-only facts of ``mmt.core``.
"""

from omegaconf import OmegaConf

from mmt.backends import registry
from mmt.backends.job_conf import JobConf
from mmt.backends.launchers import store
from mmt.backends.local.config import LocalContainerRuntime, LocalLauncherConf
from mmt.backends.ray.config import RayLauncherConf
from mmt.backends.slurm.config import ContainerRuntime, SlurmLauncherConf, SlurmTasks
from mmt.core import launch_id

__all__ = [
    "ContainerRuntime",
    "JobConf",
    "LocalContainerRuntime",
    "LocalLauncherConf",
    "RayLauncherConf",
    "SlurmLauncherConf",
    "SlurmTasks",
]

# the default sweep dir is ``${mmt_launch_id:}``: unique per run of the app (Hydra executes this module again at
# every plugin scan, so each run gets a new id; see mmt.core.launch_id)
launch_id.renew()
OmegaConf.register_new_resolver("mmt_launch_id", lambda: launch_id.current().launch, replace=True)

for _spec in registry.specs():
    store(_spec)
