"""The cluster's side of a launch over SSH: ``python -m mmt.remote.entry serve ROOT VERSION BACKEND``, started by
the launcher at its setup, over its connection.

1. It checks what the launch needs there and answers in one JSON line: the remote root exists or can be made and is
   writable, this mmt is the launcher's version; then, given the launch's snapshot id (a line on stdin), whether the
   backend's cluster answers (its spec's ``cluster_check``) and whether that code is there already. Nothing is started
   yet; a refusal is the launcher's one line.
2. It imports the engine while the launcher plans, then reads the launch (a pickle, on stdin, until EOF; none: the
   launcher needed it not) and runs it as a launcher on the login node would: ``detach``: submitted, answered,
   done; attached: a process of its own session (it outlives the connection) runs the launch to its end with its
   console in ``<sweep dir>/console-<launch id>-<first job>.log``; the answer names its pid, and this process then
   follows that console on the same stdout (:func:`follow`: once the connection has gone, the launcher starts
   ``python -m mmt.remote.entry follow ...`` again from where it stopped).

stdout carries the answers only; everything else goes to stderr.
"""

import json
import os
import pickle
import sys
import tempfile
import threading
from pathlib import Path
from typing import Any, Dict, List, Optional

from mmt.core.version import VERSION

HOME = "home"  # <root>/home: MMT_HOME of the launches made over SSH (their registry, snapshots of their own)
CODE = "code"  # <root>/code/<snapshot id>: the launches' code, synced once per snapshot
SWEEPS = "sweeps"  # <root>/sweeps/<the launcher's sweep dir>: the job dirs
# the console log's last line, once the launch has ended there (the launcher's follower stops at it)
ENDED = b"mmt: the launch has ended.\n"


def _answer(message: Dict[str, Any]) -> None:
    sys.stdout.write(json.dumps(message) + "\n")
    sys.stdout.flush()


def _check(root_text: str, version: str) -> Dict[str, Any]:
    if version != VERSION:
        return {"error": f"the cluster's mmt is {VERSION}, the launcher's {version}", "key": "python"}
    root = Path(os.path.expanduser(root_text)).absolute()
    try:
        for sub in (HOME, CODE, SWEEPS):
            (root / sub).mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=root):
            pass
    except OSError as exc:
        return {"error": f"cannot write there: {exc.strerror or exc}", "key": "remote_root", "root": str(root)}
    return {"root": str(root), "python": sys.executable}


def _run(spec: Dict[str, Any], root: Path) -> None:
    """The launch: set up as its launcher's process was, then detached (answered at once) or attached (answered
    once started, by the process that follows it to its end)."""
    from mmt.core import launch_id as ids
    from mmt.core.snapshot import activate, remapped_path
    from mmt.records.payload import import_path

    os.environ["MMT_HOME"] = str(root / HOME)
    snapshot = spec["snapshot"]
    if spec.get("code_partial"):
        _place(root / CODE / spec["code_partial"], Path(snapshot.root))
    path = remapped_path(snapshot, spec["sys_path"]) if snapshot is not None else list(spec["sys_path"])
    sys.path[:] = import_path(path, spec["prefixes"])
    activate(snapshot)
    os.chdir(snapshot.moved(spec["cwd"]) if snapshot is not None else root)
    ids.adopt(spec["launch_id"])  # the job names and ids the launcher planned
    import cloudpickle

    inner = cloudpickle.loads(spec["inner"])
    from mmt.launching import session

    backend = inner["backend"](inner["settings"])
    options = inner["options"]
    options = type(options)(sweep_dir=options.sweep_dir, console=options.console, registry=session.open_registry())
    Path(options.sweep_dir).mkdir(parents=True, exist_ok=True)
    jobs = inner["jobs"]
    if spec["detach"]:
        try:
            submitted = session.detached_submit(jobs, backend, options)
        except Exception as exc:  # noqa: BLE001 - a refusal is the launcher's to say, in its words
            _answer({"error": str(exc)})
            return
        _answer({"submitted": [_submitted(s) for s in submitted]})
        return
    _attached(jobs, backend, options, Path(spec["console_log"]))


def _place(partial: Path, final: Path) -> None:
    """The code the launcher synced just now, complete from here on; when another launch placed the same snapshot
    first (two launches of one new snapshot at once), that one stays and this copy goes."""
    if not partial.is_dir():
        return
    try:
        os.rename(partial, final)
    except OSError:
        if not final.is_dir():
            raise
        import shutil

        shutil.rmtree(partial, ignore_errors=True)


def _submitted(item: Any) -> Dict[str, Any]:
    return {
        "num": item.plan.num,
        "name": item.plan.name,
        "attempt": str(item.attempt.dir),
        "scheduler_id": item.scheduler_id,
        "backend": item.backend,
    }


