"""A sweep job's config from a sibling's: Hydra's composition, less the work that cannot differ between them.

Every job of a sweep is composed from the same primary config and the same hydra overrides, and most sweeps vary
only values (``lr=0.1,0.01``, ``+x=range(100)``): Hydra still builds the defaults tree, loads and merges every
config file and applies every override again for each job (50-100 ms a job on this host; a 100-point sweep spent
9 s of its 40 s composing before its one sbatch). When two jobs' overrides name the same keys, in the same order
and of the same kind, and differ only in plain values (a number, a string, a bool or null) of keys that are not
config groups, Hydra's two results differ in three places only: the values those overrides set,
``hydra.overrides.task`` (the overrides' input lines) and ``hydra.job.override_dirname``. So the second job's config
is a copy of the first's with those three set as ``ConfigLoaderImpl._load_configuration_impl`` sets them (a few
milliseconds).

Anything else is composed by Hydra: a config group, a deletion, a list extension, a package, a hydra key, a value
that is a dict or a list (merged, not replaced), a key given twice, a value Hydra would refuse (its own error then
says why). ``tests/unit/test_sibling_compose.py`` holds every job of a set of sweeps against Hydra's own result.
"""

import copy
from dataclasses import dataclass, replace
from typing import Any, Callable, Dict, List, Optional, Sequence, Set, Tuple

from hydra._internal.config_loader_impl import ConfigLoaderImpl, get_overrides_dirname
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.core.override_parser.types import Override, OverrideType
from omegaconf import DictConfig, OmegaConf, open_dict, read_write

_PLAIN_VALUES = (str, int, float, bool, type(None))
_SETTABLE = (OverrideType.CHANGE, OverrideType.ADD, OverrideType.FORCE_ADD)
# sweeps of more shapes than this (group choices x value kinds) compose the rest with Hydra
MAX_TEMPLATES = 16

# (key or group, kind, the input line for an override that must be equal to the template's; None for a plain one)
_Shape = Tuple[Tuple[str, OverrideType, Optional[str]], ...]


@dataclass(frozen=True)
class _Template:
    """A job's config as Hydra composed it, and the overrides it was composed with. ``owned``: a copy of it that is
    never handed out; else the very config the job was given, untouched only until the launcher takes it."""

    master: Any  # held so that the id in the key is never another config's
    overrides: Tuple[Override, ...]
    config: DictConfig
    owned: bool


