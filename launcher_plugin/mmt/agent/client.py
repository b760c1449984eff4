"""The launcher's handle on its local host agent (``mmt.agent.server``)."""

import os
import socket
import subprocess
import sys
from typing import Any, Dict, List, Optional

from mmt.agent import protocol
from mmt.agent.server import StartJob


class AgentGone(RuntimeError):
    """The host agent exited while jobs were running (it was killed); their processes are gone with it."""


class AgentClient:
    def __init__(self, method: str) -> None:
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        self.process = subprocess.Popen(
            [sys.executable, "-m", "mmt.agent.server", str(theirs.fileno()), str(os.getpid()), method],
            pass_fds=[theirs.fileno()],
            # the agent writes nothing to stdout (its ranks write their logs): a pipe nobody reads, or one that
            # is closed (| head), must not be held open or written by it; its rare warnings go to stderr
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
        )
        theirs.close()
        self.sock = ours

    @property
    def pid(self) -> int:
        return self.process.pid

    def start(self, job: StartJob) -> None:
        protocol.send(self.sock, {"op": "start", "job": job})

    def stop(self, job_id: str) -> None:
        try:
            protocol.send(self.sock, {"op": "stop", "job_id": job_id})
        except OSError:
            pass  # the agent is gone; receive() reports it

    def kill(self, job_id: str) -> None:
        try:
            protocol.send(self.sock, {"op": "kill", "job_id": job_id})
        except OSError:
            pass

    def fileno(self) -> int:
        return self.sock.fileno()

    def receive(self) -> Dict[str, Any]:
        message = protocol.recv(self.sock)
        if message is None:
            code = self.process.poll()
            raise AgentGone(
                f"the mmt host agent (pid {self.process.pid}) exited unexpectedly"
                + (f" with code {code}" if code is not None else "")
            )
        return message

    def pending(self) -> List[Dict[str, Any]]:
        """Every message that has arrived, without blocking."""
        import select

        messages = []
        while select.select([self.sock], [], [], 0)[0]:
            messages.append(self.receive())
        return messages

    def close(self, timeout_s: Optional[float] = 10) -> None:
        """Close the socket: the agent kills whatever is left and exits."""
        try:
            self.sock.close()
        finally:
            try:
                self.process.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
