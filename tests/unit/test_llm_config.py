"""recipe=llm's typed config (recipes/llm_config.py), as ``python train.py recipe=llm model=...`` composes it, and
the data step's cache key. No processes, no torch, Lightning, litgpt or LitData (tests/e2e/test_llm.py runs them)."""

import sys
from dataclasses import replace
from pathlib import Path

import pytest
from omegaconf import OmegaConf

REPO = Path(__file__).resolve().parents[2]
if str(REPO) not in sys.path:  # recipes/ is imported from the app's directory, not installed
    sys.path.insert(0, str(REPO))

from recipes.llm_config import CHIPS, DataSpec, LLMConfig, ModelSpec, chip  # noqa: E402

VERSIONS = {"tokenizers": "0.23.3", "litdata": "0.2.76"}


def _compose(*overrides: str) -> dict:
    from hydra import compose, initialize_config_dir
    from hydra.core.hydra_config import HydraConfig

    with initialize_config_dir(config_dir=str(REPO / "conf"), job_name="test_llm_config", version_base="1.3"):
        cfg = compose("train", overrides=["recipe=llm", *overrides], return_hydra_config=True)
        HydraConfig.instance().set_config(cfg)  # resolves ${hydra:runtime.cwd}
        return {key: OmegaConf.to_container(cfg[key], resolve=True) for key in ("recipe", "batch", "model")}


def test_model_micro_is_the_default_and_every_recipe_key_lands_in_the_config():
    composed = _compose()
    section = dict(composed["recipe"])
    assert section.pop("_target_") == "recipes.llm.train"
    config = LLMConfig.from_kwargs(section)
    assert config.model == ModelSpec("micro", "tiny-llama-1.1b", composed["model"]["overrides"])
    assert config.model.overrides["n_layer"] == 2 and config.model.overrides["block_size"] == 64
    assert config.data.block_size == 65 == config.seq_len + 1 and config.data.vocab_size == 512
    assert config.data.docstrings is False and config.compile is False
    assert (config.precision, config.accelerator, config.strategy) == ("32-true", "cpu", "ddp")
    assert composed["batch"]["recipe"] == "llm-micro"  # the tuned table's key names the model
    assert composed["batch"]["precision"] == "32-true"


def test_tiny_llama_is_litgpts_definition_unchanged_and_gpu_machines_train_in_bf16():
    composed = _compose("model=tiny-llama-1.1b", "machine=a100_x_8", "num_nodes=8")
    config = LLMConfig.from_kwargs({k: v for k, v in composed["recipe"].items() if k != "_target_"})
    assert config.model == ModelSpec("tiny-llama-1.1b", "tiny-llama-1.1b", {})
    assert config.data.block_size == 2049  # litgpt's block_size 2048, plus the next-token target
    assert config.data.docstrings is True  # the bundled docs alone are too short for 2049-token samples
    assert config.precision == "bf16-mixed" and config.gpu_type == "A100" and chip(config.gpu_type) == "a100"
    assert composed["batch"]["recipe"] == "llm-tiny-llama-1.1b"


def test_other_recipes_do_not_get_a_model_group():
    from hydra import compose, initialize_config_dir

    with initialize_config_dir(config_dir=str(REPO / "conf"), job_name="test_llm_config", version_base="1.3"):
        assert "model" not in compose("train", overrides=["recipe=lm"])


def test_bad_values_are_refused_before_training():
    section = {k: v for k, v in _compose()["recipe"].items() if k != "_target_"}
    with pytest.raises(ValueError, match="strategy=fsdp needs GPUs"):
        LLMConfig.from_kwargs(dict(section, strategy="fsdp"))
    with pytest.raises(ValueError, match="expected ddp or fsdp"):
        LLMConfig.from_kwargs(dict(section, strategy="deepspeed"))
    with pytest.raises(ValueError, match="prepare_on='everywhere'"):
        LLMConfig.from_kwargs(dict(section, data=dict(section["data"], prepare_on="everywhere")))
    with pytest.raises(TypeError, match="unknown key 'epoch'"):
        LLMConfig.from_kwargs(dict(section, epoch=1))


def test_the_cache_key_follows_the_bytes_and_nothing_else():
    spec = DataSpec("/cache/a", 512, 65)
    key = spec.key("corpus-digest", VERSIONS)
    assert key == spec.key("corpus-digest", dict(reversed(list(VERSIONS.items()))))  # stable
    assert key.startswith("bpe512-b65-")
    # where it is kept and who prepares it do not change the dataset
    assert replace(spec, cache_dir="/elsewhere", prepare_on="node").key("corpus-digest", VERSIONS) == key
    # the corpus's content, every setting that changes the bytes, and the writers' versions do
    changed = [
        spec.key("other-corpus", VERSIONS),
        replace(spec, vocab_size=1024).key("corpus-digest", VERSIONS),
        replace(spec, block_size=129).key("corpus-digest", VERSIONS),
        replace(spec, val_fraction=0.1).key("corpus-digest", VERSIONS),
        replace(spec, blocks_multiple=32).key("corpus-digest", VERSIONS),
        replace(spec, chunk_blocks=32).key("corpus-digest", VERSIONS),
        spec.key("corpus-digest", dict(VERSIONS, litdata="0.2.77")),
    ]
    assert len(set(changed)) == len(changed) and key not in changed


def test_every_catalogue_gpu_has_a_chip_entry_or_says_it_has_none():
    gpu_types = set()
    for path in (REPO / "launcher_plugin" / "mmt" / "conf" / "machine").glob("*.yaml"):
        value = OmegaConf.load(path).get("gpu_type")
        if value:
            gpu_types.add(value)
    assert gpu_types <= set(CHIPS), gpu_types - set(CHIPS)
    assert chip(None) is None and chip("B200") is None


def test_a_dataset_whose_chunks_do_not_match_its_index_is_named_damaged(tmp_path):
    """recipes.llm_data.damage: every chunk LitData's index lists must be there, whole; the tokenizer too."""
    import json

    from recipes.llm_data import damage

    dataset = tmp_path / "key"
    for split in ("train", "val"):
        (dataset / split).mkdir(parents=True)
        (dataset / split / "chunk-0-0.bin").write_bytes(b"x" * 300)
        index = {"chunks": [{"filename": "chunk-0-0.bin", "chunk_bytes": 300, "chunk_size": 4}], "config": {}}
        (dataset / split / "index.json").write_text(json.dumps(index))
    (dataset / "tokenizer.json").write_text("{}")
    assert damage(dataset) is None
    chunk = dataset / "train" / "chunk-0-0.bin"
    chunk.write_bytes(b"x" * 100)
    assert damage(dataset) == f"{chunk} has 100 bytes where {dataset / 'train' / 'index.json'} says 300"
    chunk.unlink()
    assert damage(dataset) == f"{chunk} is missing ({dataset / 'train' / 'index.json'} lists it)"
    (dataset / "val" / "index.json").write_text("not json")
    (dataset / "train" / "chunk-0-0.bin").write_bytes(b"x" * 300)
    assert damage(dataset) == f"{dataset / 'val' / 'index.json'} is missing or not LitData's index"
    (dataset / "tokenizer.json").unlink()
    assert damage(dataset) == f"{dataset / 'tokenizer.json'} is missing"
