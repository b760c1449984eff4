"""The plugin's config classes: every field annotated, and so a config key. (Discovery and light imports in a fresh
interpreter: tests/e2e/test_packaging.py.)"""

from dataclasses import fields

from omegaconf import OmegaConf

from hydra_plugins.mmt_launcher.config import JobConf, LocalLauncherConf, SlurmLauncherConf


def test_every_config_field_is_annotated_and_a_key():
    # an unannotated dataclass attribute is silently not a config key (DESIGN pitfall 9)
    for conf in (JobConf, LocalLauncherConf, SlurmLauncherConf):
        declared = {
            name
            for klass in conf.__mro__
            for name, value in vars(klass).items()
            if not name.startswith("__") and not callable(value) and not isinstance(value, property)
        }
        assert declared <= {f.name for f in fields(conf)}, (
            f"{conf.__name__}: not annotated: {declared - {f.name for f in fields(conf)}}"
        )
        assert set(OmegaConf.structured(conf).keys()) == {f.name for f in fields(conf)}
