"""The probe recipe as a plain script, for the anchors that start processes themselves (shell, torchrun)."""

from recipes.probe import probe

if __name__ == "__main__":
    result = probe()
    assert result["all_reduce"] == result["world_size"] * (result["world_size"] + 1) / 2
