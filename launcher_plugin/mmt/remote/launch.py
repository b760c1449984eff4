"""The launcher's side of a launch over SSH (docs/remote.md).

At the launcher's setup (:meth:`RemoteLaunch.open`): one connection, and the cluster's side started through it
(``mmt.remote.entry``), which checks what the launch needs there before anything starts; the launch's snapshot is
synced into ``<root>/code/<id>`` when the cluster does not have it yet (rsync, over the same connection; an
earlier snapshot's files are linked, not sent again).

For each batch (:meth:`RemoteLaunch.run`): the jobs, planned here with their dirs in ``<root>/sweeps/...``, go to
the cluster's side in one pickle, which submits them as the login node's launcher would. A detached launch returns
then. An attached one follows the launch's console there (rank 0's lines, the summary) and brings each job's records
into the sweep dir here as the jobs end (mmt.remote.results); when the connection goes, the jobs run on, and the
launcher reconnects with back-off for ``grace_s``, saying so once, then gives up naming ``mmt wait``. Ctrl-C asks
the cluster's side to stop the jobs (a second one stops waiting for it).
"""

import io
import json
import os
import pickle
import signal
import subprocess
import sys
import tarfile
import threading
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import IO, Any, Callable, Dict, List, Optional, Sequence, cast

import cloudpickle
from omegaconf import DictConfig, open_dict

from mmt.backends.base import Backend
from mmt.core import launch_id
from mmt.core.errors import ConfigError, MMTError, UsageError
from mmt.core.jobdir import Attempt
from mmt.core.snapshot import CodeSnapshot
from mmt.core.version import VERSION
from mmt.launching import session
from mmt.launching.jobs import JobReport, LaunchOptions, LaunchReport, NotStarted, PreparedJob, Submitted
from mmt.launching.snapshot import LaunchSnapshot
from mmt.planning import dryrun
from mmt.records.outcome import outcome_of_record, read_primary_return, read_result
from mmt.records.schema import UnknownSchemaError
from mmt.remote import known, results
from mmt.remote.connection import Connection, refusal
from mmt.remote.entry import CODE, ENDED, SWEEPS
from mmt.remote.settings import KEY, SshTarget

# how often the records of the launch's jobs are brought back while they run (one rsync for all of them)
RESULTS_INTERVAL_S = 5.0
# back-off between reconnection attempts: doubling from 1 s, at most this
MAX_BACKOFF_S = 10.0


class ConnectionLost(MMTError):
    """The cluster could not be reached again within ``grace_s``: the jobs may still run there."""


@dataclass
class _Entry:
    """The cluster's side, started and checked, waiting for its launch on stdin."""

    process: "subprocess.Popen[bytes]"
    checked: Dict[str, Any]
    # the code (and SLURM) asked about: the launch can be sent
    asked: bool = False


def _read_answer(process: "subprocess.Popen[bytes]", target: SshTarget, what: str) -> Dict[str, Any]:
    stdout = cast(IO[bytes], process.stdout)
    line = stdout.readline()
    if line:
        try:
            answer = json.loads(line)
            if isinstance(answer, dict):
                return answer
        except ValueError:
            pass
    code = process.wait()
    said = (process.stderr.read() if process.stderr else b"").decode(errors="replace").strip()
    if code == 255:
        raise refusal(target, said.splitlines()[-1] if said else "the connection closed")
    last = said.splitlines()[-1] if said else f"exit code {code}"
    if "No module named" in said or code == 127:
        raise ConfigError(
            f"{KEY}.python",
            target.python,
            f"cannot run mmt with it on {target.label} ({last})",
            f"install mmt {VERSION} into the cluster's Python, or point {KEY}.python at one that has it",
        )
    raise UsageError(f"{target.label}: {what} failed: {last}")


