"""Holding a TCP port for a job's rendezvous (MASTER_PORT) from the moment it is chosen until the job ends.

Choosing a port by binding it and closing it leaves a window before rank 0's TCPStore binds it, in which any
process's outgoing connection or ``bind(0)`` can take it (rank 0 then fails with EADDRINUSE). A socket bound with
SO_REUSEADDR and never listening closes that window: Linux hands a bound port neither to ``bind(0)`` nor to an
outgoing connection, and rank 0's TCPStore (which sets SO_REUSEADDR too) can still bind and listen on it.

Which ports a set of processes listens on (:func:`listening_ports`) is how a rank finds out that a framework's
server is not where the contract put it (``mmt.core.rank_env.misplaced_listener``).
"""

import os
import socket
from typing import Dict, Iterable, Set


class PortInUseError(OSError):
    """The port is held by another process (listening, or bound without SO_REUSEADDR)."""


def hold_port(host: str, port: int = 0) -> socket.socket:
    """A socket that holds ``port`` (0: a free one) on ``host`` ("" = every address); close it to release."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as exc:
        sock.close()
        raise PortInUseError(exc.errno, f"port {port} on {host or 'this host'} is in use by another process") from exc
    return sock


_LISTEN = "0A"  # TCP_LISTEN in /proc/net/tcp's "st" column


def _listening_sockets() -> Dict[str, int]:
    """inode -> port of every listening TCP socket of this network namespace (IPv4 and IPv6)."""
    found: Dict[str, int] = {}
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            with open(table) as handle:
                next(handle, None)
                for line in handle:
                    fields = line.split()
                    if len(fields) > 9 and fields[3] == _LISTEN:
                        found[fields[9]] = int(fields[1].rsplit(":", 1)[1], 16)
        except OSError:
            continue
    return found


def listening_ports(pids: Iterable[int]) -> Dict[int, Set[int]]:
    """The TCP ports each of ``pids`` listens on (Linux; {} elsewhere): their sockets' inodes, looked up among the
    listening sockets. A process that exits meanwhile is left out."""
    listening = _listening_sockets()
    result: Dict[int, Set[int]] = {}
    if not listening:
        return result
    for pid in pids:
        try:
            fds = os.listdir(f"/proc/{pid}/fd")
        except OSError:
            continue
        ports = set()
        for fd in fds:
            try:
                target = os.readlink(f"/proc/{pid}/fd/{fd}")
            except OSError:
                continue
            if target.startswith("socket:[") and target[8:-1] in listening:
                ports.add(listening[target[8:-1]])
        if ports:
            result[pid] = ports
    return result
