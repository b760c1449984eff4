"""train.py's config composed in this process (Hydra's compose API): what the launcher plans from, with no process
started."""

from hydra import compose, initialize_config_dir
from hydra.version import VersionBase
from omegaconf import DictConfig

from helpers.paths import REPO


def compose_train(*overrides: str) -> DictConfig:
    """train.py's config with ``overrides`` as one job of ``python train.py -m <overrides>`` gets it, the ``hydra``
    node (and so ``hydra.launcher``) included. Raises what Hydra raises for an override it cannot compose.

    Hydra's version base is left as it was: ``initialize_config_dir`` sets it for the process and never restores
    it, and a Hydra app run later in the same process (the conformance suites' apps, version_base=None) would
    inherit 1.3's defaults (no chdir) instead of its own."""
    versions = VersionBase.instance()
    base = versions.version_base
    try:
        with initialize_config_dir(config_dir=str(REPO / "conf"), job_name="train", version_base="1.3"):
            return compose("train", overrides=list(overrides), return_hydra_config=True)
    finally:
        versions.version_base = base
