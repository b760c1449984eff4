"""Command mode: a task function that runs ``command`` in a shell with the rank contract, and owns what it starts.

The command's processes share the rank's process group, which the agent signals as a whole; but a framework may
put its workers in sessions of their own (torchrun's workers call ``setsid``), and a command may leave background
processes behind. So the process running the command becomes a *child subreaper*: orphans of the command are
re-parented to it instead of init, and it can find and stop every descendant:

* when the command ends, whatever it left running is stopped (SIGTERM, then SIGKILL);
* when the rank is stopped (SIGTERM from the agent), every descendant gets SIGTERM at once, the stragglers SIGKILL
  shortly after; then the rank exits. (Should this process be killed outright, the agent finds the rest by the
  job's ``MMT_JOB_ID``.)

``python``, ``torchrun`` and the venv's scripts in a command are the launcher's: its interpreter's directory is
first on PATH (``mmt.planning.environment``).

A job that does not say it runs a framework pays nothing for this, but when its command fails the process reads
back the end of its log: TensorFlow that could not start its gRPC server there, with no TF_CONFIG of mmt's, is a
TF_CONFIG the script built itself (the Lightning guide's snippet), named with the key that fixes it.

In a job with a framework (``hydra.launcher.framework``) the process also watches where its command listens: a
TensorFlow worker on MASTER_PORT, or any process on a port mmt holds for another one, means the script replaced
the TF_CONFIG or the ids mmt wrote (the Lightning guide's TF_CONFIG snippet does), and its workers would wait for
each other until the time limit. The rank then fails at once, naming that (``mmt.core.rank_env.misplaced_listener``);
and when its command fails by itself, it looks whether another process of the job on this host is misplaced, and
names that instead of a bare exit code.
"""

import os
import signal
import subprocess
import sys
import time
from typing import Any, Callable, Dict, Mapping, Optional, Sequence, Set, Tuple

from mmt.core import proctree, rank_env
from mmt.core.ports import listening_ports

_STRAGGLER_WAIT_S = 0.5
# how often a framework job's process looks at where its command listens (a /proc scan of its own tree)
GUARD_INTERVAL_S = 0.5


def _signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"


class CommandFailedError(RuntimeError):
    """The command exited non-zero or was killed; carries its own exit status (not the wrapper's)."""

    def __init__(self, command: str, returncode: int) -> None:
        self.command, self.returncode = command, returncode
        self.exit_code: Optional[int] = returncode if returncode >= 0 else None
        self.signal: Optional[str] = _signal_name(-returncode) if returncode < 0 else None
        how = f"was killed by {self.signal}" if self.signal else f"exited with code {returncode}"
        super().__init__(f"command {command!r} {how}")

    def __reduce__(self) -> Tuple[Any, ...]:
        return (CommandFailedError, (self.command, self.returncode))


class FrameworkAddressError(CommandFailedError):
    """The command's framework listens where the contract does not put it: the one-line cause, and the status."""

    def __init__(self, command: str, returncode: int, reason: str) -> None:
        super().__init__(command, returncode)
        self.reason = reason
        self.args = (reason,)

    def __reduce__(self) -> Tuple[Any, ...]:
        return (FrameworkAddressError, (self.command, self.returncode, self.reason))


def _environ(pid: int) -> Dict[str, str]:
    try:
        with open(f"/proc/{pid}/environ", "rb") as handle:
            pairs = [item.split(b"=", 1) for item in handle.read().split(b"\0") if b"=" in item]
    except OSError:
        return {}
    return {k.decode(errors="replace"): v.decode(errors="replace") for k, v in pairs}


class ListenerGuard:
    """Where a framework job's processes listen, against the ports its contract (this process's) holds for each."""

    def __init__(self, env: Mapping[str, str], index: int) -> None:
        self.env, self.index = dict(env), index

    @classmethod
    def for_this_process(cls) -> Optional["ListenerGuard"]:
        index = rank_env.process_index(os.environ)
        if index is None or not rank_env.port_claims(os.environ):
            return None  # no framework: nothing mmt holds for anyone but MASTER_PORT
        return cls(os.environ, index)

    def check_own(self) -> Optional[str]:
        """Whether this process's command listens where it must not."""
        found = listening_ports(proctree.family(os.getpid()))
        return rank_env.misplaced_listener(self.env, {self.index: set().union(*found.values())} if found else {})

    def check_job(self) -> Optional[str]:
        """Whether another process of the job on this host listens where it must not (by the job's tag)."""
        job_id = self.env.get(rank_env.MMT_JOB_ID)
        if not job_id:
            return None
        by_index: Dict[int, Set[int]] = {}
        for pid, ports in listening_ports(proctree.tagged({rank_env.MMT_JOB_ID: job_id})).items():
            index = rank_env.process_index(_environ(pid))
            if index is not None:
                by_index.setdefault(index, set()).update(ports)
        return rank_env.misplaced_listener(self.env, by_index)

    @property
    def name(self) -> str:
        return f"{'TF worker' if self.env.get(rank_env.TF_CONFIG) else 'JAX process'} {self.index}"


