"""A Hydra app that never imports torch (benchmarks/bench_batches.py): its task only computes a number."""

import hydra
from omegaconf import DictConfig


@hydra.main(version_base="1.3", config_path=None, config_name=None)
def main(cfg: DictConfig) -> float:
    return float(sum(i * i for i in range(10_000)))


if __name__ == "__main__":
    main()
