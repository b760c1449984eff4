"""Command mode: a task function that runs ``command`` in a shell with the rank contract, and owns what it starts.

The command's processes share the rank's process group, which the agent signals as a whole; but a framework may
put its workers in sessions of their own (torchrun's workers call ``setsid``), and a command may leave background
processes behind. So the process running the command becomes a *child subreaper*: orphans of the command are
re-parented to it instead of init, and it can find and stop every descendant:

* when the command ends, whatever it left running is stopped (SIGTERM, then SIGKILL);
* when the rank is stopped (SIGTERM from the agent), every descendant gets SIGTERM at once, the stragglers SIGKILL
  shortly after; then the rank exits. (Should this process be killed outright, the agent finds the rest by the
  job's ``MMT_JOB_ID``.)

A command in its node's container (a local job with an image: ``MMT_CONTAINER_EXEC``, the runtime's ``exec``) runs in
the container's PID namespace, where an orphan is adopted by the container's init, never by this process; and this
process's own descendants are then the runtime's, not the command's: its exec client, and for a runtime that
watches an exec session with a process of its own (podman's conmon, and the clean-up it runs when the session ends)
that process too. So there the command's processes are found by what they inherit from this one: the job's tag,
the run and this process's index (:func:`command_tags`), and only they are stopped and reported; this process adopts
nothing, and the runtime's own processes end by themselves.

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
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence, Set, Tuple

from mmt.core import proctree, rank_env
from mmt.core.ports import listening_ports
from mmt.core.rank_env import MMT_JOB_ID, MMT_RESTART_COUNT, NODE_RANK, RANK

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


def command_tags(env: Mapping[str, str]) -> Dict[str, str]:
    """What every process of this process's command inherits and no other process of the job carries: the job's
    tag, the run (a restart's) and the process's index in the plan (``RANK``; a per-node command's ``NODE_RANK``).
    Empty outside a job."""
    if not env.get(MMT_JOB_ID):
        return {}
    tags = {name: env[name] for name in (MMT_JOB_ID, MMT_RESTART_COUNT) if env.get(name)}
    place = RANK if env.get(RANK) else NODE_RANK
    if env.get(place):
        tags[place] = env[place]
    return tags


class CommandProcesses:
    """Where this process's command runs, and so how its processes are found and stopped.

    On this host they are this process's descendants (it adopts their orphans: a child subreaper). In the node's
    container they are the processes that carry :func:`command_tags` (the runtime's exec client among them while it
    runs); this process's other descendants there are the runtime's own, left alone."""

    def __init__(self, in_container: bool, env: Mapping[str, str]) -> None:
        self.tags = command_tags(env) if in_container else None

    def adopt(self) -> None:
        """Adopt the command's orphans, where they can be adopted (on this host)."""
        if self.tags is None:
            proctree.become_subreaper()

    def pids(self) -> List[int]:
        """The command's live processes, this one aside."""
        me = os.getpid()
        if self.tags is None:
            return proctree.descendants(me)
        return proctree.tagged(self.tags, exclude=(me,)) if self.tags else []

    def family(self) -> List[int]:
        """This process and the command's: where it listens."""
        return proctree.family(os.getpid()) if self.tags is None else [os.getpid(), *self.pids()]

    def stop(self, grace_s: float = 0.5) -> Set[int]:
        """SIGTERM every process of the command, SIGKILL those still there after ``grace_s``; their pids."""
        first = self.pids()
        proctree.signal_all(first, signal.SIGTERM)
        deadline = time.monotonic() + grace_s
        left = first
        while left and time.monotonic() < deadline:
            time.sleep(0.02)
            proctree.reap_any()
            left = self.pids()
        proctree.signal_all(left, signal.SIGKILL)
        proctree.reap_any()
        return set(first)


class ListenerGuard:
    """Where a framework job's processes listen, against the ports its contract (this process's) holds for each."""

    def __init__(self, env: Mapping[str, str], index: int, command: Optional[CommandProcesses] = None) -> None:
        self.env, self.index = dict(env), index
        self.command = command or CommandProcesses(False, env)

    @classmethod
    def for_this_process(cls, command: Optional[CommandProcesses] = None) -> Optional["ListenerGuard"]:
        index = rank_env.process_index(os.environ)
        if index is None or not rank_env.port_claims(os.environ):
            return None  # no framework: nothing mmt holds for anyone but MASTER_PORT
        return cls(os.environ, index, command)

    def check_own(self) -> Optional[str]:
        """Whether this process's command listens where it must not."""
        found = listening_ports(self.command.family())
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


def _wait(
    process: "subprocess.Popen[bytes]", guard: Optional[ListenerGuard], command: CommandProcesses
) -> Tuple[int, Optional[str]]:
    """The command's exit status, and why the guard stopped it (None: it ended by itself)."""
    while True:
        try:
            return process.wait(timeout=GUARD_INTERVAL_S if guard is not None else None), None
        except subprocess.TimeoutExpired:
            reason = guard.check_own() if guard is not None else None
            if reason is not None:  # stop the command, reaping nothing before Popen has its status
                proctree.signal_all(command.pids(), signal.SIGTERM)
                try:
                    return process.wait(timeout=_STRAGGLER_WAIT_S), reason
                except subprocess.TimeoutExpired:
                    proctree.signal_all(command.pids(), signal.SIGKILL)
                    return process.wait(), reason


def _stop_on_sigterm(command: CommandProcesses) -> Callable[[int, Any], None]:
    def on_sigterm(signum: int, _frame: Any) -> None:
        command.stop(_STRAGGLER_WAIT_S)
        signal.signal(signum, signal.SIG_DFL)
        os.kill(os.getpid(), signum)  # die of the signal, as a rank without a command would

    return on_sigterm


def command_task(command: str, container: Sequence[str] = ()) -> Callable[[Any], Dict[str, Any]]:
    """A task function that runs ``command`` in a shell with this process's environment (the rank contract);
    ``container``: the ``exec`` that runs it in the node's container instead (``MMT_CONTAINER_EXEC``), which passes
    the contract in by name."""
    shell = [*container, "sh", "-c", command] if container else ["/bin/sh", "-c", command]

    def run_command(_cfg: Any) -> Dict[str, Any]:
        sys.stdout.flush()
        sys.stderr.flush()
        processes = CommandProcesses(bool(container), os.environ)
        processes.adopt()
        previous = signal.signal(signal.SIGTERM, _stop_on_sigterm(processes))
        started = time.monotonic()
        guard = ListenerGuard.for_this_process(processes)
        try:
            code, reason = _wait(subprocess.Popen(shell, env=os.environ.copy()), guard, processes)
        finally:
            left = processes.stop(_STRAGGLER_WAIT_S)
            signal.signal(signal.SIGTERM, previous)
        if left:
            where = " in its container" if container else ""
            print(
                f"mmt: stopped {len(left)} process(es) the command left running{where}: {sorted(left)}",
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
