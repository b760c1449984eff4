"""The host agent: a small process that starts, signals and reaps the ranks of every local job.

Why a separate process: ``import torch`` (and ``lightning``) costs seconds of CPU per process. The agent imports
the job's ``preload`` modules once and *forks* each rank from that warm interpreter (the standard library's
forkserver idea), so a sweep pays the import once per host instead of once per rank. It never touches CUDA, so
forking stays safe. With ``start_method=spawn`` it execs a fresh interpreter per rank instead.

It is also the clean-up guarantee: every rank runs in its own session (process group) with a parent-death
signal, and when the launcher goes away for any reason (normal exit, Ctrl-C, SIGKILL) the agent sees its socket
close, or receives SIGTERM from the kernel, and kills every process group it started before exiting.

Protocol (length-prefixed pickles over a Unix socket pair; both ends are this package, same user):
    launcher -> agent  {"op": "spawn", "token", "payload_dir", "index", "env", "cwd", "log", "preload", "method"}
                       {"op": "signal", "pid", "signal"}
    agent -> launcher  {"op": "started", "token", "pid"}  {"op": "exited", "pid", "code"}  (code < 0: -signal)
"""

import ctypes
import os
import pickle
import selectors
import signal
import socket
import struct
import subprocess
import sys
import time
from typing import Any, Dict, Optional

_HEADER = struct.Struct("!I")
_PR_SET_PDEATHSIG = 1


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


def set_parent_death_signal(sig: int) -> None:
    """Ask Linux to send ``sig`` to this process when its parent dies (a no-op elsewhere)."""
    try:
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, sig, 0, 0, 0)
    except (OSError, AttributeError):
        pass


# --------------------------------------------------------------------------------------------- agent side


class _Agent:
    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.children: Dict[int, str] = {}  # pid -> token
        self.imported: set = set()

    def serve(self) -> None:
        wake_r, wake_w = os.pipe()
        os.set_blocking(wake_w, False)
        signal.set_wakeup_fd(wake_w)
        signal.signal(signal.SIGCHLD, lambda *_: None)
        signal.signal(signal.SIGTERM, lambda *_: self.shutdown())
        selector = selectors.DefaultSelector()
        selector.register(self.sock, selectors.EVENT_READ)
        selector.register(wake_r, selectors.EVENT_READ)
        while True:
            for key, _ in selector.select(timeout=1.0):
                if key.fileobj is self.sock:
                    message = recv(self.sock)
                    if message is None:
                        self.shutdown()
                    self.handle(message)
                else:
                    os.read(wake_r, 4096)
            self.reap()

    def handle(self, message: Dict[str, Any]) -> None:
        if message["op"] == "spawn":
            pid = self.spawn(message)
            send(self.sock, {"op": "started", "token": message["token"], "pid": pid})
        elif message["op"] == "signal" and message["pid"] in self.children:
            try:
                os.killpg(message["pid"], message["signal"])
            except ProcessLookupError:
                pass

    def preload(self, modules: Any) -> None:
        for name in modules:
            if name not in self.imported:
                self.imported.add(name)
                try:
                    __import__(name)
                except Exception as exc:  # the rank will import it itself and report a real error
                    print(f"[mmt agent] could not preload {name}: {exc}", file=sys.stderr)

    def spawn(self, message: Dict[str, Any]) -> int:
        if message["method"] == "fork":
            # what every rank imports anyway (Hydra, cloudpickle), then what the job asks for (torch ...)
            self.preload(("hydra.core.utils", "hydra.core.plugins", "cloudpickle", *message["preload"]))
        pid = os.fork()
        if pid == 0:  # child: never returns
            self._become_process(message)
        self.children[pid] = message["token"]
        return pid

    def _become_process(self, message: Dict[str, Any]) -> None:
        code = 70
        try:
            os.setsid()  # own process group: stop it as a whole, immune to the terminal's Ctrl-C
            set_parent_death_signal(signal.SIGKILL)
            signal.set_wakeup_fd(-1)
            for sig in (signal.SIGCHLD, signal.SIGTERM, signal.SIGINT):
                signal.signal(sig, signal.SIG_DFL)
            log = os.open(message["log"], os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
            null = os.open(os.devnull, os.O_RDONLY)
            os.dup2(null, 0)
            os.dup2(log, 1)
            os.dup2(log, 2)
            os.closerange(3, 1 << 16)  # the agent's socket and pipes are not the rank's business
            os.chdir(message["cwd"])
            os.environ.clear()
            os.environ.update(message["env"])
            args = [message["payload_dir"], str(message["index"])]
            if message["method"] == "spawn":
                os.execve(sys.executable, [sys.executable, "-u", "-m", __package__ + "._worker", *args],
                          message["env"])
            sys.stdout = open(1, "w", buffering=1, closefd=False)  # line-buffered: the console follows the log
            sys.stderr = open(2, "w", buffering=1, closefd=False)
            from ._worker import main

            code = main(args)
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) else 1
        except BaseException:
            import traceback

            traceback.print_exc()
            code = 71
        finally:
            try:
                sys.stdout.flush()
                sys.stderr.flush()
            finally:
                os._exit(code)

    def reap(self) -> None:
        while self.children:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            if self.children.pop(pid, None) is not None:
                try:
                    send(self.sock, {"op": "exited", "pid": pid, "code": os.waitstatus_to_exitcode(status)})
                except OSError:  # the launcher is gone
                    self.shutdown()

    def shutdown(self) -> None:
        """Kill every process group we started (SIGTERM, then SIGKILL) and exit."""
        for sig, wait_s in ((signal.SIGTERM, 1.0), (signal.SIGKILL, 5.0)):
            for pid in list(self.children):
                try:
                    os.killpg(pid, sig)
                except ProcessLookupError:
                    pass
            deadline = time.monotonic() + wait_s
            while self.children and time.monotonic() < deadline:
                try:
                    pid, _ = os.waitpid(-1, os.WNOHANG)
                except ChildProcessError:
                    self.children.clear()
                    break
                if pid:
                    self.children.pop(pid, None)
                else:
                    time.sleep(0.02)
        os._exit(0)


