"""One SSH connection per launch: the system's OpenSSH, its control master carrying every command and rsync of the
launch, in batch mode (it never prompts: a key that needs a passphrase without an agent, an unknown host key or a
refused login fails at once, and :func:`refusal` says which in one line).

The launch's first command starts the master (``ControlMaster=auto``): it logs in and runs that command in one go,
and the master it leaves in the background moves its own stdio to /dev/null, so the command's pipes close when the
command ends. Every other command goes through it (``ControlMaster=no``). When it is gone (the network dropped,
sshd restarted), :meth:`Connection.open` starts a new one (``-N -f``; not ``-M`` as well, which would make it ask
before each session). An idle master ends on its own after ``PERSIST_S`` (a launcher killed without closing it
leaves none behind for long).
"""

import hashlib
import os
import shlex
import subprocess
import tempfile
import time
from pathlib import Path
from typing import IO, Any, List, Optional, Sequence, Union

from mmt.core.errors import ConfigError
from mmt.remote.settings import KEY, SshTarget

# how long a login may take before it counts as failed, and how soon a dead link is noticed (3 missed answers)
CONNECT_TIMEOUT_S = 10
ALIVE_INTERVAL_S = 5
# how long an idle master outlives its last command
PERSIST_S = 120


def refusal(target: SshTarget, said: str) -> ConfigError:
    """What ssh said when it could not log in, as one line naming the setting to fix."""
    text = " ".join(said.split())
    lower = text.lower()
    if "could not resolve hostname" in lower or "name or service not known" in lower:
        return ConfigError(
            f"{KEY}.host",
            target.host,
            "no such host (ssh could not resolve it)",
            "check the name, or the Host alias in ~/.ssh/config",
        )
    if "host key verification failed" in lower or "no matching host key" in lower:
        return ConfigError(
            f"{KEY}.host",
            target.host,
            "its host key is not in known_hosts, or it changed (ssh runs in batch mode and asks nothing)",
            f"log in once with `ssh {target.label}` and check the key, then launch again",
        )
    if "permission denied" in lower or "too many authentication failures" in lower:
        return ConfigError(
            f"{KEY}.identity_file",
            target.identity_file,
            f"{target.label} refused the login (no key it accepts; a key with a passphrase needs ssh-agent)",
            "ssh-add your key, or set identity_file to a key the cluster accepts",
        )
    if "connection refused" in lower or "timed out" in lower or "no route to host" in lower or "unreachable" in lower:
        return ConfigError(
            f"{KEY}.host", target.label, f"cannot connect ({text})", "is the host up and the port right?"
        )
    return ConfigError(f"{KEY}.host", target.label, f"ssh could not log in: {text or 'no reason given'}")


