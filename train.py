"""mmt's example Hydra app: runs the selected recipe on every rank of every job.

python train.py -m num_nodes=1,2 devices=2          # two jobs: 1x2 and 2x2 ranks (LM recipe)
python train.py -m recipe=probe num_nodes=2 devices=2  # smoke-test the cluster
python train.py -m hydra.launcher.dry_run=true num_nodes=8 machine=h100_x_8   # the plan, nothing started
"""

import hydra
from omegaconf import DictConfig


@hydra.main(version_base="1.3", config_path="conf", config_name="train")
def main(cfg: DictConfig) -> object:
    # the recipe is imported here, in the rank, so that the launcher process stays light; it is called
    # outside instantiate() so that its errors reach the log as they are, not wrapped in InstantiationException
    recipe = hydra.utils.instantiate(cfg.recipe, _partial_=True, _convert_="all")
    return recipe()


if __name__ == "__main__":
    main()
