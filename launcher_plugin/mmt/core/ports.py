"""Holding a TCP port for a job's rendezvous (MASTER_PORT) from the moment it is chosen until the job ends.

Choosing a port by binding it and closing it leaves a window before rank 0's TCPStore binds it, in which any
process's outgoing connection or ``bind(0)`` can take it (rank 0 then fails with EADDRINUSE). A socket bound with
SO_REUSEADDR and never listening closes that window: Linux hands a bound port neither to ``bind(0)`` nor to an
outgoing connection, and rank 0's TCPStore (which sets SO_REUSEADDR too) can still bind and listen on it.
"""

import socket


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
