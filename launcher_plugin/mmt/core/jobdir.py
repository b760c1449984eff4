"""Every file name in a job's output dir, and the records the processes of a job leave there. No other module
spells these names. The JSON records among them are typed, with a schema version: mmt.records.schema.

A job dir (Hydra's ``<sweep dir>/<job num>``) holds what users read and what the engine keeps to itself::

    result.json                  how the job ended (written by whoever concludes it: see mmt.records.outcome)
    timeline.jsonl               when each phase of the last attempt's launch happened (mmt.core.timeline)
    logs/node<n>.rank<r>.log     every rank's stdout and stderr (a per-node command: logs/node<n>.log), this
                                 attempt's only (a SLURM requeue of the attempt appends)
    logs/previous/<attempt id>/  an earlier attempt's logs, set aside when a new attempt started (a rerun into the
                                 same dir)
    metrics/node<n>.jsonl        machine metrics, sampled by the node agent
    metrics.csv  checkpoints/    written by the recipe on rank 0
    .mmt/                        private to the engine (0700)
      owner.json                 the launch that owns the dir now (backend, scheduler id, pid, host)
      lock                       flock'ed by the launch that owns the dir (refuses a second launch into it)
      attempts/<attempt id>/     one launch of the job; nothing is read across attempts
        plan.pkl                 the job's plan (plain pickle: mmt's own dataclasses)
        job.json job.pkl         the payload: sys.path, then the pickled Hydra context, task and config (0600)
        task.pkl                 a scheduler's job: what its side of the job runs (settings, copied secrets: 0600)
        error.<i>.json           process i raised (worker): exception, traceback, time
        exit.<i>.json            process i exited (agent): code, time, whether the agent stopped it
        done.<i>                 process i finished its task (worker): "0" or "1"; SLURM ends a job once all say 0
        return.pkl               the primary process's JobReturn
        agent.<n>.json           the node agent of node n: host, pid, start and end
        requeued.<restart>       the job asked its scheduler to requeue it during that restart
        restarting.json          a run failed and the next starts after its back-off: which, why, when (local)
        scheduler.json           what the scheduler last said of the job (queue state, why it waits, whether it can
                                 never start, since when it cannot be asked): mmt.records.scheduler
        finalized                the job's own last step (on its scheduler) has concluded it
        <backend's own files>    named by the backend that writes them (mmt.backends.<name>)
        concluded                the launcher has concluded it (the job's own last step need not)

``i`` is the process index in the plan: the global rank, or the node in per-node command mode. Records are
written atomically (a reader sees nothing or all of it); private files are readable by their owner only.

A sweep dir holds its jobs' dirs, and ``summary.csv``, ``summary.png``, Hydra's ``multirun.yaml``, ``.mmt.lock``
(flock'ed by the Hydra launch that owns the sweep, from its launcher's setup on: see mmt.records.ownership); a
detached local launch adds ``supervisor-<launch id>.log`` and, until its supervisor has read it,
``.mmt/supervisor-<launch id>.pkl`` (the jobs handed over: payloads and copied secrets, 0600).

What says whether a launch is alive, and asks it to stop, is kept outside every job dir, where the job itself never
writes (a job may delete its own dir: ``rm -rf "$MMT_JOB_DIR"``, ``git clean -fdx``): the run dir,
``$MMT_HOME/run/`` (0700, beside the registry)::

    <job id>.<attempt id>.lock   flock'ed by the launcher or detached supervisor of that attempt while it runs
    <job id>.<attempt id>.stop   someone asked that attempt to stop (mmt stop)
"""

from __future__ import annotations

import json
import os
import re
import secrets
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple

from mmt.core import timeline

RESULT = "result.json"
LOGS = "logs"
PREVIOUS_LOGS = "previous"
METRICS = "metrics"
TRAINING_METRICS = "metrics.csv"
CHECKPOINTS = "checkpoints"
PRIVATE = ".mmt"
PRIVATE_MODE = 0o700
SWEEP_LOCK = ".mmt.lock"
RUN = "run"


def new_attempt_id() -> str:
    """Unique per launch of a job: time first, so attempts sort by age; random so two launches never collide."""
    return time.strftime("%Y%m%dT%H%M%S") + "-" + secrets.token_hex(3)


