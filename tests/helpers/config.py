"""train.py's config composed in this process (Hydra's compose API): what the launcher plans from, with no process
started."""

from hydra import compose, initialize_config_dir
from omegaconf import DictConfig

from helpers.paths import REPO


def compose_train(*overrides: str) -> DictConfig:
    """train.py's config with ``overrides`` as one job of ``python train.py -m <overrides>`` gets it, the ``hydra``
    node (and so ``hydra.launcher``) included. Raises what Hydra raises for an override it cannot compose."""
    with initialize_config_dir(config_dir=str(REPO / "conf"), job_name="train", version_base="1.3"):
        return compose("train", overrides=list(overrides), return_hydra_config=True)
