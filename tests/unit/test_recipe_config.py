"""The LM recipes' typed config (recipes/lm_config.py): built from the keys under ``recipe:`` that Hydra passes."""

import dataclasses
import sys
from pathlib import Path

import pytest
from omegaconf import OmegaConf

REPO = Path(__file__).resolve().parents[2]
if str(REPO) not in sys.path:  # recipes/ is imported from the app's directory, not installed
    sys.path.insert(0, str(REPO))

from recipes.lm_config import LMConfig, ModelConfig, TorchLMConfig  # noqa: E402

CONFIGS = {"lm": LMConfig, "lm_fabric": LMConfig, "lm_torch": TorchLMConfig}
TINY = dict(
    seed=1,
    accelerator="cpu",
    data_dir="data",
    block_size=35,
    val_fraction=0.05,
    lr=1.0,
    model=dict(ninp=16, nhead=2, nhid=16, nlayers=1, dropout=0.0),
    max_steps=2,
    val_check_interval=1,
    limit_val_batches=1,
    gradient_clip_val=0.25,
    precision="32-true",
)


@pytest.fixture(scope="module")
def composed():
    """Each LM recipe's ``recipe`` section as ``python train.py recipe=<name>`` composes it (resolved)."""
    from hydra import compose, initialize_config_dir
    from hydra.core.hydra_config import HydraConfig

    sections = {}
    with initialize_config_dir(config_dir=str(REPO / "conf"), job_name="test_recipe_config", version_base="1.3"):
        for name in CONFIGS:
            cfg = compose("train", overrides=[f"recipe={name}"], return_hydra_config=True)
            HydraConfig.instance().set_config(cfg)  # resolves ${hydra:runtime.cwd}
            sections[name] = OmegaConf.to_container(cfg.recipe, resolve=True)
    return sections


@pytest.mark.parametrize("name", list(CONFIGS))
def test_every_key_of_the_composed_recipe_section_lands_in_the_config(name, composed):
    section = dict(composed[name])
    assert section.pop("_target_") == f"recipes.{name}.train"
    config = CONFIGS[name].from_kwargs(name, section)
    for key, value in section.items():
        if key != "model":
            assert getattr(config, key) == value, key
    assert config.model == ModelConfig(**section["model"])
    assert config.model.kwargs() == section["model"]  # what the Transformer gets
    assert (config.model.ninp, config.model.nhid, config.model.nlayers) == (128, 256, 2)  # conf/recipe/lm.yaml
    # keys the yaml leaves out: the launcher's batch plan, the job dir
    assert (config.output_dir, config.batch_size, config.accumulate_grad_batches) == (None, None, None)
    assert config.resume is True and config.fixed_buckets is None


def test_defaults_and_the_key_only_lm_torch_takes():
    config = LMConfig.from_kwargs("lm", TINY)
    assert (
        config.resume,
        config.fixed_buckets,
        config.output_dir,
        config.batch_size,
        config.accumulate_grad_batches,
    ) == (True, None, None, None, None)
    assert not hasattr(config, "init_timeout_s")
    assert TorchLMConfig.from_kwargs("lm_torch", TINY).init_timeout_s == 300
    assert TorchLMConfig.from_kwargs("lm_torch", dict(TINY, init_timeout_s=5)).init_timeout_s == 5
    with pytest.raises(TypeError, match=r"recipes\.lm_fabric\.train.*unknown key 'init_timeout_s'"):
        LMConfig.from_kwargs("lm_fabric", dict(TINY, init_timeout_s=5))


def test_values_pass_through_as_given():
    # no coercion and no checks of values: what a bad value raises is up to the framework, as before
    config = LMConfig.from_kwargs(
        "lm",
        dict(
            TINY,
            precision="bogus",
            batch_size=4,
            accumulate_grad_batches=2,
            fixed_buckets=True,
            output_dir="/x",
            resume=False,
        ),
    )
    assert (config.precision, config.batch_size, config.accumulate_grad_batches) == ("bogus", 4, 2)
    assert (config.fixed_buckets, config.output_dir, config.resume) == (True, "/x", False)


def test_an_unknown_key_is_refused_with_its_name_and_the_keys_the_recipe_takes():
    with pytest.raises(TypeError) as raised:
        LMConfig.from_kwargs("lm", dict(TINY, learning_rate=0.1))
    message = str(raised.value)
    assert "recipes.lm.train" in message and "unknown key 'learning_rate'" in message
    assert "expected one of: seed, accelerator," in message and "accumulate_grad_batches" in message
    with pytest.raises(TypeError, match="unknown keys 'a', 'b'"):
        LMConfig.from_kwargs("lm", dict(TINY, a=1, b=2))


def test_a_missing_required_key_is_refused_with_its_name():
    incomplete = {key: value for key, value in TINY.items() if key not in ("seed", "lr")}
    with pytest.raises(TypeError, match=r"recipes\.lm_torch\.train.*missing required keys 'seed', 'lr'"):
        TorchLMConfig.from_kwargs("lm_torch", incomplete)


def test_the_model_section_is_a_nested_config():
    config = LMConfig.from_kwargs("lm", dict(TINY, model={"ninp": 8}))
    assert config.model == ModelConfig(ninp=8)  # the rest: the Transformer's defaults
    assert ModelConfig().kwargs() == dict(ninp=200, nhead=2, nhid=200, nlayers=2, dropout=0.2)
    with pytest.raises(TypeError, match=r"recipe\.model\).*unknown key 'width'.*ninp, nhead, nhid, nlayers, dropout"):
        LMConfig.from_kwargs("lm", dict(TINY, model={"width": 8}))
    with pytest.raises(TypeError, match=r"recipe\.model\).*expected a mapping"):
        LMConfig.from_kwargs("lm", dict(TINY, model=None))
    given = ModelConfig(nlayers=3)
    assert LMConfig.from_kwargs("lm", dict(TINY, model=given)).model is given


def test_an_omegaconf_section_is_read_as_it_is():
    section = OmegaConf.create(TINY)  # not converted: a DictConfig and its nested model
    config = LMConfig.from_kwargs("lm", section)
    assert config.model == ModelConfig(**TINY["model"]) and config.seed == 1


def test_the_config_is_frozen():
    config = LMConfig.from_kwargs("lm", TINY)
    with pytest.raises(dataclasses.FrozenInstanceError):
        config.lr = 2.0
    with pytest.raises(dataclasses.FrozenInstanceError):
        config.model.ninp = 1
    assert dataclasses.replace(config, lr=2.0).lr == 2.0 and config.lr == 1.0
