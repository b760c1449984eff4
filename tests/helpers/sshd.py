"""A real SSH login node on the loopback (Debian's OpenSSH server, started by the tests with a config of its own),
and a "laptop": a process in a mount namespace of its own, where the cluster's remote root is an empty tmpfs and
SLURM's commands are not executable, so a launch that used a shared path or a local SLURM command fails."""

import os
import shutil
import signal
import socket
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, List, Optional, Sequence

import psutil
import pytest

SSHD = "/usr/sbin/sshd"
SLURM_COMMANDS = ("sbatch", "squeue", "scancel", "scontrol", "sacct", "srun", "sinfo", "salloc")
HOST_ALIAS = "mmt-login"


def why_no_sshd() -> Optional[str]:
    if os.geteuid() != 0:
        return "the SSH login node needs root (a host key, a login as root)"
    for tool in (SSHD, "ssh", "ssh-keygen", "rsync"):
        if shutil.which(tool) is None:
            return f"{tool} is not installed (apt-get install openssh-server rsync)"
    return None


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@dataclass
class LoginNode:
    """sshd on 127.0.0.1:<port>, accepting one key; ``config`` is an ssh config file naming it ``mmt-login``."""

    dir: Path
    port: int
    config: Path
    key: Path
    process: Optional[subprocess.Popen] = None

    @classmethod
    def create(cls, folder: Path) -> "LoginNode":
        folder.mkdir(parents=True, exist_ok=True)
        os.chmod(folder, 0o700)
        port = _free_port()
        host_key, key = folder / "host_key", folder / "id_ed25519"
        for path in (host_key, key):
            if not path.exists():
                subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(path)], check=True)
        shutil.copy(f"{key}.pub", folder / "authorized_keys")
        (folder / "known_hosts").write_text(f"[127.0.0.1]:{port} {Path(f'{host_key}.pub').read_text()}")
        (folder / "sshd_config").write_text(
            f"Port {port}\nListenAddress 127.0.0.1\nHostKey {host_key}\nPidFile {folder}/sshd.pid\n"
            f"AuthorizedKeysFile {folder}/authorized_keys\nPermitRootLogin prohibit-password\n"
            "PasswordAuthentication no\nKbdInteractiveAuthentication no\nUsePAM no\nStrictModes no\n"
            "MaxSessions 100\nMaxStartups 100:30:200\n"
        )
        config = folder / "ssh_config"
        config.write_text(
            f"Host {HOST_ALIAS}\n  HostName 127.0.0.1\n  Port {port}\n  User root\n  IdentityFile {key}\n"
            f"  IdentitiesOnly yes\n  UserKnownHostsFile {folder}/known_hosts\n  StrictHostKeyChecking yes\n"
        )
        return cls(dir=folder, port=port, config=config, key=key)

    def start(self) -> "LoginNode":
        Path("/run/sshd").mkdir(exist_ok=True)
        self.process = subprocess.Popen(
            [SSHD, "-D", "-e", "-f", str(self.dir / "sshd_config")],
            stdout=open(self.dir / "sshd.log", "ab"),
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            with socket.socket() as sock:
                if sock.connect_ex(("127.0.0.1", self.port)) == 0:
                    return self
            if self.process.poll() is not None:
                raise RuntimeError((self.dir / "sshd.log").read_text()[-2000:])
            time.sleep(0.05)
        raise RuntimeError("sshd did not listen within 20 s")

    def cut(self) -> None:
        """The link goes: sshd and every session it serves are killed (the processes those sessions started in
        sessions of their own, as mmt's launch there, run on)."""
        if self.process is None:
            return
        try:
            tree = [psutil.Process(self.process.pid), *psutil.Process(self.process.pid).children(recursive=True)]
        except psutil.NoSuchProcess:
            tree = []
        for proc in tree:
            try:
                if proc.name() == "sshd" or proc.pid == self.process.pid:
                    proc.send_signal(signal.SIGKILL)
            except psutil.NoSuchProcess:
                pass
        self.process.wait(timeout=10)
        self.process = None

    def stop(self) -> None:
        self.cut()

    def ssh_settings(self, remote_root: Path, python: str, setup: Sequence[str] = ()) -> List[str]:
        """The overrides of a launch over SSH to this node."""
        quoted = ",".join(f"'{line}'" for line in setup)
        return [
            f"+hydra.launcher.ssh.host={HOST_ALIAS}",
            f"+hydra.launcher.ssh.config_file={self.config}",
            f"+hydra.launcher.ssh.remote_root={remote_root}",
            f"+hydra.launcher.ssh.python={python}",
            f"+hydra.launcher.ssh.setup=[{quoted}]",
        ]


class Laptop:
    """A machine that shares nothing with the cluster but the SSH connection: a persistent mount namespace where
    its own folder (``home``: the project, the sweeps, MMT_HOME) is a tmpfs the cluster cannot see, the cluster's
    remote root an empty tmpfs it cannot see into, and SLURM's commands cannot run (each is /dev/null, not
    executable). Every command of a test on the laptop runs in it (``nsenter``)."""

    def __init__(self, folder: Path, home: Path, hidden: Sequence[Path]) -> None:
        self.folder, self.home, self.hidden = folder, home, list(hidden)
        self.ns = folder / "mnt"

    def start(self) -> "Laptop":
        self.folder.mkdir(parents=True, exist_ok=True)
        for command in (
            ["mount", "--bind", str(self.folder), str(self.folder)],
            ["mount", "--make-private", str(self.folder)],
        ):
            subprocess.run(command, check=True, capture_output=True)
        self.ns.touch()
        script = ["set -e", f"mkdir -p {self.home} && mount -t tmpfs -o size=256m tmpfs {self.home}"]
        for path in self.hidden:
            script.append(f"mkdir -p {path} && mount -t tmpfs -o size=1m tmpfs {path}")
        for tool in SLURM_COMMANDS:
            found = shutil.which(tool)
            if found:
                script.append(f"mount --bind /dev/null {os.path.realpath(found)}")
        subprocess.run(
            ["unshare", f"--mount={self.ns}", "--propagation", "private", "sh", "-c", "\n".join(script)],
            check=True,
            capture_output=True,
        )
        return self

    def argv(self, argv: Sequence[str]) -> List[str]:
        return ["nsenter", f"--mount={self.ns}", "--", *argv]

    def env(self, **extra: str) -> Dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM")}
        return {**env, "MMT_HOME": str(self.home / "mmt-home"), "PYTHONUNBUFFERED": "1", **extra}

    def run(
        self, argv: Sequence[str], cwd: Optional[Path] = None, timeout: float = 300, **extra: str
    ) -> subprocess.CompletedProcess:
        return subprocess.run(
            self.argv(["sh", "-c", 'cd "$0" && exec "$@"', str(cwd or self.home), *argv]),
            env=self.env(**extra),
            capture_output=True,
            text=True,
            timeout=timeout,
        )

    def popen(self, argv: Sequence[str], out: Path, cwd: Optional[Path] = None, **extra: str) -> subprocess.Popen:
        return subprocess.Popen(
            self.argv(["sh", "-c", 'cd "$0" && exec "$@"', str(cwd or self.home), *argv]),
            env=self.env(**extra),
            stdout=open(out, "w"),
            stderr=subprocess.STDOUT,
            text=True,
        )

    def read(self, path: Path) -> Optional[str]:
        done = subprocess.run(self.argv(["cat", str(path)]), capture_output=True, text=True)
        return done.stdout if done.returncode == 0 else None

    def exists(self, path: Path) -> bool:
        return subprocess.run(self.argv(["test", "-e", str(path)])).returncode == 0

    def copy_in(self, source: Path, target: Path) -> None:
        subprocess.run(self.argv(["cp", "-a", f"{source}/.", str(target)]), check=True, capture_output=True)

    def close(self) -> None:
        subprocess.run(["umount", "-l", str(self.ns)], capture_output=True)
        subprocess.run(["umount", "-l", str(self.folder)], capture_output=True)


def skip_without_sshd() -> None:
    why = why_no_sshd()
    if why:
        if os.environ.get("MMT_REQUIRE_SLURM") == "1":
            pytest.fail(f"an SSH login node is required in CI but {why}")
        pytest.skip(why)
