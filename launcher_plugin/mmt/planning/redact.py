"""Secrets never leave the job's private files: the values of ``env`` variables are masked in everything mmt
prints or writes for people to read (dry run, console, summary, result.json, ``.hydra/``, ``multirun.yaml``)."""

import re
from typing import Any, Dict, Iterable, List, Optional, Sequence

MASK = "***"


class _Masked:
    """Stands for a secret value in an error message: ``Invalid env.TOKEN=***``."""

    def __repr__(self) -> str:
        return MASK


MASKED = _Masked()

# the key of an env section however the app spells it: env, +env, ++hydra.launcher.env, myapp.env ...
_ENV_SECTION = r"[~+]{0,2}(?:[\w.]*\.)?env"
_WHOLE_SECTION = re.compile(rf"^(?P<key>{_ENV_SECTION})=(?P<value>.*)$", re.S)


class _Masker:
    """Masks the values of the env variables in ``names`` in override strings: one variable (``env.X=v``), the
    whole section (``env={X: v}``), and items of a joined list (``hydra.job.override_dirname``: ``a=1,env.X=v``)."""

    def __init__(self, names: Iterable[str]) -> None:
        self.names = set(names)
        alternatives = "|".join(re.escape(n) for n in sorted(self.names, key=len, reverse=True))
        variable = rf"{_ENV_SECTION}\.(?:{alternatives})"
        self.whole = re.compile(rf"^(?P<key>{variable})=(?P<value>.*)$", re.S)
        # an item of a comma-joined list: the value ends at the next comma (a job's own value holds none unquoted),
        # or a section's at its closing brace
        self.item = re.compile(rf"(?<![\w.~+])(?P<key>{variable})=(?P<value>[^,]*)")
        self.section_item = re.compile(rf"(?<![\w.~+])(?P<key>{_ENV_SECTION})=(?P<value>\{{[^{{}}]*\}})")

    def override(self, text: str) -> str:
        if self.whole.match(text):
            return self.whole.sub(lambda m: f"{m.group('key')}={MASK}", text)
        section = _WHOLE_SECTION.match(text)
        if section:
            return f"{section.group('key')}={self._section_value(section.group('value'))}"
        text = self.section_item.sub(lambda m: f"{m.group('key')}={self._section_value(m.group('value'))}", text)
        return self.item.sub(lambda m: f"{m.group('key')}={MASK}", text)

    def _section_value(self, value: str) -> str:
        """``{X: v, Y: w}`` with the named variables' values masked; all of it when it cannot be read."""
        mapping = _parse_mapping(value)
        if mapping is None:
            return MASK
        return "{" + ",".join(f"{k}:{MASK if k in self.names else v}" for k, v in mapping.items()) + "}"


def _parse_mapping(value: str) -> Optional[Dict[str, Any]]:
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.errors import HydraException

    try:
        parsed = OverridesParser.create().parse_override(f"x={value}").value()
    except HydraException:  # not Hydra's override grammar (OverrideParseException): not a mapping either
        return None
    return parsed if isinstance(parsed, dict) else None


def masked_overrides(overrides: Sequence[str], names: Iterable[str]) -> List[str]:
    """The overrides with the value of every env variable in ``names`` replaced by ``***``."""
    names = list(names)
    if not names:
        return list(overrides)
    masker = _Masker(names)
    return [masker.override(item) for item in overrides]


def masked_config(config: Any, names: Iterable[str]) -> Any:
    """A plain (to_container'd) config with the values of these env variables masked, wherever a mapping named
    ``env`` holds them, and in override strings (lists of them, and ``override_dirname``)."""
    names = set(names)
    if not names:
        return config
    masker = _Masker(names)

    def walk(node: Any, key: Any = None) -> Any:
        if isinstance(node, dict):
            return {k: (MASK if key == "env" and k in names and v is not None else walk(v, k)) for k, v in node.items()}
        if isinstance(node, list):
            return [walk(item) for item in node]
        if isinstance(node, str):
            return masker.override(node)
        return node

    return walk(config)


def env_names_in(overrides: Iterable[str], configured: Iterable[str] = ()) -> List[str]:
    """The env variables a batch of overrides sets (``env.X=``, ``env={X: ...}``), with those configured already:
    what must be masked in files written before any job is planned (Hydra's ``multirun.yaml``)."""
    names = set(configured)
    for text in overrides:
        section = _WHOLE_SECTION.match(text)
        if section:
            names.update(_parse_mapping(section.group("value")) or {})
        names.update(re.findall(rf"(?<![\w.~+]){_ENV_SECTION}\.(\w+)=", text))
    return sorted(names)
