"""Detached local jobs: a supervisor process that runs the engine for them and outlives the launcher's terminal.

The launcher plans and validates as usual, then starts ``python -m mmt.launching.supervisor <spec>`` in a session of
its own (so the terminal's hangup never reaches it, nor its Ctrl-C), and waits only until the supervisor says the
jobs are claimed, registered and started (or why not). The supervisor runs the usual attached launch: host agent,
time limits, fail-fast, ``result.json``, registry; its console is a log file in the sweep dir. ``mmt stop NAME``
asks it to stop a job (a stop request in the run dir, ``$MMT_HOME/run``: mmt.records.liveness); SIGTERM stops
all of its jobs.
"""

import dataclasses
import json
import os
import pickle
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence

import cloudpickle

from mmt.backends.base import Backend
from mmt.core.errors import UsageError
from mmt.core.jobdir import Attempt, SweepDir, make_private_dir, write_atomic
from mmt.core.snapshot import activate
from mmt.core.states import ConsoleMode
from mmt.launching import engine
from mmt.launching.console import Console
from mmt.launching.prepare import host_preload
from mmt.records.payload import open_private


def start(
    jobs: Sequence[engine.PreparedJob], backend: Backend[Any], options: engine.LaunchOptions, launch_id: str
) -> List[engine.Submitted]:
    """Hand ``jobs`` to a new supervisor process; returns once it has started them (raises what refused them)."""
    sweep = SweepDir(options.sweep_dir)
    make_private_dir(sweep.private)
    spec, log = sweep.supervisor_spec(launch_id), sweep.supervisor_log(launch_id)
    # holds the payloads (and copied secrets): the owner's only, removed by the supervisor once read
    # two layers: sys.path (plain data) first, so the app's modules can be found when the jobs are unpickled
    # the backend travels as its class and settings: the supervisor builds its own (its agent, its ports)
    inner = cloudpickle.dumps(
        {"jobs": list(jobs), "backend": type(backend), "settings": backend.settings, "options": options}
    )
    # the launch's snapshot of the project (one for all its jobs): the supervisor unpickles the jobs from it
    snapshot = jobs[0].plan.snapshot if jobs else None
    outer = {"sys_path": list(sys.path), "snapshot": snapshot, "inner": inner}
    write_atomic(spec, pickle.dumps(outer), private=True)
    read_end, write_end = os.pipe()
    with open(log, "ab") as out:
        process = subprocess.Popen(
            [sys.executable, "-m", "mmt.launching.supervisor", str(spec), str(write_end)],
            pass_fds=[write_end],
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            cwd=os.getcwd(),
        )
    os.close(write_end)
    with os.fdopen(read_end) as answer:
        reply = answer.read()
    if not reply:
        code = process.poll()
        spec.unlink(missing_ok=True)
        raise UsageError(
            f"the detached supervisor (pid {process.pid}) exited before starting the jobs"
            + (f" (code {code})" if code is not None else "")
            + f"; see {log}"
        )
    message = json.loads(reply)
    if "error" in message:
        raise UsageError(message["error"])
    return [
        engine.Submitted(plan=job.plan, attempt=Attempt(Path(a)), backend=backend.name)
        for job, a in zip(jobs, message["attempts"])
    ]


def main(argv: Optional[List[str]] = None) -> int:
    spec_path, fd = (argv or sys.argv[1:])[:2]
    signal.signal(signal.SIGHUP, signal.SIG_IGN)  # a session of its own: no terminal to lose, but be sure
    answer = os.fdopen(int(fd), "w")
    spec_file = Path(spec_path)
    try:
        with open_private(spec_file) as handle:  # its dir (the sweep's .mmt) is private; the sweep dir is the user's
            outer = pickle.loads(handle.read())
        sys.path[:] = outer["sys_path"]
        activate(outer.get("snapshot"))
        spec: Dict[str, Any] = cloudpickle.loads(outer["inner"])
    finally:
        spec_file.unlink(missing_ok=True)
        try:
            spec_file.parent.rmdir()
        except OSError:
            pass
    backend = spec["backend"](spec["settings"])

    def accepted(submitted: List[engine.Submitted]) -> None:
        answer.write(json.dumps({"attempts": [str(s.attempt.dir) for s in submitted]}))
        answer.close()

    # the agent is forked before the console's thread starts (mmt.agent.client)
    backend.warm_up(*((host_preload(spec["jobs"][0].plan), spec["jobs"][0].plan.snapshot) if spec["jobs"] else ()))
    console = Console()
    # its console is a log in the sweep dir: it follows no rank (every rank's output is in its own log already, and
    # copying rank 0's in would store it twice); launch lines, failures and the summary still go there
    options = dataclasses.replace(spec["options"], console=ConsoleMode.none)
    try:
        engine.launch(spec["jobs"], backend, options, console, accepted=accepted)
    except Exception as exc:  # noqa: BLE001 - whatever stops it before its jobs are accepted is its launcher's to say
        if not answer.closed:
            answer.write(json.dumps({"error": str(exc)}))
            answer.close()
            return 2
        raise
    finally:
        backend.close()
        console.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