class SiblingComposer:
    """Derives a sweep job's config from a sibling's that Hydra composed, where that gives Hydra's own result.

    A config Hydra composed is kept as it is, at no cost (a job of its own, a sweep's first job); it is copied once
    its first sibling comes, which in a batch is before the launcher takes any job (the sweeper checks the whole
    batch first). A sweeper that sends batches of one (Optuna's) takes each job before the next is asked for: the
    second job of a shape is then composed by Hydra and copied, and every later one derived from it."""

    def __init__(self, loader: Any) -> None:
        self.loader = loader
        # what this relies on is Hydra's own loader's (its repository, its way of composing)
        self.enabled = isinstance(loader, ConfigLoaderImpl)
        self.templates: Dict[Tuple[int, _Shape], _Template] = {}
        self.seen: Set[Tuple[int, _Shape]] = set()  # shapes whose uncopied config a launcher took
        self._parser: Optional[OverridesParser] = None

    def __getstate__(self) -> Dict[str, Any]:  # what travels with Hydra's state: no configs, no parser
        return {"loader": self.loader, "enabled": self.enabled, "templates": {}, "seen": set(), "_parser": None}

    def _parse(self, overrides: Sequence[str]) -> Optional[List[Override]]:
        if self._parser is None:
            self._parser = OverridesParser.create()
        try:
            return self._parser.parse_overrides(list(overrides))
        except Exception:  # Hydra's composition says what is wrong with it, in its own words
            return None

    def _plain(self, override: Override) -> bool:
        """An override that sets one plain value of a key that is no config group."""
        key = override.key_or_group
        return (
            override.type in _SETTABLE
            and override.package is None
            and not override.is_sweep_override()
            and not override.is_hydra_override()
            and "/" not in key
            and isinstance(override.value(), _PLAIN_VALUES)
            and not self.loader.repository.group_exists(key)
        )

    def _key(self, master: Any, parsed: List[Override]) -> Optional[Tuple[int, _Shape]]:
        keys = [o.key_or_group for o in parsed]
        if len(set(keys)) != len(keys):
            return None
        return id(master), tuple((o.key_or_group, o.type, None if self._plain(o) else o.input_line) for o in parsed)

    def _template(self, key: Tuple[int, _Shape], master: Any) -> Optional[_Template]:
        template = self.templates.get(key)
        if template is None or template.master is not master:
            return None
        if not template.owned:  # its first sibling: from now on the siblings' own copy
            template = replace(template, config=copy.deepcopy(template.config), owned=True)
            self.templates[key] = template
        return template

    def compose(self, master: Any, overrides: Sequence[str], hydra_compose: Callable[[Any, List[str]], Any]) -> Any:
        """The job's config: derived from a sibling of the same shape, else ``hydra_compose``'s (kept for the
        siblings of its shape)."""
        if not self.enabled:
            return hydra_compose(master, list(overrides))
        parsed = self._parse(overrides)
        key = None if parsed is None else self._key(master, parsed)
        template = None if key is None else self._template(key, master)
        config = None if template is None or parsed is None else self._derive(template, master, parsed)
        if config is None:
            config = hydra_compose(master, list(overrides))
            if parsed is not None and key is not None:
                self._learn(key, master, parsed, config)
        return config

    def _derive(self, template: _Template, master: Any, parsed: List[Override]) -> Optional[DictConfig]:
        """The template's config with this job's plain values, or None when Hydra must compose it."""
        changed = [o for o, before in zip(parsed, template.overrides) if o.input_line != before.input_line]
        choices = template.config.hydra.runtime.choices
        if any(o.key_or_group in choices for o in changed):  # a group only a searchpath override adds
            return None
        config = copy.deepcopy(template.config)
        try:
            for override in changed:
                _set(config, override)
            _set_override_records(config, parsed)
        except Exception:  # e.g. a value a typed node refuses: Hydra composes the job, and says so in its words
            return None
        OmegaConf.copy_cache(from_config=master, to_config=config)
        return config

    def _learn(self, key: Tuple[int, _Shape], master: Any, parsed: List[Override], config: DictConfig) -> None:
        """Keep a config Hydra composed, for the siblings of its shape: as it is, or a copy when a launcher took
        one of its shape before a sibling came."""
        if key in self.templates or len(self.templates) >= MAX_TEMPLATES:
            return
        owned = key in self.seen
        self.templates[key] = _Template(master, tuple(parsed), copy.deepcopy(config) if owned else config, owned)

    def taken(self, config: Any) -> None:
        """The launcher takes ``config`` and changes it: a template that is that very config is one no longer."""
        for key, template in list(self.templates.items()):
            if template.config is config:
                del self.templates[key]
                self.seen.add(key)

    def forget(self) -> None:
        """Drop the configs that are not copies (a batch's jobs it did not take)."""
        for key, template in list(self.templates.items()):
            if not template.owned:
                del self.templates[key]


def _set(config: DictConfig, override: Override) -> None:
    """One plain override, as Hydra's ``_apply_overrides_to_config`` applies it (an add goes where the sibling's add
    went: no item was there before either)."""
    force_add = override.type != OverrideType.CHANGE
    OmegaConf.update(config, override.key_or_group, override.value(), merge=True, force_add=force_add)


def _set_override_records(config: DictConfig, parsed: List[Override]) -> None:
    """``hydra.overrides.task`` and ``hydra.job.override_dirname``, as Hydra's composition sets them (the hydra
    overrides, the master's and the job's, are the sibling's already)."""
    task = [o for o in parsed if not o.is_hydra_override()]
    dirname = config.hydra.job.config.override_dirname
    with read_write(config.hydra), open_dict(config.hydra):
        config.hydra.overrides.task = [o.input_line for o in task]
        config.hydra.job.override_dirname = get_overrides_dirname(
            overrides=task,
            kv_sep=dirname.kv_sep,
            item_sep=dirname.item_sep,
            exclude_keys=dirname.exclude_keys,
        )
