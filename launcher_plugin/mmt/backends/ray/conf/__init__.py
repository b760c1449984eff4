"""cluster=ray's config (``cluster/ray.yaml``), on every Hydra app's search path (mmt.backends.launchers)."""