_TAIL_BYTES = 64 * 1024


def _own_output_tail() -> str:
    """The end of what this process and its command printed: its stdout is the rank's log (read after a failure
    only)."""
    try:
        with open(f"/proc/self/fd/{sys.stdout.fileno()}", "rb") as handle:
            handle.seek(0, os.SEEK_END)
            handle.seek(max(0, handle.tell() - _TAIL_BYTES))
            return handle.read().decode(errors="replace")
    except (OSError, ValueError):  # not a file (a pipe, a terminal): nothing to read back
        return ""


def _wait(process: "subprocess.Popen[bytes]", guard: Optional[ListenerGuard]) -> Tuple[int, Optional[str]]:
    """The command's exit status, and why the guard stopped it (None: it ended by itself)."""
    while True:
        try:
            return process.wait(timeout=GUARD_INTERVAL_S if guard is not None else None), None
        except subprocess.TimeoutExpired:
            reason = guard.check_own() if guard is not None else None
            if reason is not None:  # stop the command, reaping nothing before Popen has its status
                proctree.signal_all(proctree.descendants(os.getpid()), signal.SIGTERM)
                try:
                    return process.wait(timeout=_STRAGGLER_WAIT_S), reason
                except subprocess.TimeoutExpired:
                    proctree.signal_all(proctree.descendants(os.getpid()), signal.SIGKILL)
                    return process.wait(), reason


def stop_descendants(grace_s: float = _STRAGGLER_WAIT_S) -> Set[int]:
    """SIGTERM every descendant of this process, SIGKILL those still there after ``grace_s``; their pids."""
    me = os.getpid()
    first = proctree.descendants(me)
    proctree.signal_all(first, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    left = first
    while left and time.monotonic() < deadline:
        time.sleep(0.02)
        proctree.reap_any()
        left = proctree.descendants(me)
    proctree.signal_all(left, signal.SIGKILL)
    proctree.reap_any()
    return set(first)


def _on_sigterm(signum: int, _frame: Any) -> None:
    stop_descendants()
    signal.signal(signum, signal.SIG_DFL)
    os.kill(os.getpid(), signum)  # die of the signal, as a rank without a command would


def command_task(command: str, container: Sequence[str] = ()) -> Callable[[Any], Dict[str, Any]]:
    """A task function that runs ``command`` in a shell with this process's environment (the rank contract);
    ``container``: the ``exec`` that runs it in the node's container instead (``MMT_CONTAINER_EXEC``), which passes
    the contract in by name."""
    shell = [*container, "sh", "-c", command] if container else ["/bin/sh", "-c", command]

    def run_command(_cfg: Any) -> Dict[str, Any]:
        sys.stdout.flush()
        sys.stderr.flush()
        proctree.become_subreaper()
        previous = signal.signal(signal.SIGTERM, _on_sigterm)
        started = time.monotonic()
        guard = ListenerGuard.for_this_process()
        try:
            code, reason = _wait(subprocess.Popen(shell, env=os.environ.copy()), guard)
        finally:
            left = stop_descendants()
            signal.signal(signal.SIGTERM, previous)
        if left:
            print(
                f"mmt: stopped {len(left)} process(es) the command left running: {sorted(left)}",
                file=sys.stderr,
                flush=True,
            )
        if reason is None and code != 0 and guard is not None:
            cause = guard.check_job()
            if cause is not None:
                reason = f"{guard.name}'s command exited with code {code} while {cause}"
        if reason is None and code != 0 and guard is None:  # a job that did not say it runs a framework
            reason = rank_env.self_made_tf_config(os.environ, _own_output_tail())
        if reason is not None:
            print(f"mmt: {reason}", file=sys.stderr, flush=True)
            raise FrameworkAddressError(command, code, reason)
        if code != 0:
            raise CommandFailedError(command, code)
        return {"seconds": round(time.monotonic() - started, 3), "exit_code": code}

    return run_command