def agent_main(fd: int, parent: int) -> None:
    # Ctrl-C goes to the launcher, which stops the jobs; SIGTERM when the launcher dies means "clean up"
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    set_parent_death_signal(signal.SIGTERM)
    if os.getppid() != parent:  # the launcher died before the death signal was armed
        return
    _Agent(socket.socket(fileno=fd)).serve()


# --------------------------------------------------------------------------------------------- launcher side


class AgentClient:
    """The launcher's handle on its agent process."""

    def __init__(self) -> None:
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        self.process = subprocess.Popen(
            [sys.executable, "-m", __package__ + "._agent", str(theirs.fileno()), str(os.getpid())],
            pass_fds=[theirs.fileno()],
            stdin=subprocess.DEVNULL,
        )
        theirs.close()
        self.sock = ours
        self._next_token = 0

    def spawn(self, *, payload_dir: str, index: int, env: Dict[str, str], cwd: str, log: str,
              preload: Any, method: str) -> str:
        self._next_token += 1
        token = str(self._next_token)
        send(self.sock, {"op": "spawn", "token": token, "payload_dir": payload_dir, "index": index, "env": env,
                         "cwd": cwd, "log": log, "preload": list(preload), "method": method})
        return token

    def signal(self, pid: int, sig: int) -> None:
        send(self.sock, {"op": "signal", "pid": pid, "signal": int(sig)})

    def fileno(self) -> int:
        return self.sock.fileno()

    def receive(self) -> Optional[Dict[str, Any]]:
        message = recv(self.sock)
        if message is None:
            raise RuntimeError(f"the mmt agent (pid {self.process.pid}) exited unexpectedly")
        return message

    def close(self) -> None:
        """Close the socket: the agent kills whatever is left and exits."""
        try:
            self.sock.close()
        finally:
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()


if __name__ == "__main__":
    agent_main(int(sys.argv[1]), int(sys.argv[2]))
