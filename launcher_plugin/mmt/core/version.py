"""mmt's version, where every layer may read it (the Ray entrypoint checks the cluster's mmt against it)."""

VERSION = "0.2.0"
