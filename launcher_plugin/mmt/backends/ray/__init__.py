"""The Ray backend: one Ray job per mmt job, its nodes one placement group (STRICT_SPREAD), one node agent per node.

Nothing here imports ray at module level: the launcher talks to the cluster over the job submission and state APIs
(HTTP, ``api``); only the job's own driver (``driver``) and its node actors (``actor``), on the cluster, import it.
"""

from mmt.backends.spec import BackendSpec

HELP = "one Ray job per sweep job, its nodes one placement group (a running Ray cluster's job API)"
SPEC = BackendSpec.of_package(__name__, "RayBackend", "RayLauncherConf", noun="Ray job", help=HELP)