def write_atomic(path: Path, data: bytes, private: bool = False) -> None:
    """Readers see the old content or the complete new one, never a partial file. ``private``: mode 0600."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
        if not private:  # mkstemp creates 0600; shared results follow the umask
            umask = os.umask(0)
            os.umask(umask)
            os.chmod(tmp, 0o666 & ~umask)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def make_private_dir(path: Path) -> Path:
    path.mkdir(parents=True, exist_ok=True, mode=PRIVATE_MODE)
    os.chmod(path, PRIVATE_MODE)
    return path


def open_for_append(path: Path, mode: int = 0o644) -> int:
    """A write-only, appending descriptor of ``path`` (created when missing) that never writes through a symlink:
    neither ``path`` itself nor its dir may be one (ELOOP/ENOTDIR otherwise). What a rank's log is opened with: a
    link planted in ``logs/`` must not make mmt write (or truncate) a file elsewhere."""
    dir_fd = os.open(path.parent, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
    try:
        return os.open(path.name, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_NOFOLLOW, mode, dir_fd=dir_fd)
    finally:
        os.close(dir_fd)


def read_json(path: Path) -> Optional[Dict[str, Any]]:
    try:
        return json.loads(path.read_text())
    except (FileNotFoundError, NotADirectoryError, json.JSONDecodeError, UnicodeDecodeError):
        return None


def process_log_name(node_rank: int, rank: int, per_node: bool) -> str:
    """``node<n>.log`` for a per-node command, ``node<n>.rank<r>.log`` for a rank."""
    return f"node{node_rank}.log" if per_node else f"node{node_rank}.rank{rank}.log"


# the names above and node_metrics' below, as readers of a job dir match them (groups: node, rank)
LOG_NAME = re.compile(r"node(\d{1,6})(?:\.rank(\d{1,7}))?\.log")
# a process log of a job with roles, by its role's dir (logs/<role>/node<n>.rank<r>.log), as the page names it
ROLE_LOG_NAME = re.compile(r"([a-z][a-z0-9_]{0,30})/" + LOG_NAME.pattern)
METRICS_NAME = re.compile(r"node(\d{1,6})\.jsonl")


def _holds_logs(path: Path) -> bool:
    """A role's logs dir: a dir with a process log in it."""
    return path.is_dir() and any(LOG_NAME.fullmatch(p.name) for p in path.iterdir())


