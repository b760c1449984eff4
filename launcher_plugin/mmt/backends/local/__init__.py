"""The local backend: N simulated nodes x M processes on this host, forked by one host agent."""

from mmt.backends.spec import BackendSpec

HELP = "N simulated nodes x M processes on this host (the default)"
SPEC = BackendSpec.of_package(__name__, "LocalBackend", "LocalLauncherConf", noun=None, help=HELP)
