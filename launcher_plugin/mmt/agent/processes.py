"""Starting one process of a job on this node: forked from the agent's warm interpreter, or a fresh one.

Why fork: ``import torch`` (and ``lightning``) costs seconds of CPU per process. The agent imports the job's
``preload`` once and forks each rank from that interpreter (the standard library's forkserver idea), so a node pays
the import once instead of once per rank. The agent never touches CUDA, so forking stays safe; it runs no threads.
``start_method=spawn`` execs a fresh interpreter per rank instead, for code that is not fork-safe.

Every process runs in a session of its own (its own process group, immune to the terminal's Ctrl-C), dies with the
agent (parent-death signal), and writes its stdout and stderr to its log file in the job dir.
"""

import errno
import gc
import os
import signal
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, Iterable, Optional, Set, Tuple

from mmt.core import proctree
from mmt.core.jobdir import Attempt, open_for_append
from mmt.core.snapshot import CodeSnapshot, activate
from mmt.records.schema import ErrorRecord

# what every worker imports anyway, so a forked rank finds it loaded (cheap next to torch)
WORKER_MODULES = ("omegaconf", "cloudpickle", "hydra.core.utils", "mmt.worker.main")


@dataclass(frozen=True)
class ProcessSpec:
    """One process of a job: which, with what environment, where."""

    job_id: str
    index: int
    node_rank: int
    attempt_dir: str
    env: Dict[str, str]
    cwd: str
    log: str
    # a program to run instead of the worker (a node's container, whose node agent forks its ranks: ``podman run
    # ... python3 -m mmt.agent.node``); it runs with the agent's environment plus ``env``
    argv: Tuple[str, ...] = ()


class Spawner:
    """Starts processes; remembers what it has imported, so each module is imported once per agent."""

    def __init__(self, method: str) -> None:
        assert method in ("fork", "spawn"), method
        self.method = method
        self.imported: Set[str] = set()
        self.discovered = False

    def preload(
        self, modules: Iterable[str], hydra_plugins: bool = True, snapshot: Optional[CodeSnapshot] = None
    ) -> None:
        """Import ``modules`` (and mmt's worker) here, once, for every rank forked after; with ``hydra_plugins``,
        Hydra's plugin registry too. ``snapshot``: the launch's copy of the project, which they are imported from
        (and every rank's imports after)."""
        activate(snapshot)
        if self.method != "fork":
            return
        if hydra_plugins and not self.discovered:
            self.discovered = True
            self._discover_hydra_plugins()
        for name in (*WORKER_MODULES, *modules):
            if name in self.imported:
                continue
            self.imported.add(name)
            try:
                __import__(name)
            except Exception as exc:  # noqa: BLE001 - a module's import may raise anything; the rank imports it itself
                # and reports the error where the user looks: the job's failure
                _warn(f"could not preload {name}: {exc}")
        # what was imported lives as long as the agent: out of the cyclic collector's sight, here and in every rank
        # forked after. A rank's first full collection walked every object torch and Hydra made (70 ms of CPU) and
        # wrote to each one's page, copying it from the agent (Python's gc docs: freeze before fork)
        gc.collect()
        gc.freeze()

    @staticmethod
    def _discover_hydra_plugins() -> None:
        """Hydra's plugin registry (every plugin module installed, executed), which each forked rank inherits
        (mmt.worker.main.restore_singletons). Without it, a rank imports only the plugin modules its payload names
        (their configs), and builds the registry only if it uses one: less for a node of one rank, more for many."""
        try:
            from hydra.core.plugins import Plugins

            Plugins.instance()
        except Exception as exc:  # noqa: BLE001 - a plugin module's import may raise anything; ranks rescan
            _warn(f"could not discover Hydra's plugins: {exc}")

    def start(self, spec: ProcessSpec) -> int:
        pid = os.fork()
        if pid == 0:  # child: never returns
            _become_process(spec, self.method)
        return pid


def _warn(text: str) -> None:
    try:
        print(f"[mmt agent] {text}", file=sys.stderr, flush=True)
    except OSError:  # a closed stderr (2>&1 | head): the warning is lost, the agent goes on
        pass


def _log_refused(spec: ProcessSpec, exc: OSError) -> None:
    """The process cannot have its log (a symlink there, a removed dir): it fails, saying so in its error record."""
    why = "it is a symlink, which mmt never writes through" if exc.errno == errno.ELOOP else exc.strerror or str(exc)
    try:
        ErrorRecord(exception=f"OSError: cannot open its log {spec.log}: {why}").write(
            Attempt(Path(spec.attempt_dir)).error_file(spec.index)
        )
    except OSError:
        pass
    _warn(f"process {spec.index} of job {spec.job_id}: cannot open its log {spec.log}: {why}")


def _become_process(spec: ProcessSpec, method: str) -> None:
    code = 70
    try:
        os.setsid()  # own process group: stop it as a whole, immune to the terminal's Ctrl-C
        proctree.set_parent_death_signal(signal.SIGKILL)
        signal.set_wakeup_fd(-1)
        for sig in (signal.SIGCHLD, signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGUSR2):
            signal.signal(sig, signal.SIG_DFL)
        try:  # never through a symlink: one planted at logs/node0.rank0.log must not make mmt write elsewhere
            log = open_for_append(Path(spec.log))
        except OSError as exc:
            _log_refused(spec, exc)
            code = 1
            return
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)
        os.dup2(log, 1)
        os.dup2(log, 2)
        os.closerange(3, 1 << 16)  # the agent's socket, pipes and locks are not the rank's business
        os.chdir(spec.cwd)
        if spec.argv:  # the container runtime's client needs this host's environment (PATH, XDG_RUNTIME_DIR ...)
            os.execvpe(spec.argv[0], list(spec.argv), {**os.environ, **spec.env})
        os.environ.clear()
        os.environ.update(spec.env)
        args = [spec.attempt_dir, str(spec.index)]
        if method == "spawn":
            os.execve(sys.executable, [sys.executable, "-u", "-m", "mmt.worker.main", *args], spec.env)
        sys.stdout = open(1, "w", buffering=1, closefd=False)  # line-buffered: the console follows the log
        sys.stderr = open(2, "w", buffering=1, closefd=False)
        from mmt.worker import after_fork, main

        after_fork.reset()
        code = main.main(args)
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
