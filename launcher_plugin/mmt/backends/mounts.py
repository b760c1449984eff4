"""Container bind mounts (``hydra.launcher.container_mounts``), ``SOURCE:TARGET[:OPTIONS]``: one parser for every
backend that runs containers.

What a mount may look like depends on the runtimes that bind it, and each backend says so in a
:class:`MountSyntax`: podman's and docker's ``-v`` want an absolute ``TARGET`` and at most one ``OPTIONS``
(``mmt.backends.local.images``); pyxis joins its mounts with commas, so a SLURM mount has none
(``mmt.backends.slurm.sbatch``). A mount is validated once, when the settings are read, and kept as its text, as
the runtimes take it; :func:`split_mount` splits a validated one.
"""

from dataclasses import dataclass
from typing import Any, Optional, Tuple

from mmt.core.errors import ConfigError
from mmt.planning import validate as check

KEY = "hydra.launcher.container_mounts"


@dataclass(frozen=True)
class Mount:
    """A mount's parts: where it comes from on the host, where it goes in the container, and its options."""

    source: str
    target: str
    options: Tuple[str, ...] = ()

    @property
    def readonly(self) -> bool:
        return "ro" in self.options


@dataclass(frozen=True)
class MountSyntax:
    """The mounts one backend's runtimes take, and the words of the error for one they do not."""

    # what the error says was expected, and its hint
    expected: str
    hint: str
    # at most this many parts (SOURCE, TARGET, then options); None: any number
    max_parts: Optional[int] = None
    # SOURCE and TARGET given, TARGET an absolute path in the container
    absolute_target: bool = False
    # whether a comma may appear in a mount
    commas: bool = True
    # the hint of the error for a mount that does not fit on one line
    one_line_hint: str = "remove the newline"

    def fits(self, text: str) -> bool:
        pieces = text.split(":")
        if len(pieces) < 2 or (self.max_parts is not None and len(pieces) > self.max_parts):
            return False
        if self.absolute_target and not (all(pieces[:2]) and pieces[1].startswith("/")):
            return False
        return self.commas or "," not in text


def parse_mount(value: Any, syntax: MountSyntax) -> str:
    """One entry of ``container_mounts``, validated: its text. A malformed one is refused in one line naming the
    key."""
    text = check.one_line(KEY, str(value), syntax.one_line_hint)
    if not syntax.fits(text):
        raise ConfigError(KEY, text, syntax.expected, syntax.hint)
    return text


def split_mount(mount: str) -> Mount:
    """A mount's parts (``TARGET`` empty where there is none: a mount not validated yet)."""
    pieces = mount.split(":")
    return Mount(pieces[0], pieces[1] if len(pieces) > 1 else "", tuple(pieces[2:]))
