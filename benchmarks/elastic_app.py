"""The elastic probe as a Hydra app run through mmt: its ranks are forked by warm node agents, torch preloaded."""

import hydra
from elastic_probe import train
from omegaconf import DictConfig


@hydra.main(version_base="1.3", config_path=None, config_name=None)
def main(cfg: DictConfig) -> float:
    return train(cfg.out)


if __name__ == "__main__":
    main()
