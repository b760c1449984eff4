"""The SDK's handle of a job that lives on a cluster reached over SSH (docs/remote.md), on the launcher's machine:
``mmt.Job.get(NAME)`` returns one when the registry here has no job of that name and mmt.remote.known does. Each
call runs the CLI's verb on the cluster through one connection (mmt.remote.forward): ``inspect --json`` for what
the job is, ``wait``/``stop``/``logs`` as they are; ``wait`` brings the job's records into its sweep dir here."""

import json
import time
from pathlib import Path
from typing import Any, Dict, Optional

from mmt.core.errors import NotCarriedOut, UsageError
from mmt.records.outcome import read_result
from mmt.remote import forward, known
from mmt.service.handle import Status


class RemoteJob:
    """Shaped like the SDK's ``Job`` for what a remote job can answer: ``status``, ``dict()``, ``dir`` (its dir's
    mirror here), ``wait``, ``stop``, ``logs``, and ``result``/``error`` once ``wait()`` brought its records here."""

    def __init__(self, job: known.RemoteJob) -> None:
        self._job = job
        self.name = job.name

    def __repr__(self) -> str:
        return f"RemoteJob({self.name!r} on {self._job.ssh.label})"

    def __reduce__(self) -> Any:  # travels by name, as a local handle does
        return (_by_name, (self.name,))

    def dict(self) -> Dict[str, Any]:
        """What ``mmt inspect --json`` prints on the cluster."""
        done = forward.captured(self._job, ["inspect", self.name, "--json"])
        if done.returncode != 0:
            said = done.stderr.decode(errors="replace").strip().splitlines()
            raise UsageError(f"{self._job.ssh.label}: {said[-1] if said else 'no answer'}")
        facts = json.loads(done.stdout)
        assert isinstance(facts, dict)
        return facts

    def json(self) -> str:
        return json.dumps(self.dict(), indent=2)

    @property
    def status(self) -> Status:
        return Status(self.dict()["status"])

    @property
    def dir(self) -> Path:
        return Path(self._job.local_job_dir)

    @property
    def result(self) -> Any:
        """Rank 0's return value once the job completed and ``wait()`` brought its records here, else None."""
        record = read_result(self.dir)
        return record.return_value if record is not None and record.status == "COMPLETED" else None

    @property
    def error(self) -> Optional[str]:
        record = read_result(self.dir)
        return record.error if record is not None else None

    def wait(self, interval: float = 0.5, timeout: Optional[float] = None, stop_on_timeout: bool = False) -> Status:
        """Block until the job has ended (``mmt wait`` on the cluster, its records then brought back here)."""
        del interval  # the cluster's side watches at its own pace
        started = time.monotonic()
        argv = ["wait", self.name, *(["--timeout", str(timeout)] if timeout is not None else [])]
        code = forward.named("wait", self.name, argv, quiet=True)
        if code == 124:
            if stop_on_timeout:
                self.stop()
            raise TimeoutError(f"job {self.name} is still running after {time.monotonic() - started:.0f} s")
        return self.status

    def stop(self) -> None:
        code = forward.named("stop", self.name, ["stop", self.name], quiet=True)
        if code != 0:
            raise NotCarriedOut(f"{self._job.ssh.label} did not stop {self.name} (mmt stop exited {code})")

    def logs(self, rank: int = 0, tail: Optional[int] = None) -> str:
        argv = ["logs", self.name, "--rank", str(rank), *(["--tail", str(tail)] if tail is not None else [])]
        done = forward.captured(self._job, argv)
        return done.stdout.decode(errors="replace")


def find(name: str) -> Optional[RemoteJob]:
    """The handle of the remote job ``name`` (None: no job launched from here over SSH has that name)."""
    found = [job for job in known.named(name) if job.name == name]
    return RemoteJob(found[0]) if found else None


def _by_name(name: str) -> RemoteJob:
    found = find(name)
    if found is None:
        raise UsageError(f"no job named {name!r} was launched from here over SSH. HINT: `mmt list` lists them")
    return found