@dataclass(frozen=True)
class JobDir:
    """The output dir of one job."""

    root: Path

    @property
    def result(self) -> Path:
        return self.root / RESULT

    @property
    def logs(self) -> Path:
        return self.root / LOGS

    def log(self, node_rank: int, rank: int, per_node: bool) -> Path:
        return self.logs / process_log_name(node_rank, rank, per_node)

    @property
    def roles_file(self) -> Path:
        """A job with roles: where every role is (``MMT_ROLES_FILE``), written before any rank starts."""
        return self.root / "roles.json"

    @property
    def world_changes(self) -> Path:
        """An elastic job: every time its world formed again (``mmt.records.world.WorldChange``, a line each)."""
        return self.root / "world.jsonl"

    @property
    def snapshot(self) -> Path:
        """The code the job runs: its launch's snapshot (id, commit, dirty, source, dir), written when it opens."""
        return self.root / "snapshot.json"

    @property
    def snapshot_diff(self) -> Path:
        """The launch's uncommitted changes against its commit (owner-only; absent when the tree was clean)."""
        return self.root / "snapshot.diff"

    def role_log(self, role: str, node_rank: int, rank: int, per_node: bool) -> Path:
        """A process of a job with roles: ``logs/<role>/node<n>.rank<r>.log``, in its role's own numbering."""
        return self.logs / role / process_log_name(node_rank, rank, per_node)

    @property
    def stacks(self) -> Path:
        """The Python stacks of a hung job's processes (``stacks/``; an earlier run's in ``stacks/run.<n>/``)."""
        return self.root / "stacks"

    def stack_file(self, node_rank: int, rank: int, per_node: bool) -> Path:
        """Where a hung job's process wrote its Python stack (``stacks/node<n>.rank<r>.txt``)."""
        return self.stacks / process_log_name(node_rank, rank, per_node).replace(".log", ".txt")

    @property
    def previous_logs(self) -> Path:
        return self.logs / PREVIOUS_LOGS

    def logs_of(self, attempt_id: Optional[str]) -> Path:
        """The dir that holds attempt ``attempt_id``'s logs: ``logs/previous/<id>/`` once a later attempt set them
        aside, else ``logs/``."""
        if attempt_id:
            aside = self.previous_logs / attempt_id
            if aside.is_dir():
                return aside
        return self.logs

    def set_logs_aside(self, label: str) -> Optional[Path]:
        """Move the process logs an earlier attempt left in ``logs/`` into ``logs/previous/<label>/`` (``label``:
        that attempt's id), so that a new attempt's logs hold its own output only: what the console follows from
        their start, the failing rank's last lines, ``mmt logs`` and the live page; a hang's stacks (``stacks/``)
        go with them, so a new attempt's hang reads only its own. Call it holding the job dir's
        claim, before the new attempt starts a process. Returns where they went; None when there were none."""
        try:
            found = sorted(p for p in self.logs.iterdir() if LOG_NAME.fullmatch(p.name) and p.is_file())
            # a job with roles: each role's logs in a dir of its own (logs/<role>/)
            roles = sorted(p for p in self.logs.iterdir() if p != self.previous_logs and _holds_logs(p))
        except OSError:  # no logs/ yet
            return None
        if not found and not roles:
            return None
        target, n = self.previous_logs / label, 1
        while target.exists():
            target, n = self.previous_logs / f"{label}.{n}", n + 1
        target.mkdir(parents=True)
        for path in found + roles:
            os.replace(path, target / path.name)
        stacks = sorted(self.stacks.glob("*.txt"))  # a hang's stacks go with the logs they explain
        if stacks:
            (target / self.stacks.name).mkdir()
            for path in stacks:
                os.replace(path, target / self.stacks.name / path.name)
        return target

    def node_logs(self, node_rank: int, attempt_id: Optional[str] = None) -> List[Path]:
        """The logs of node ``node_rank`` that exist: its command's, then its ranks' in rank order (of attempt
        ``attempt_id``, when a later attempt set them aside: see logs_of)."""
        found = []
        for path in self.logs_of(attempt_id).glob(f"node{node_rank}.*log"):
            match = LOG_NAME.fullmatch(path.name)
            if match and int(match.group(1)) == node_rank:
                found.append((-1 if match.group(2) is None else int(match.group(2)), path))
        return [path for _, path in sorted(found)]

    @property
    def metrics(self) -> Path:
        return self.root / METRICS

    def node_metrics(self, node_rank: int) -> Path:
        return self.metrics / f"node{node_rank}.jsonl"

    @property
    def training_metrics(self) -> Path:
        return self.root / TRAINING_METRICS

    @property
    def checkpoints(self) -> Path:
        return self.root / CHECKPOINTS

    @property
    def private(self) -> Path:
        return self.root / PRIVATE

    @property
    def owner(self) -> Path:
        return self.private / "owner.json"

    @property
    def lock(self) -> Path:
        return self.private / "lock"

    @property
    def attempts(self) -> Path:
        return self.private / "attempts"

    @property
    def timeline(self) -> Path:
        """When each phase of the last attempt's launch happened (beside result.json: it outlives the attempt)."""
        return self.root / timeline.NAME

    def attempt(self, attempt_id: str) -> "Attempt":
        return Attempt(self.attempts / attempt_id)


@dataclass(frozen=True)
class SweepDir:
    """The dir of one launch's jobs (Hydra's ``hydra.sweep.dir``)."""

    root: Path

    @property
    def private(self) -> Path:
        return self.root / PRIVATE

    @property
    def summary_csv(self) -> Path:
        return self.root / "summary.csv"

    @property
    def summary_png(self) -> Path:
        return self.root / "summary.png"

    @property
    def multirun_yaml(self) -> Path:
        """Hydra's record of the sweep (written by Hydra's sweeper)."""
        return self.root / "multirun.yaml"

    @property
    def lock(self) -> Path:
        """flock'ed by the Hydra launch that owns the sweep dir (outside ``.mmt/``: a sweep dir is not a job dir)."""
        return self.root / SWEEP_LOCK

    def supervisor_spec(self, launch_id: str) -> Path:
        return self.private / f"supervisor-{launch_id}.pkl"

    def supervisor_log(self, launch_id: str) -> Path:
        return self.root / f"supervisor-{launch_id}.log"

    def job_dirs(self) -> "list[JobDir]":
        """Its job dirs that an mmt launch has used (they have a private dir)."""
        try:
            return [JobDir(path.parent) for path in sorted(self.root.glob(f"*/{PRIVATE}"))]
        except OSError:
            return []


