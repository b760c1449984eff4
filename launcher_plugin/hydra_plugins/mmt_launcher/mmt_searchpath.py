"""mmt's config groups on every Hydra app's search path: ``machine=a100_x_8``, ``cluster=slurm`` work in any app
once mmt is installed. Imported during Hydra's plugin discovery: standard library and Hydra only (the backends'
light specs once the search path is made).

The groups live in the package ``mmt.conf``, read through the ``mmt://`` config source: Hydra's ``pkg://`` source,
except that Lightning's spelling works as it is (``machine=A100_X_8``, ``machine=T4``). Such a name is an alias: a
config whose only content is a defaults entry for the canonical name (``a100_x_8``), which Hydra then looks up along
the whole search path. The app's own config dir comes first on it, so its ``conf/machine/*.yaml`` override (same
name, in lower case, in whatever spelling it is asked for) or extend the catalogue.
"""

from hydra._internal.core_plugins.importlib_resources_config_source import ImportlibResourcesConfigSource
from hydra.core.config_search_path import ConfigSearchPath
from hydra.plugins.config_source import ConfigResult
from hydra.plugins.search_path_plugin import SearchPathPlugin
from omegaconf import OmegaConf

CONFIG_PACKAGE = "mmt.conf"


class MMTSearchPathPlugin(SearchPathPlugin):
    def manipulate_search_path(self, search_path: ConfigSearchPath) -> None:
        search_path.append(provider="mmt", path=f"mmt://{CONFIG_PACKAGE}")
        # each backend's cluster/<name>.yaml, from its own package (those registered at the plugin scan included)
        from mmt.backends.launchers import conf_packages

        for package in conf_packages():
            search_path.append(provider="mmt", path=f"pkg://{package}")


def _canonical(config_path: str) -> str:
    """``machine/A100_X_8`` -> ``machine/a100_x_8``: the catalogue's files are Lightning's names in lower case."""
    group, _, name = config_path.rpartition("/")
    name = name.lower().replace("-", "_")
    return f"{group}/{name}" if group else name


class MMTConfigSource(ImportlibResourcesConfigSource):
    """``mmt://<package>``: a package's configs, names matched case-insensitively."""

    @staticmethod
    def scheme() -> str:
        return "mmt"

    def load_config(self, config_path: str) -> ConfigResult:
        path = self._normalize_file_name(config_path)
        canonical = _canonical(path)
        if canonical == path:
            return super().load_config(path)
        # an alias: the canonical config, wherever on the search path it is found first (the app's own comes first)
        name = canonical.rpartition("/")[2].removesuffix(".yaml")
        return ConfigResult(
            provider=self.provider,
            path=f"{self.scheme()}://{self.path}",
            config=OmegaConf.create({"defaults": [name, "_self_"]}),
            header={"package": None},
        )

    def is_config(self, config_path: str) -> bool:
        return super().is_config(_canonical(config_path))

    def is_group(self, config_path: str) -> bool:
        return super().is_group(config_path) or super().is_group(config_path.lower())
