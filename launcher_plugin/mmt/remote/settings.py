"""``hydra.launcher.ssh``: the cluster a launch reaches over SSH, validated before anything starts (one line per bad
value, naming the key).

::

    ssh:
      host: login.mycluster.org   # a host name or an alias of ~/.ssh/config (its User, Port, ProxyJump ... apply)
      remote_root: ~/mmt          # on the cluster: the code, the sweeps and the registry of these launches
      user: null                  # null: ~/.ssh/config's, else the local user name
      port: null
      identity_file: null         # a private key; null: the agent's and ~/.ssh/config's
      config_file: null           # another ssh config file than ~/.ssh/config (ssh -F)
      python: python3             # the cluster's Python, with mmt installed (the same version as here)
      setup: []                   # shell lines run before each command there, e.g. ["module load slurm"]
      grace_s: 600                # how long the launcher tries to reconnect before it gives up (the jobs run on)
      options: []                 # any other ssh option, e.g. ["ServerAliveInterval=10"]
"""

import re
from dataclasses import dataclass, field
from typing import Any, Dict, Optional, Tuple

from omegaconf import DictConfig, OmegaConf

from mmt.core.errors import ConfigError
from mmt.planning.validate import settings_block

KEY = "hydra.launcher.ssh"
_FIELDS = (
    "host",
    "remote_root",
    "user",
    "port",
    "identity_file",
    "config_file",
    "python",
    "setup",
    "grace_s",
    "options",
)
_OPTION = re.compile(r"^[A-Za-z][A-Za-z0-9]*=\S.*$")


@dataclass(frozen=True)
class SshTarget:
    """Where the jobs of a launch live: the login node and the folder there."""

    host: str
    remote_root: str
    user: Optional[str] = None
    port: Optional[int] = None
    identity_file: Optional[str] = None
    config_file: Optional[str] = None
    python: str = "python3"
    setup: Tuple[str, ...] = ()
    grace_s: float = 600.0
    options: Tuple[str, ...] = field(default=())

    @property
    def label(self) -> str:
        """How messages name the cluster: ``user@host`` (the port when one is given)."""
        who = f"{self.user}@{self.host}" if self.user else self.host
        return f"{who}:{self.port}" if self.port else who

    def as_dict(self) -> Dict[str, Any]:
        return {name: list(v) if isinstance(v, tuple) else v for name, v in vars(self).items()}

    @classmethod
    def of_dict(cls, data: Dict[str, Any]) -> "SshTarget":
        given: Dict[str, Any] = {k: tuple(v) if isinstance(v, list) else v for k, v in data.items() if k in _FIELDS}
        return cls(**given)


def _text(name: str, value: Any, required: bool = False, example: str = "") -> Optional[str]:
    if value is None and not required:
        return None
    if not isinstance(value, str) or not value.strip() or "\n" in value:
        raise ConfigError(f"{KEY}.{name}", value, "expected a non-empty line of text", example or None)
    return value.strip()


def of(launcher_cfg: DictConfig) -> Optional[SshTarget]:
    """The launch's SSH target, or None when it runs where the launcher is (no ``hydra.launcher.ssh``)."""
    raw = OmegaConf.select(launcher_cfg, "ssh", default=None)
    if raw is None:
        return None
    example = f"e.g. {KEY}={{host:login,remote_root:~/mmt}}"
    given = settings_block(KEY, raw, _FIELDS, "expected {host, remote_root, ...}", example)
    if given.get("host") is None and given.get("remote_root") is None and not any(given.values()):
        return None  # an empty ssh: {} in a site config, not filled in: the launch runs here
    host = _text("host", given.get("host"), True, f"{KEY}.host=login.mycluster.org (or an alias of ~/.ssh/config)")
    assert host is not None
    if host.startswith("-") or any(c.isspace() for c in host):
        raise ConfigError(f"{KEY}.host", host, "expected a host name or an ssh alias (no spaces, no leading '-')")
    root = _text("remote_root", given.get("remote_root"), True, f"{KEY}.remote_root=~/mmt")
    assert root is not None
    if not (root.startswith("/") or root == "~" or root.startswith("~/")):
        raise ConfigError(
            f"{KEY}.remote_root",
            root,
            "expected an absolute path on the cluster, or one under ~/",
            f"{KEY}.remote_root=~/mmt",
        )
    port = given.get("port")
    if port is not None and (isinstance(port, bool) or not isinstance(port, int) or not 0 < port < 65536):
        raise ConfigError(f"{KEY}.port", port, "expected a TCP port (1-65535), or null for ssh's own")
    grace = given.get("grace_s", 600.0)
    if isinstance(grace, bool) or not isinstance(grace, (int, float)) or grace < 0:
        raise ConfigError(f"{KEY}.grace_s", grace, "expected seconds >= 0", f"e.g. {KEY}.grace_s=600")
    setup = given.get("setup") or []
    if isinstance(setup, str):
        setup = [setup]
    if not isinstance(setup, list) or not all(isinstance(line, str) and "\n" not in line for line in setup):
        raise ConfigError(
            f"{KEY}.setup", setup, "expected a list of shell lines", f'e.g. {KEY}.setup=["module load slurm"]'
        )
    options = given.get("options") or []
    if isinstance(options, str):
        options = [options]
    bad = (
        [o for o in options if not isinstance(o, str) or not _OPTION.match(o)]
        if isinstance(options, list)
        else [options]
    )
    if bad:
        raise ConfigError(
            f"{KEY}.options",
            bad[0],
            "expected ssh options as Name=value",
            f"e.g. {KEY}.options=[ServerAliveInterval=10]",
        )
    return SshTarget(
        host=host,
        remote_root=root,
        user=_text("user", given.get("user")),
        port=port,
        identity_file=_text("identity_file", given.get("identity_file")),
        config_file=_text("config_file", given.get("config_file")),
        python=_text("python", given.get("python", "python3")) or "python3",
        setup=tuple(setup),
        grace_s=float(grace),
        options=tuple(options),
    )