# how recent a launcher's mark on an attempt it follows must be (Attempt.watched)
WATCHED_FRESH_S = 6.0


@dataclass(frozen=True)
class Attempt:
    """One launch of a job: its payload and the records of its processes, in a dir of its own."""

    dir: Path

    @property
    def id(self) -> str:
        return self.dir.name

    @property
    def job_dir(self) -> JobDir:
        return JobDir(self.dir.parents[2])

    @property
    def timeline(self) -> Path:
        return self.job_dir.timeline

    def create(self) -> "Attempt":
        for path in (self.dir.parents[1], self.dir.parent, self.dir):
            make_private_dir(path)
        return self

    # payload ------------------------------------------------------------------------------------------------
    @property
    def plan(self) -> Path:
        return self.dir / "plan.pkl"

    @property
    def payload_meta(self) -> Path:
        return self.dir / "job.json"

    @property
    def payload(self) -> Path:
        return self.dir / "job.pkl"

    def node_alive(self, slot: int) -> Path:
        """Touched every second by an elastic SLURM job's node agent (node ``slot``): its coordinator's heartbeat."""
        return self.dir / f"node.{slot}.alive"

    @property
    def world_failed(self) -> Path:
        """An elastic job whose world could not form again (too few nodes left): why, for its conclusion."""
        return self.dir / "world.failed"

    def node_run(self, node_rank: int) -> Path:
        """What a node agent in a container runs (``mmt.agent.node.main``): that node's ranks, with their env."""
        return self.dir / f"node.{node_rank}.pkl"

    @property
    def world_file(self) -> Path:
        """An elastic job: its world now (``mmt.records.world.World``), written by its coordinator."""
        return self.dir / "world.json"

    def world_ended(self, slot: int, generation: int) -> Path:
        """An elastic job's node agent of node ``slot``: its ranks of world ``generation`` are all gone (their code)."""
        return self.dir / f"world.ended.{slot}.{generation}"

    def world_ready(self, slot: int) -> Path:
        """An elastic job's node ``slot`` restored after it was lost: its agent is ready to join the next world."""
        return self.dir / f"world.ready.{slot}"

    @property
    def checkpoint_mark(self) -> Path:
        """An elastic job: touched by its ranks after each checkpoint (``MMT_CHECKPOINT_MARK``); a world grows
        right after one, so a node that joins costs no training."""
        return self.dir / "checkpointed"

    def elastic_node_run(self, slot: int, generation: int) -> Path:
        """An elastic job: what the agent of node ``slot`` runs in world ``generation`` (its ranks, their env)."""
        return self.dir / f"node.{slot}.g{generation}.pkl"

    def agent_log(self, node_rank: int) -> Path:
        """A node agent's own output (a local job's node in a container)."""
        return self.dir / f"agent.{node_rank}.log"

    @property
    def containers(self) -> Path:
        """Which container runtime holds the nodes of a job with an image (``mmt.agent.containers``)."""
        return self.dir / "containers.json"

    @property
    def cluster_task(self) -> Path:
        """What a scheduler's side of the job runs (``mmt.records.payload.write_task``), with the secrets it copies.
        A backend's other files in the attempt dir are named by that backend."""
        return self.dir / "task.pkl"

    # what processes report (error and exit records are typed, read and written by mmt.records.schema) ----------
    def error_file(self, index: int) -> Path:
        return self.dir / f"error.{index}.json"

    def exit_file(self, index: int) -> Path:
        return self.dir / f"exit.{index}.json"

    def done_file(self, index: int) -> Path:
        return self.dir / f"done.{index}"

    @property
    def primary_return(self) -> Path:
        return self.dir / "return.pkl"

    def agent_file(self, node_rank: int) -> Path:
        return self.dir / f"agent.{node_rank}.json"

    @property
    def earlier_runs_file(self) -> Path:
        """The runs that failed and were restarted inside a SLURM allocation (mmt.records.restarts)."""
        return self.dir / "earlier_runs.json"

    @property
    def hang_file(self) -> Path:
        """Why the run was stopped as hung (mmt.monitor.hangs), written by a SLURM node agent."""
        return self.dir / "hang.json"

    def heartbeat_file(self, index: int) -> Path:
        """Touched by process ``index`` as it makes progress (mmt.core.stacks)."""
        return self.dir / f"heartbeat.{index}"

    def set_run_aside(self, restart: int) -> Path:
        """Before a restart: what the processes of run ``restart`` reported moves to ``run.<restart>/``, so the
        next run's records start empty (its payload stays). OSError when they cannot be moved."""
        return self._set_aside(f"run.{restart}", ("agent.*.json",))

    def set_generation_aside(self, generation: int) -> Path:
        """Before an elastic job's next world starts: what the ranks of world ``generation`` reported moves to
        ``gen.<generation>/`` (its node agents, which live on, keep theirs)."""
        return self._set_aside(f"gen.{generation}", ())

    def _set_aside(self, name: str, also: Tuple[str, ...]) -> Path:
        aside = self.dir / name
        make_private_dir(aside)
        reported = ("error.*.json", "exit.*.json", "done.*", *also, "return.pkl", "heartbeat.*", "hang.json")
        for pattern in reported:
            for path in self.dir.glob(pattern):
                path.rename(aside / path.name)
        stacks = self.job_dir.stacks
        if any(stacks.glob("*.txt")):  # a hang's stacks stay, under the run's number
            (stacks / aside.name).mkdir(exist_ok=True)
            for path in stacks.glob("*.txt"):
                path.rename(stacks / aside.name / path.name)
        return aside

    @property
    def pending_restart_file(self) -> Path:
        """A run failed and the next starts after its back-off (mmt.records.restarts.PendingRestart)."""
        return self.dir / "restarting.json"

    def requeued_file(self, restart: int) -> Path:
        return self.dir / f"requeued.{restart}"

    @property
    def scheduler(self) -> Path:
        return self.dir / "scheduler.json"

    @property
    def finalized(self) -> Path:
        return self.dir / "finalized"

    @property
    def concluded(self) -> Path:
        return self.dir / "concluded"

    @property
    def watched(self) -> Path:
        """Touched every WATCHED_FRESH_S / 3 while a launcher follows the attempt to its end: a job that ends well
        while it is fresh is concluded by that launcher (or, should it die in that moment, by the next ``mmt list``),
        not by a last step of its own. A killed launcher's mark goes stale within WATCHED_FRESH_S."""
        return self.dir / "watched"

    def write_done(self, index: int, code: int) -> None:
        write_atomic(self.done_file(index), str(code).encode(), private=True)

    def write_agent(self, node_rank: int, record: Dict[str, Any]) -> None:
        write_atomic(self.agent_file(node_rank), json.dumps(record).encode(), private=True)

    def done(self, index: int) -> Optional[int]:
        try:
            return int(self.done_file(index).read_text())
        except (FileNotFoundError, NotADirectoryError, ValueError):
            return None

    def agent(self, node_rank: int) -> Optional[Dict[str, Any]]:
        return read_json(self.agent_file(node_rank))

    def clear_process(self, index: int) -> None:
        """Forget what an earlier run of process ``index`` reported (a requeued SLURM job runs again in place)."""
        paths = [self.error_file(index), self.exit_file(index), self.done_file(index)]
        if index == 0:
            paths.append(self.primary_return)
        for path in paths:
            path.unlink(missing_ok=True)


def _key_part(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]", "_", text)[:120] or "_"


@dataclass(frozen=True)
class RunDir:
    """``$MMT_HOME/run``: what a launch's liveness and its stop requests need, out of reach of its jobs (a job may
    delete its own job dir). One entry per attempt, keyed by job id and attempt id (unique per launch of a job)."""

    root: Path

    def attempt(self, job_id: Optional[str], attempt_id: str) -> "AttemptRun":
        return AttemptRun(self.root, f"{_key_part(job_id or 'job')}.{_key_part(attempt_id)}")


@dataclass(frozen=True)
class AttemptRun:
    """One attempt's entries in the run dir."""

    root: Path
    key: str

    @property
    def lock(self) -> Path:
        """flock'ed by the process that supervises the attempt (the launcher, or a detached supervisor)."""
        return self.root / f"{self.key}.lock"

    @property
    def stop_request(self) -> Path:
        """Someone asked the attempt to stop (mmt stop); its supervisor checks every half second."""
        return self.root / f"{self.key}.stop"
