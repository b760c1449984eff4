"""A Hydra + Lightning app, written without mmt in mind; configs/launch/mmt.yaml runs it with mmt.

python train_app.py launch=plain                          # one process, Hydra's basic launcher
python train_app.py num_nodes=2 devices=2                 # with mmt: 2 nodes x 2 processes, a world of 4
python train_app.py num_nodes=1,2 devices=2 model.lr=0.05,0.1
"""

from pathlib import Path

import hydra
import lightning as L
from hydra.core.hydra_config import HydraConfig
from lightning.pytorch.utilities import rank_zero_only
from omegaconf import DictConfig, OmegaConf


@rank_zero_only
def print_config_tree(cfg: DictConfig) -> None:
    """What project templates do before anything is built: show the config once, and keep a copy."""
    tree = OmegaConf.to_yaml(cfg, resolve=True)
    print("CONFIG TREE PRINTED BY RANK ZERO")
    print(tree)
    Path(HydraConfig.get().runtime.output_dir, "config_tree.txt").write_text(tree)


@hydra.main(version_base="1.3", config_path="configs", config_name="train")
def main(cfg: DictConfig) -> dict:
    print_config_tree(cfg)  # before the Trainer exists: rank_zero_only must already know this process's rank
    L.seed_everything(cfg.seed, verbose=False)
    data = hydra.utils.instantiate(cfg.data)
    model = hydra.utils.instantiate(cfg.model)
    logger = hydra.utils.instantiate(cfg.logger)
    trainer: L.Trainer = hydra.utils.instantiate(cfg.trainer, logger=logger)
    trainer.fit(model, datamodule=data)
    print(
        f"trainer: global_rank={trainer.global_rank} world_size={trainer.world_size} "
        f"num_nodes={trainer.num_nodes} devices={trainer.num_devices} steps={trainer.global_step}"
    )
    return {
        "val_loss": float(trainer.callback_metrics["val_loss"]),
        "world_size": trainer.world_size,
        "steps": trainer.global_step,
    }


if __name__ == "__main__":
    main()
