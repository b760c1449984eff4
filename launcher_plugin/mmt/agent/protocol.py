"""Messages between the launcher and its local host agent: length-prefixed pickles over a Unix socket pair.

Both ends are this package, run by the same user, and the socket pair is never on disk.

    launcher -> agent  {"op": "start", "job": StartJob}   {"op": "stop", "job_id"}   {"op": "kill", "job_id"}
                       {"op": "add", "job_id", "process": ProcessSpec}   (a process joins a running job: a
                                                                          restored node of an elastic job)
    agent -> launcher  {"op": "started", "job_id", "index", "pid"}
                       {"op": "exited", "job_id", "index", "code", "stopped"}   (code < 0: killed by -code)
                       {"op": "ended", "job_id"}                                 (every process and leftover gone)
"""

import pickle
import socket
import struct
from typing import Any, Dict, Optional

_HEADER = struct.Struct("!I")


def send(sock: socket.socket, message: Dict[str, Any]) -> None:
    data = pickle.dumps(message)
    sock.sendall(_HEADER.pack(len(data)) + data)


def _recv_exact(sock: socket.socket, size: int) -> Optional[bytes]:
    chunks, left = [], size
    while left:
        chunk = sock.recv(left)
        if not chunk:
            return None
        chunks.append(chunk)
        left -= len(chunk)
    return b"".join(chunks)


def recv(sock: socket.socket) -> Optional[Dict[str, Any]]:
    """One message, or None when the other end has closed."""
    header = _recv_exact(sock, _HEADER.size)
    if header is None:
        return None
    body = _recv_exact(sock, _HEADER.unpack(header)[0])
    return None if body is None else pickle.loads(body)
