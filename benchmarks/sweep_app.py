"""A trivial Hydra app for the sweep benchmark: each point of ``+x=range(N)`` returns x (no torch, no work), so
what is timed is the launcher, the scheduler and the per-job start."""

import hydra
from omegaconf import DictConfig


@hydra.main(version_base="1.3", config_path=None, config_name=None)
def main(cfg: DictConfig) -> int:
    return int(cfg.x)


if __name__ == "__main__":
    main()
