"""The probe under hydra-submitit-launcher (anchor d): submitit starts the tasks, this maps them onto torch env."""

import hydra
import submitit
from omegaconf import DictConfig


@hydra.main(version_base="1.3", config_path=None)
def main(_: DictConfig) -> float:
    # submitit sets SUBMITIT_LOCAL_*; export MASTER_ADDR/PORT, RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE
    submitit.helpers.TorchDistributedEnvironment().export(set_cuda_visible_devices=False)
    from recipes.probe import probe

    return probe()["all_reduce"]


if __name__ == "__main__":
    main()