class RemoteLaunch:
    def __init__(self, target: SshTarget, backend_name: str) -> None:
        self.target, self.backend_name = target, backend_name
        # the launch's snapshot here (the launcher takes it after opening the connection), and as the cluster has it
        self.local_snapshot: Optional[LaunchSnapshot] = None
        self.connection = Connection(target)
        self.root = ""
        self.snapshot: Optional[CodeSnapshot] = None
        self._entry: Optional[_Entry] = None
        self._opening: Optional[threading.Thread] = None
        self._failed: Optional[BaseException] = None
        # the cluster's sides that took a launch: they exit once they have answered
        self._handed: List["subprocess.Popen[bytes]"] = []
        # where this launch synced its snapshot, before the cluster's side renames it into place (None: not synced)
        self._partial: Optional[str] = None

    @classmethod
    def for_backend(cls, target: SshTarget, backend: Backend[Any]) -> "RemoteLaunch":
        """The launch's link, for a backend that can be driven over SSH (``Backend.runs_over_ssh``: SLURM's,
        today): its plans are then checked without its cluster's commands."""
        if not backend.runs_over_ssh:
            raise ConfigError(
                KEY,
                target.host,
                f"cluster={backend.name} cannot be reached over SSH",
                f"leave {KEY} out, or use a cluster that can (mmt.backends: runs_over_ssh)",
            )
        backend.plan_over_ssh()
        return cls(target, backend.name)

    # -- setup --------------------------------------------------------------------------------------------------
    def open(self) -> None:
        """Connect and start the cluster's side, in the background while the launcher plans (:meth:`ready`
        waits for it)."""
        self._opening = threading.Thread(target=self._open, name="mmt-remote-open", daemon=True)
        self._opening.start()

    def ready(self) -> None:
        """The connection open, the cluster's side checked, the code synced: a refusal is one line, raised here,
        before any job is planned."""
        if self._opening is not None:
            self._opening.join()
            self._opening = None
        if self._failed is not None:
            failed, self._failed = self._failed, None
            raise failed
        if self._entry is not None and not self._entry.asked:
            self._entry.asked = True
            if self.local_snapshot is not None:
                self._place_code()
            else:
                self._ask_code(self._entry, "")

    def _open(self) -> None:
        try:
            self._entry = self._start_entry(first=True)
            self.root = self._entry.checked["root"]
        except BaseException as exc:  # noqa: BLE001 - raised by ready(), in the launcher's thread
            self._failed = exc

    def _place_code(self) -> None:
        """The launch's snapshot where the cluster has it, synced there first when it has not."""
        assert self._entry is not None and self.local_snapshot is not None
        local = self.local_snapshot.snapshot
        self.snapshot = replace(local, root=f"{self.root}/{CODE}/{local.id}")
        present = self._ask_code(self._entry, local.id)
        if not present and not self.local_snapshot.planned:
            self._sync_code(local)

    def _ask_code(self, entry: "_Entry", code_id: str) -> bool:
        """Whether the cluster has the snapshot ``code_id`` (""; none), with its answer whether its scheduler
        answers (the backend's ``cluster_check``)."""
        stdin = cast(IO[bytes], entry.process.stdin)
        stdin.write(f"{code_id}\n".encode())
        stdin.flush()
        answer = _read_answer(entry.process, self.target, "the check of the cluster")
        if "error" in answer:
            entry.process.kill()
            raise ConfigError(
                f"{KEY}.setup",
                list(self.target.setup),
                f"{answer['error']} (on {self.target.label})",
                f'add what a login shell there needs to {KEY}.setup, e.g. ["module load slurm"]',
            )
        return bool(answer.get("code"))

    def _start_entry(self, first: bool = False) -> _Entry:
        """The cluster's side, started and checked; ``first``: its command logs in (the launch's connection)."""
        process = self.connection.popen(
            [
                self.target.python,
                "-m",
                "mmt.remote.entry",
                "serve",
                self.target.remote_root,
                VERSION,
                self.backend_name,
            ],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            start_new_session=True,  # the terminal's Ctrl-C is the launcher's to handle
            first=first,
        )
        checked = _read_answer(process, self.target, "the check")
        if "error" in checked:
            process.kill()
            key = checked.get("key", "host")
            value = checked.get("root", getattr(self.target, key, self.target.host))
            hint = {
                "setup": f'add what a login shell there needs to {KEY}.setup, e.g. ["module load slurm"]',
                "remote_root": f"choose a writable {KEY}.remote_root",
                "python": f"install mmt {VERSION} into the cluster's Python, or point {KEY}.python at one that has it",
            }.get(key)
            raise ConfigError(f"{KEY}.{key}", value, f"{checked['error']} (on {self.target.label})", hint)
        return _Entry(process, checked)

    def _sync_code(self, local: CodeSnapshot) -> None:
        """The snapshot's tree into ``<root>/code/.<id>.<launch>.partial``, which the cluster's side renames to its
        place before the first job reads it; files of the code synced before are linked there, not sent again."""
        # a folder of this launch's own: two launches of one new snapshot at once each sync it, the first one
        # renamed into place wins and the other's is removed (mmt.remote.entry)
        self._partial = f".{local.id}.{os.getpid()}-{time.time_ns()}.partial"
        partial = f"{self.root}/{CODE}/{self._partial}/"
        links = [f"--link-dest=../{p.name}" for p in self._earlier_code()]
        done = self.connection.rsync(["-a", "--whole-file", "--delete", *links, f"{local.root}/", f":{partial}"])
        if done.returncode != 0:
            said = done.stderr.decode(errors="replace").strip().splitlines()
            raise UsageError(
                f"could not copy the code to {self.target.label}:{partial} "
                f"({said[-1] if said else f'rsync exit code {done.returncode}'}). HINT: rsync must be installed there"
            )

    def _earlier_code(self) -> List[Path]:
        """The snapshots this machine synced to the same root before (at most a few), for rsync to link from."""
        record = known.all_jobs()
        seen: Dict[str, None] = {}
        for job in reversed(record):
            if job.root == self.root and job.target.get("host") == self.target.host:
                if job.code:
                    seen[job.code] = None
        return [Path(code) for code in list(seen)[:5]]

    # -- planning ---------------------------------------------------------------------------------------------
    def remote_sweep_dir(self, local: Path) -> str:
        return f"{self.root}/{SWEEPS}{Path(local).absolute()}"

    def relocator(self, local_sweep_dir: Path) -> Callable[[DictConfig], None]:
        """Amends each job's config: its dir is in the remote root (the paths its processes see are the cluster's)."""
        remote = self.remote_sweep_dir(local_sweep_dir)
        # Hydra's original cwd (get_original_cwd, to_absolute_path) as the job sees it: in the code synced there
        cwd = self.snapshot.remap(os.getcwd()) if self.snapshot is not None else None

        def relocate(config: DictConfig) -> None:
            with open_dict(config):
                config.hydra.sweep.dir = remote
                if cwd is not None:
                    config.hydra.runtime.cwd = cwd

        return relocate

    # -- a batch ----------------------------------------------------------------------------------------------
    def run(
        self,
        jobs: Sequence[PreparedJob],
        backend: Backend[Any],
        settings: session.SessionSettings,
        not_started: Sequence[NotStarted] = (),
    ) -> session.Outcome:
        if any(job.plan.dry_run for job in jobs):
            return session.DryRun(backend.name, [dryrun.render(job.plan, backend.describe(job.plan)) for job in jobs])
        settings.refuse_what_cannot_be_done("launch")
        if settings.dashboard:
            raise ConfigError(
                "hydra.launcher.dashboard",
                True,
                "a launch over SSH has no live page on this machine (its job dirs are on the cluster)",
                f"leave it out, and run `mmt dashboard` on the login node with MMT_HOME={self.root}/home",
            )
        local_sweep = settings.sweep_dir.absolute()
        remote_sweep = self.remote_sweep_dir(local_sweep)
        self.ready()
        if self._entry is None:  # a sweeper's next batch: a new one
            self._entry = self._start_entry()
            self.ready()
        entry, self._entry = self._entry, None
        # one console per batch (a sweeper that proposes trials as it goes launches several into one sweep dir)
        first = min((job.plan.num for job in jobs), default=0)
        console_log = f"{remote_sweep}/console-{launch_id.current().launch}-{first}.log"
        spec = self._spec(jobs, backend, settings, remote_sweep, console_log)
        answer = self._hand_over(entry, spec)
        plans = {job.plan.num: job.plan for job in jobs}
        submitted = [self._local(item, plans, remote_sweep, local_sweep, backend.name) for item in answer["submitted"]]
        known.remember(
            [
                known.RemoteJob(
                    name=item["name"],
                    target=self.target.as_dict(),
                    root=self.root,
                    remote_job_dir=plans[item["num"]].job_dir,
                    local_job_dir=str(local_sweep / os.path.relpath(plans[item["num"]].job_dir, remote_sweep)),
                    remote_sweep_dir=remote_sweep,
                    local_sweep_dir=str(local_sweep),
                    code=self.snapshot.root if self.snapshot is not None else "",
                )
                for item in answer["submitted"]
            ]
        )
        if settings.detach:
            return session.Detached(submitted)
        follow = _Follower(self, int(answer["pid"]), console_log, remote_sweep, local_sweep, first=entry.process)
        report = follow.run(submitted)
        return session.Attached(report)

    def _hand_over(self, entry: "_Entry", spec: bytes) -> Dict[str, Any]:
        """The launch to the cluster's side; its answer, read as soon as it is written (the process there exits
        after it, unwaited for: close() reaps it)."""
        stdin, stdout = cast(IO[bytes], entry.process.stdin), cast(IO[bytes], entry.process.stdout)
        try:
            stdin.write(spec)
            stdin.close()
        except BrokenPipeError:
            pass  # it exited first: its stderr says why
        self._handed.append(entry.process)
        for line in stdout:
            answer = _last_json(line)
            if answer is not None:
                if "error" in answer:
                    raise UsageError(answer["error"])
                return answer
        said = (entry.process.stderr.read() if entry.process.stderr else b"").decode(errors="replace").strip()
        last = said.splitlines()[-1] if said else f"exit code {entry.process.wait()}"
        raise UsageError(f"{self.target.label}: the launch failed there: {last}")

    def _spec(
        self,
        jobs: Sequence[PreparedJob],
        backend: Backend[Any],
        settings: session.SessionSettings,
        remote_sweep: str,
        console_log: str,
    ) -> bytes:
        local_settings = backend.settings_there(str(settings.sweep_dir.absolute()), remote_sweep)
        options = LaunchOptions(sweep_dir=Path(remote_sweep), console=settings.console)
        inner = cloudpickle.dumps(
            {"jobs": list(jobs), "backend": type(backend), "settings": local_settings, "options": options}
        )
        return pickle.dumps(
            {
                "sys_path": [os.getcwd() if entry == "" else entry for entry in sys.path],
                "prefixes": sorted({sys.prefix, sys.base_prefix, sys.exec_prefix}),
                "cwd": os.getcwd(),
                "snapshot": self.snapshot,
                "launch_id": launch_id.current(),
                "inner": inner,
                "detach": settings.detach,
                "code_partial": self._partial,
                "console_log": console_log,
            }
        )

    def _local(
        self, item: Dict[str, Any], plans: Dict[int, Any], remote_sweep: str, local_sweep: Path, backend: str
    ) -> Submitted:
        attempt = local_sweep / os.path.relpath(item["attempt"], remote_sweep)
        return Submitted(
            plan=plans[item["num"]], attempt=Attempt(attempt), backend=backend, scheduler_id=item["scheduler_id"]
        )

    def close(self) -> None:
        if self._opening is not None:
            self._opening.join()
        for process in self._handed:
            try:
                process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                process.kill()
        if self._entry is not None:
            self._entry.process.stdin and self._entry.process.stdin.close()  # an unused entry exits on EOF
            try:
                self._entry.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self._entry.process.kill()
            self._entry = None
        self.connection.close()

    def reconnect(self) -> bool:
        try:
            self.connection.open()
        except (ConfigError, subprocess.TimeoutExpired, OSError):
            return False
        return True


