"""``hydra.launcher`` of cluster=local (``hydra/launcher=mmt_local``): light, imported at Hydra's plugin scan."""

import enum
from dataclasses import dataclass, field
from typing import Any, List, Optional

from mmt.backends.job_conf import JobConf


class LocalContainerRuntime(enum.Enum):
    podman = "podman"
    docker = "docker"


@dataclass
class LocalLauncherConf(JobConf):
    """The embedded default: every job runs as N simulated nodes x M processes on this host."""

    _target_: str = "hydra_plugins.mmt_launcher.mmt_launcher.MMTLocalLauncher"  # the name Hydra's plugin list shows
    # the backend that runs the jobs: a name in mmt.backends.registry (set by the launcher config you select)
    backend: str = "local"
    # most ranks running at once over the jobs of a sweep; a job larger than this still runs, alone.
    # null = max(4, CPU cores of this host)
    max_parallel_ranks: Optional[int] = None
    # address of node 0 (all simulated nodes share this host's loopback)
    master_addr: str = "127.0.0.1"
    # an elastic job (num_nodes=MIN:MAX): a lost node comes back this many seconds after (its agent started again,
    # as a restored machine's would be) and joins the world right after its next checkpoint; null: it stays lost.
    # Typed Any: mmt's own check names a bad value in one line (a typed field fails in Hydra's merge, four lines)
    restore_lost_nodes_after_s: Any = None
    # the container CLI that runs each simulated node of a job with an `image` in a container of its own
    container_runtime: LocalContainerRuntime = LocalContainerRuntime.podman
    # bind mounts for the containers: ["/host/path:/container/path", ...]; the job dir and project dir always are
    container_mounts: List[str] = field(default_factory=list)
