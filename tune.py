"""Tune a recipe's per-device micro-batch limit on a machine type and record it in the recipe's tuned table.

    python tune.py recipe=lm machine=cpu                    # -> recipes/tuned/lm.yaml, entry lm/cpu/32-true
    python tune.py recipe=lm_torch machine=cpu devices=2    # CPU machines: the node's memory per process
    python tune.py recipe=lm tune.budget_gb=1.5 tune.table=/tmp/lm.yaml   # a small budget, a scratch table

Same config as train.py (conf/tune.yaml includes conf/train.yaml), one fresh process per candidate; see mmt.tune.
"""

import sys
from pathlib import Path

import hydra
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig


@hydra.main(version_base="1.3", config_path="conf", config_name="tune")
def main(cfg: DictConfig) -> dict:
    from mmt.tune import TuneError, run

    try:
        return run(cfg, Path(HydraConfig.get().runtime.output_dir) / "trials")
    except (TuneError, ValueError) as exc:
        print(f"tune: {exc}", file=sys.stderr)
        sys.exit(2)


if __name__ == "__main__":
    main()
