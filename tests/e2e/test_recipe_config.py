"""Each LM recipe reads its keys through its typed config before doing anything (recipes/lm_config.py). Not in the
unit tier: importing a recipe imports Lightning and torch (seconds)."""

import sys

import pytest

from helpers.paths import REPO

if str(REPO) not in sys.path:  # recipes/ is imported from the app's directory, not installed
    sys.path.insert(0, str(REPO))

from unit.test_recipe_config import CONFIGS, TINY  # noqa: E402

from recipes.lm_config import ModelConfig  # noqa: E402


@pytest.mark.parametrize("name", list(CONFIGS))
def test_each_recipe_reads_its_keys_through_its_config_before_doing_anything(name, tmp_path, monkeypatch):
    import importlib

    monkeypatch.chdir(tmp_path)  # anything written would land here
    recipe = importlib.import_module(f"recipes.{name}")
    bogus = "init_timeout_s" if name != "lm_torch" else "bogus"  # init_timeout_s is lm_torch's own key
    with pytest.raises(TypeError, match=rf"recipes\.{name}\.train.*unknown key '{bogus}'"):
        recipe.train(**TINY, **{bogus: 1})
    with pytest.raises(TypeError, match="missing required key 'precision'"):
        recipe.train(**{key: value for key, value in TINY.items() if key != "precision"})
    assert list(tmp_path.iterdir()) == []


def test_the_model_defaults_are_the_transformers():
    import inspect

    from lightning.pytorch.demos import Transformer

    parameters = inspect.signature(Transformer.__init__).parameters
    assert ModelConfig().kwargs() == {name: parameters[name].default for name in ModelConfig().kwargs()}
