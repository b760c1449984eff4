"""cluster=local's config (``cluster/local.yaml``), on every Hydra app's search path (mmt.backends.launchers)."""
