"""The restart probe as a Hydra app run through mmt: its ranks are forked by the warm agent, torch preloaded."""

import hydra
from omegaconf import DictConfig
from restart_probe import train


@hydra.main(version_base="1.3", config_path=None, config_name=None)
def main(cfg: DictConfig) -> float:
    return train(cfg.out)


if __name__ == "__main__":
    main()