def _attached(jobs: List[Any], backend: Any, options: Any, log: Path) -> None:
    """A process of its own session runs the launch to its end (it outlives the connection); this one answers once
    the jobs are submitted, or says why not."""
    import signal

    read_end, write_end = os.pipe()
    child = os.fork()
    if child:
        os.close(write_end)
        with os.fdopen(read_end) as pipe:
            reply = pipe.read()
        message = json.loads(reply) if reply else {"error": f"the launch's process exited first; see {log}"}
        _answer(message)
        if "error" not in message:  # the launcher follows the console on this same connection: no other to open
            follow(log, 0, child, str(options.sweep_dir))
        return
    os.close(read_end)
    os.setsid()
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
    out = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.dup2(out, 1)
    os.dup2(out, 2)
    answer = os.fdopen(write_end, "w")
    code = 0
    try:
        from mmt.launching import engine
        from mmt.launching.console import Console

        def accepted(submitted: List[Any]) -> None:
            answer.write(json.dumps({"submitted": [_submitted(s) for s in submitted], "pid": os.getpid()}))
            answer.close()

        console = Console()
        try:
            engine.launch(jobs, backend, options, console, accepted=accepted)
        finally:
            backend.close()
            console.close()
    except BaseException as exc:  # noqa: BLE001 - before its jobs were accepted, the launcher says it; after, the log
        if not answer.closed:
            answer.write(json.dumps({"error": str(exc) or type(exc).__name__}))
            answer.close()
        else:
            import traceback

            traceback.print_exc()
        code = 1
    sys.stdout.flush()
    sys.stderr.flush()
    os.write(out, ENDED)  # the follower stops here, without waiting to see this process gone
    os._exit(code)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:  # a zombie (its parent has not reaped it yet) has ended
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return True


def follow(log: Path, offset: int, pid: int, sweep_dir: str) -> int:
    """The launch's console from byte ``offset`` on, as it grows, until its last line (ENDED; written here when
    the process ``pid`` is gone without it); then, on the same stdout, a tar archive of the records that come
    back (mmt.remote.records): the launcher needs no other command to have every result."""
    import tarfile
    import time

    from mmt.remote.records import brought

    out = sys.stdout.buffer
    tail = b""
    with open(log, "rb") as console:
        console.seek(offset)
        quiet_since = None
        while True:
            data = console.read(65536)
            if data:
                seen = tail + data
                at = seen.find(ENDED)
                if at >= 0:  # the console's end: nothing after it is sent (the archive comes next)
                    out.write(data[: at + len(ENDED) - len(tail)])
                    break
                out.write(data)
                out.flush()
                tail = seen[-(len(ENDED) - 1) :]
                quiet_since = None
                continue
            if not _alive(pid):
                # gone: what it wrote last is read once more before saying it ended without its last line
                quiet_since = quiet_since or time.monotonic()
                if time.monotonic() - quiet_since > 0.5:
                    out.write(ENDED)
                    break
            time.sleep(0.02)
    added = set()
    with tarfile.open(fileobj=out, mode="w|") as archive:
        for path in brought(sweep_dir):
            # its folders first, with their modes (a job's .mmt is private here as there)
            parts = Path(path).parts
            for depth in range(1, len(parts)):
                folder = os.path.join(*parts[:depth])
                if folder not in added:
                    added.add(folder)
                    archive.add(os.path.join(sweep_dir, folder), arcname=folder, recursive=False)
            try:
                archive.add(os.path.join(sweep_dir, path), arcname=path, recursive=False)
            except OSError:
                continue  # gone meanwhile (a log set aside): the rest comes
    out.flush()
    return 0


def _cluster_problem(backend: str) -> Optional[str]:
    """Why the backend's cluster cannot be used from this login shell (its spec's ``cluster_check``), or None."""
    import importlib

    from mmt.backends.registry import spec

    check = spec(backend).cluster_check
    if check is None:
        return f"cluster={backend} cannot be driven over SSH"
    module, function = check.split(":")
    problem = getattr(importlib.import_module(module), function)()
    return None if problem is None else str(problem)


def _import_engine(backend: str) -> None:
    import cloudpickle  # noqa: F401

    from mmt.backends.registry import backend_class

    backend_class(backend)  # its class, which the launch's pickle names
    import mmt.launching.engine  # noqa: F401
    import mmt.launching.session  # noqa: F401


def main(argv: Optional[List[str]] = None) -> int:
    verb, *args = argv if argv is not None else sys.argv[1:]
    if verb == "follow":
        log, offset, pid, sweep_dir = args
        return follow(Path(log), int(offset), int(pid), sweep_dir)
    if verb != "serve":
        print(f"mmt.remote.entry: unknown verb {verb!r}", file=sys.stderr)
        return 2
    root_text, version, backend = args
    checked = _check(root_text, version)
    _answer(checked)
    if "error" in checked:
        return 1
    root = Path(checked["root"])
    # SLURM asked, and the engine imported, while the launcher takes its snapshot and plans its jobs
    cluster: List[Optional[str]] = []
    asked = threading.Thread(target=lambda: cluster.append(_cluster_problem(backend)), name="ask-cluster", daemon=True)
    warm = threading.Thread(target=lambda: _import_engine(backend), name="import-engine", daemon=True)
    asked.start()
    warm.start()
    # the launch's snapshot id, once the launcher has taken it (a line; empty: the launch has no snapshot)
    line = sys.stdin.buffer.readline().strip().decode()
    asked.join()
    if cluster[0] is not None:
        _answer({"error": cluster[0], "key": "setup"})
        return 1
    _answer({"code": bool(line) and (root / CODE / line).is_dir()})
    warm.join()
    data = sys.stdin.buffer.read()
    if not data:
        return 0  # the launcher needed no launch of this one (its last batch was the one before)
    _run(pickle.loads(data), root)
    sys.stdout.flush()
    os._exit(0)  # answered: the launcher reads no more, and a finalized interpreter only delays the connection


if __name__ == "__main__":
    sys.exit(main())
