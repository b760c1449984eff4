"""The launcher's handle on its local host agent (``mmt.agent.server``).

The agent is forked from the launcher rather than started as a new interpreter: it then begins with what the
launcher has imported already (Hydra, OmegaConf, mmt: a fifth of a second of a fresh interpreter's start here) and
goes straight to importing the jobs' preload, which is the critical path of a local launch. The fork is made from
the launcher's setup, before it starts any thread, and the child takes nothing of the launcher with it: its
descriptors are closed but for the socket to the launcher, its standard streams and signal handlers are new, and it
always ends in ``os._exit`` (no atexit handler, no buffer of the launcher's flushed twice).
"""

import os
import signal
import socket
import sys
import time
from typing import Any, Dict, List, Optional, Sequence

from mmt.agent import protocol
from mmt.agent.processes import ProcessSpec
from mmt.agent.server import StartJob
from mmt.core.snapshot import CodeSnapshot, activate


class AgentGone(RuntimeError):
    """The host agent exited while jobs were running (it was killed); their processes are gone with it."""


class AgentClient:
    def __init__(self, method: str, preload: Sequence[str] = (), snapshot: Optional[CodeSnapshot] = None) -> None:
        """``preload``: modules the agent imports as soon as it starts, before any job asks for them, from the
        launch's ``snapshot`` of the project when it has one."""
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        self.process = AgentProcess.fork(theirs, method, tuple(preload), snapshot)
        theirs.close()
        self.sock = ours

    @property
    def pid(self) -> int:
        return self.process.pid

    def start(self, job: StartJob) -> None:
        protocol.send(self.sock, {"op": "start", "job": job})

    def add(self, job_id: str, process: ProcessSpec) -> None:
        """Start one more process of a running job (an elastic job's restored node agent)."""
        protocol.send(self.sock, {"op": "add", "job_id": job_id, "process": process})

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
            if not self.process.wait(timeout_s):
                self.process.kill()
                self.process.wait(None)


class AgentProcess:
    """The agent's process, as the launcher sees it: its pid, whether and how it ended."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.returncode: Optional[int] = None

    @classmethod
    def fork(
        cls, sock: socket.socket, method: str, preload: Sequence[str], snapshot: Optional[CodeSnapshot] = None
    ) -> "AgentProcess":
        parent = os.getpid()
        for stream in (sys.stdout, sys.stderr):  # nothing of the launcher's buffered output is copied into the child
            try:
                stream.flush()
            except (OSError, ValueError):
                pass
        pid = os.fork()
        if pid == 0:
            _become_agent(sock.fileno(), parent, method, preload, snapshot)  # never returns
        return cls(pid)

    def poll(self) -> Optional[int]:
        if self.returncode is None:
            try:
                pid, status = os.waitpid(self.pid, os.WNOHANG)
            except ChildProcessError:  # reaped by someone else: gone all the same
                self.returncode = 0
                return self.returncode
            if pid == self.pid:
                self.returncode = os.waitstatus_to_exitcode(status)
        return self.returncode

    def wait(self, timeout_s: Optional[float]) -> bool:
        """Whether it ended within ``timeout_s`` (None: however long it takes)."""
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        delay = 0.0005
        while self.poll() is None:
            if deadline is not None and time.monotonic() >= deadline:
                return False
            time.sleep(delay)
            delay = min(delay * 2, 0.02)
        return True

    def kill(self) -> None:
        if self.poll() is None:
            try:
                os.kill(self.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass


def _become_agent(fd: int, parent: int, method: str, preload: Sequence[str], snapshot: Optional[CodeSnapshot]) -> None:
    """The forked child: shed the launcher's state, then run the agent until it exits (always ``os._exit``)."""
    code = 70
    try:
        # a session of its own: a signal to the launcher's process group (`kill -- -PGID`, `timeout`, a CI runner, a
        # terminal's hang-up) is the launcher's to act on, which stops the jobs through this agent and writes their
        # results; the agent still ends with the launcher (its parent-death signal)
        os.setsid()
        signal.set_wakeup_fd(-1)
        for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGCHLD, signal.SIGUSR1, signal.SIGUSR2):
            signal.signal(sig, signal.SIG_DFL)
        null = os.open(os.devnull, os.O_RDWR)
        os.dup2(null, 0)
        os.dup2(null, 1)  # the agent writes nothing to stdout (a pipe nobody reads must not be held open by it)
        keep = os.dup(fd) if fd <= 2 else fd
        os.closerange(3, keep)
        os.closerange(keep + 1, 1 << 16)  # the launcher's locks, pipes, sockets and registry are not the agent's
        sys.stdout = open(1, "w", buffering=1, closefd=False)
        sys.stderr = open(2, "w", buffering=1, closefd=False)  # its rare warnings: the launcher's stderr
        from mmt.agent import server

        args = [str(keep), str(parent), method, *preload]
        sys.argv = [server.__file__, *args]
        _retitle([sys.executable, "-m", server.__name__, *args])
        activate(snapshot)  # the preload, and every rank forked after, import the launch's copy of the project
        server.main(args)
        code = 0
    except BaseException:  # noqa: BLE001 - the child must never return into the launcher's code
        try:
            import traceback

            traceback.print_exc()
        except BaseException:  # noqa: BLE001
            pass
    finally:
        os._exit(code)


def _retitle(argv: Sequence[str]) -> None:
    """The agent's command line in ``ps`` and ``/proc``, as if it had been started as ``python -m mmt.agent.server``:
    a forked child would otherwise show the launcher's own, and pass for a second launcher (and so would every rank
    it forks). Only the launcher's argv area is rewritten (``SPT_NOENV``): its environment, which /proc shows too
    and which finds a job's processes by their tags, stays as it is."""
    before = os.environ.get("SPT_NOENV")
    os.environ["SPT_NOENV"] = "1"
    try:
        import setproctitle

        setproctitle.setproctitle(" ".join(argv))
    except ImportError:  # the title is cosmetic
        pass
    finally:
        if before is None:
            del os.environ["SPT_NOENV"]
        else:
            os.environ["SPT_NOENV"] = before