class Connection:
    """The launch's connection to ``target``: open it once, run commands and rsync through it, close it at the end."""

    def __init__(self, target: SshTarget) -> None:
        self.target = target
        # a socket path short enough for the kernel's limit (108 bytes), private, one per launcher process
        folder = Path(tempfile.gettempdir()) / f"mmt-ssh-{os.getuid()}"
        folder.mkdir(mode=0o700, exist_ok=True)
        os.chmod(folder, 0o700)
        key = hashlib.sha1(f"{target.label}|{os.getpid()}|{time.time()}".encode()).hexdigest()[:12]
        self.control_path = folder / key
        self.master_log = folder / f"{key}.log"

    def options(self) -> List[str]:
        """The ssh options of every command of the launch (those of ``~/.ssh/config`` still apply)."""
        target = self.target
        words = ["-o", "BatchMode=yes", "-o", f"ConnectTimeout={CONNECT_TIMEOUT_S}"]
        words += ["-o", f"ServerAliveInterval={ALIVE_INTERVAL_S}", "-o", "ServerAliveCountMax=3"]
        words += ["-o", f"ControlPath={self.control_path}"]
        if target.config_file:
            words += ["-F", os.path.expanduser(target.config_file)]
        if target.identity_file:
            words += ["-i", os.path.expanduser(target.identity_file), "-o", "IdentitiesOnly=yes"]
        if target.port:
            words += ["-p", str(target.port)]
        if target.user:
            words += ["-l", target.user]
        for option in target.options:
            words += ["-o", option]
        return words

    def open(self) -> None:
        """Start the master connection (ConfigError, one line, when the login fails); nothing when it runs."""
        if self.alive():
            return
        self.control_path.unlink(missing_ok=True)
        with open(self.master_log, "wb") as log:
            done = subprocess.run(
                [
                    "ssh",
                    *self.options(),
                    "-o",
                    "ControlMaster=yes",
                    "-o",
                    "ControlPersist=yes",
                    "-N",
                    "-f",
                    "--",
                    self.target.host,
                ],
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=log,
                timeout=CONNECT_TIMEOUT_S * 3 + 5,
            )
        if done.returncode != 0:
            said = self.master_log.read_text(errors="replace").strip().splitlines()
            raise refusal(self.target, said[-1] if said else f"ssh exited {done.returncode}")

    def alive(self) -> bool:
        if not self.control_path.exists():
            return False
        check = subprocess.run(
            ["ssh", *self.options(), "-O", "check", "--", self.target.host],
            stdin=subprocess.DEVNULL,
            capture_output=True,
            timeout=CONNECT_TIMEOUT_S,
        )
        return check.returncode == 0

    def close(self) -> None:
        """End the master (its commands are over); nothing when it is gone already. Not waited for: the master
        ends on its own, and the launcher need not wait to exit."""
        if self.control_path.exists():
            subprocess.Popen(
                ["ssh", *self.options(), "-O", "exit", "--", self.target.host],
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                start_new_session=True,
            )
        self.master_log.unlink(missing_ok=True)

    def remote_command(self, argv: Sequence[str], setup: bool = True) -> str:
        """The shell line run on the cluster: the target's setup lines, then ``argv`` (quoted)."""
        lines = list(self.target.setup) if setup else []
        return "\n".join([*lines, "exec " + shlex.join(argv)])

    def argv(self, remote: str, first: bool = False) -> List[str]:
        """The local command that runs the shell line ``remote`` on the cluster through the master; ``first``:
        the command that logs in and leaves the master behind."""
        master = (
            ["-o", "ControlMaster=auto", "-o", f"ControlPersist={PERSIST_S}"] if first else ["-o", "ControlMaster=no"]
        )
        return ["ssh", *self.options(), *master, "-T", "--", self.target.host, remote]

    def run(
        self, argv: Sequence[str], input: Optional[bytes] = None, timeout: Optional[float] = 120
    ) -> "subprocess.CompletedProcess[bytes]":
        return subprocess.run(
            self.argv(self.remote_command(argv)),
            input=input,
            stdin=None if input is not None else subprocess.DEVNULL,
            capture_output=True,
            timeout=timeout,
        )

    def popen(
        self,
        argv: Sequence[str],
        stdin: Union[int, IO[Any], None] = subprocess.DEVNULL,
        first: bool = False,
        **kwargs: Any,
    ) -> "subprocess.Popen[bytes]":
        if first:
            self.control_path.unlink(missing_ok=True)
        return subprocess.Popen(self.argv(self.remote_command(argv), first), stdin=stdin, **kwargs)

    def rsync(self, args: Sequence[str], timeout: Optional[float] = 600) -> "subprocess.CompletedProcess[bytes]":
        """rsync through the master; ``args`` name remote paths as ``:path`` (the host is added here)."""
        shell = shlex.join(["ssh", *self.options(), "-o", "ControlMaster=no"])
        host = self.target.host
        words = [f"{host}{a}" if a.startswith(":") else a for a in args]
        return subprocess.run(
            ["rsync", "-e", shell, *words], stdin=subprocess.DEVNULL, capture_output=True, timeout=timeout
        )