def _last_json(out: bytes) -> Optional[Dict[str, Any]]:
    for line in reversed(out.decode(errors="replace").strip().splitlines()):
        try:
            value = json.loads(line)
        except ValueError:
            continue
        if isinstance(value, dict) and ("submitted" in value or "error" in value):
            return value
    return None


def _keep_private_dirs(member: Any, dest: str) -> Any:
    """tarfile's "data" filter (nothing outside ``dest``, no devices, no group or world write), keeping a folder's
    mode, which that filter drops: a job's ``.mmt`` stays private here, as mmt reads a pickle only from there."""
    safe = tarfile.data_filter(member, dest)
    return safe.replace(mode=member.mode & 0o755, deep=False) if member.isdir() else safe


class _Follower:
    """An attached launch, followed from here: its console there streamed, its records brought back, the link
    restored when it goes."""

    def __init__(
        self,
        launch: RemoteLaunch,
        pid: int,
        console_log: str,
        remote_sweep: str,
        local_sweep: Path,
        first: "Optional[subprocess.Popen[bytes]]" = None,
    ):
        self.launch, self.pid, self.console_log = launch, pid, console_log
        # the cluster's side that took the launch follows its console from the start, on the same connection
        self._first = first
        self.remote_sweep, self.local_sweep = remote_sweep, local_sweep
        self.offset = 0
        self.interrupted: Optional[int] = None
        self._fetching = threading.Lock()
        self._done = threading.Event()

    def run(self, submitted: List[Submitted]) -> LaunchReport:
        target = self.launch.target
        poller = threading.Thread(target=self._poll_results, name="mmt-remote-results", daemon=True)
        poller.start()
        previous = signal.signal(signal.SIGINT, self._on_interrupt)
        try:
            lost_at: Optional[float] = None
            while True:
                if self._stream() == 0:
                    break
                lost_at = lost_at or time.monotonic()
                if not self._reconnect(lost_at):
                    names = " ".join(item.plan.name for item in submitted)
                    raise ConnectionLost(
                        f"lost the connection to {target.label} for more than {target.grace_s:g} s "
                        f"({KEY}.grace_s); the jobs may still be running there. Re-attach with `mmt wait NAME` "
                        f"({names})"
                    )
                lost_at = None
        finally:
            signal.signal(signal.SIGINT, previous)
            self._done.set()
            poller.join(timeout=30)
        report = LaunchReport(jobs=[], interrupted_by=self.interrupted)
        for item in submitted:
            job = self._report(item)
            if job is None:
                report.detached.append(item.plan.name)
            else:
                report.jobs.append(job)
        return report

    def _stream(self) -> int:
        """Rank 0's lines and the launch's console, from where they stopped, until the launch there has ended (0),
        then the records in an archive on the same stream (entry.follow); or until the connection goes (ssh's
        255, or anything else: then the follower is started again from where it stopped)."""
        target = self.launch.target
        follower, self._first = self._first, None
        follower = follower or self.launch.connection.popen(
            [
                target.python,
                "-m",
                "mmt.remote.entry",
                "follow",
                self.console_log,
                str(self.offset),
                str(self.pid),
                self.remote_sweep,
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )
        stdout = cast(io.BufferedReader, follower.stdout)
        held = b""  # what may be the start of ENDED: shown once the next bytes say it is not
        ended = False
        while not ended:
            data = stdout.read1(65536)
            if not data:
                break
            data, held = held + data, b""
            at = data.find(ENDED)
            if at >= 0:
                rest, data, ended = data[at + len(ENDED) :], data[:at], True
            else:
                keep = next((n for n in range(min(len(ENDED) - 1, len(data)), 0, -1) if ENDED.startswith(data[-n:])), 0)
                if keep:
                    data, held = data[:-keep], data[-keep:]
            self.offset += len(data)
            self._show(data)
        if not ended:
            code = follower.wait()
            return code if code != 0 else 255  # it stopped short of the end: as a lost connection
        with self._fetching:
            ok = self._unpack(rest, stdout)
        follower.kill()  # all it had to say is said (the archive's end): nothing to wait for
        follower.wait()
        return 0 if ok else 255

    def _unpack(self, start: bytes, stream: io.BufferedReader) -> bool:
        """The records' archive that follows the console's end, into the sweep dir here."""

        class _Joined(io.RawIOBase):
            def __init__(self) -> None:
                self.first = start

            def readable(self) -> bool:
                return True

            def readinto(self, buffer: Any) -> int:
                if self.first:
                    n = min(len(buffer), len(self.first))
                    buffer[:n], self.first = self.first[:n], self.first[n:]
                    return n
                data = stream.read1(len(buffer))
                buffer[: len(data)] = data
                return len(data)

        try:
            with tarfile.open(fileobj=io.BufferedReader(_Joined()), mode="r|") as archive:
                archive.extractall(self.local_sweep, filter=_keep_private_dirs)
        except (tarfile.TarError, OSError):
            return False
        return True

    @staticmethod
    def _show(data: bytes) -> None:
        if not data:
            return
        try:
            sys.stdout.buffer.write(data)
            sys.stdout.flush()
        except (BrokenPipeError, ValueError):  # nobody reads our stdout: the launch goes on
            pass

    def _reconnect(self, lost_at: float) -> bool:
        target = self.launch.target
        print(
            f"mmt: lost the connection to {target.label}; reconnecting (the jobs run on)", file=sys.stderr, flush=True
        )
        wait = 1.0
        while time.monotonic() - lost_at < target.grace_s:
            if self.launch.reconnect():
                print(
                    f"mmt: reconnected to {target.label} after {time.monotonic() - lost_at:.0f} s",
                    file=sys.stderr,
                    flush=True,
                )
                self._fetch()
                return True
            time.sleep(min(wait, max(0.0, target.grace_s - (time.monotonic() - lost_at))))
            wait = min(wait * 2, MAX_BACKOFF_S)
        return False

    def _on_interrupt(self, signum: int, frame: Any) -> None:
        if self.interrupted is not None:
            raise KeyboardInterrupt  # a second Ctrl-C: stop waiting (the stop asked for goes on there)
        self.interrupted = signum
        target = self.launch.target
        print(
            f"\nmmt: stopping the jobs on {target.label} (Ctrl-C again stops waiting for it)",
            file=sys.stderr,
            flush=True,
        )

        def ask() -> None:
            try:
                done = self.launch.connection.run(["kill", "-TERM", str(self.pid)], timeout=30)
                ok = done.returncode == 0
                said = done.stderr.decode(errors="replace").strip()
            except (subprocess.TimeoutExpired, OSError) as exc:
                ok, said = False, str(exc)
            if not ok:
                print(
                    f"mmt: could not ask {target.label} to stop the jobs ({said or 'no answer'}); they may still run: "
                    "`mmt stop NAME`",
                    file=sys.stderr,
                    flush=True,
                )

        threading.Thread(target=ask, name="mmt-remote-stop", daemon=True).start()

    def _poll_results(self) -> None:
        while not self._done.wait(RESULTS_INTERVAL_S):
            self._fetch()

    def _fetch(self) -> bool:
        with self._fetching:
            return results.fetch(self.launch.connection, self.remote_sweep, self.local_sweep)

    def _report(self, item: Submitted) -> Optional[JobReport]:
        job_dir = item.attempt.dir.parent.parent.parent  # <job dir>/.mmt/attempts/<id>
        try:
            record = read_result(job_dir)
        except UnknownSchemaError:
            record = None
        if record is None or record.attempt != item.attempt.id:
            return None  # not ended yet (a result.json of an earlier run into the same dir is not this run's)
        return JobReport(
            plan=item.plan,
            outcome=outcome_of_record(record),
            attempt=item.attempt,
            record=record,
            primary=read_primary_return(item.attempt),
        )
