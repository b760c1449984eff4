"""``hydra.launcher`` of cluster=ray (``hydra/launcher=mmt_ray``): light, imported at Hydra's plugin scan."""

from dataclasses import dataclass, field
from typing import Any, Dict, Optional

from mmt.backends.job_conf import JobConf


@dataclass
class RayLauncherConf(JobConf):
    """Each job is one Ray job, submitted through Ray's job submission API; its nodes one placement group."""

    _target_: str = "hydra_plugins.mmt_launcher.mmt_launcher.MMTRayLauncher"  # the name Hydra's plugin list shows
    # the backend that runs the jobs: a name in mmt.backends.registry (set by the launcher config you select)
    backend: str = "ray"
    # the Ray dashboard, which serves the job submission API: http://<head>:8265; null = $RAY_API_SERVER_ADDRESS,
    # else $RAY_ADDRESS (as `ray job submit`)
    address: Optional[str] = None
    # CPUs of each node's placement-group bundle (its Ray node's); null = the machine's cpus
    cpus_per_node: Optional[float] = None
    # GPUs of each node's bundle; null = the machine's GPU count
    gpus_per_node: Optional[int] = None
    # custom Ray resources of each node's bundle: {name: amount}
    resources_per_node: Dict[str, float] = field(default_factory=dict)
    # Ray's runtime env of the job's driver and node agents: working_dir (a directory here, uploaded, or a URI;
    # null = the launcher's working dir, on a filesystem every node shares), pip (requirements), env_vars
    runtime_env: Dict[str, Any] = field(default_factory=lambda: {"working_dir": None, "pip": [], "env_vars": {}})
    # seconds between questions to Ray's job API; the job dir is read every 0.1 s regardless
    poll_interval_s: float = 1.0
    # seconds the cluster (its dashboard) may not answer before its jobs are concluded FAILED, lost with it
    cluster_grace_s: float = 300.0
