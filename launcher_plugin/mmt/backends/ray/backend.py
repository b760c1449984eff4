"""The Ray backend: each mmt job becomes one Ray job, submitted through Ray's job submission API.

The job's driver (``mmt.backends.ray.driver``, on the head) places its nodes as one placement group (STRICT_SPREAD),
runs one node agent per node in an actor of its bundle, restarts a failed run while it may, and concludes the job
itself: jobs outlive the launcher, as on SLURM. Submitting returns at once; polling reads the job's attempt dir on
the shared filesystem (every call: a job whose processes have all reported success is done without waiting for its
driver to tidy up) and asks Ray every ``poll_interval_s`` (``api``). A job stopped or failed outside is reported as
such, never waited on. A job that can never be placed is refused before anything starts, in one line that says what
it asks and what the cluster has (``placement``).
"""

import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Dict, List, Optional, Tuple

from mmt.backends.base import Submission
from mmt.backends.ray import placement, records
from mmt.backends.ray.api import ClusterNode, RayApi, RayJob, Refused, Unanswered
from mmt.backends.ray.settings import ADDRESS_VARS, RaySettings
from mmt.backends.ray.task import JobRef, RayTask, entrypoint, shown, write_task_file
from mmt.backends.scheduled import ScheduledBackend, ScheduledJob
from mmt.backends.silence import Silence
from mmt.core.errors import ConfigError, MMTError
from mmt.core.jobdir import Attempt, JobDir
from mmt.core.states import JobState
from mmt.planning.plan import JobPlan
from mmt.planning.redact import MASKED
from mmt.records.outcome import JobOutcome
from mmt.records.payload import read_plan
from mmt.records.registry import JobRecord
from mmt.records.restarts import recorded
from mmt.records.scheduler import SchedulerRecord, read_scheduler, write_scheduler
from mmt.records.schema import OwnerRecord

# how long the cluster's node list answers every plan of a launch (one query, not one per job)
NODES_TTL_S = 5.0
# seconds between two asks to stop a job whose cluster did not answer
STOP_RETRY_S = 2.0
# how long a watcher's question (a job's state, a stop) may wait for an answer: a dashboard that takes longer counts
# as silent for that round, and the launcher stays responsive to Ctrl-C; less for one that did not answer the last
WATCH_TIMEOUT_S = 3.0
SILENT_TIMEOUT_S = 1.0
# what mmt calls a Ray job the cluster does not know (anymore)
GONE = "GONE"
HINT_CLUSTER = (
    "start one (ray start --head ...), or the local test cluster: "
    'scripts/ray_cluster.sh start && eval "$(scripts/ray_cluster.sh env)"'
)


@dataclass(kw_only=True)
class RayJobHandle(ScheduledJob):
    ref: JobRef
    # what Ray said last
    seen: Optional[RayJob] = None
    # when the cluster last answered about the job (monotonic): a job lost with its cluster ended about then
    answered_at: Optional[float] = None
    # the cluster's silence the job is in (kept until an answer says what became of the job)
    silence: Optional[Silence] = None

    @property
    def scheduler_id(self) -> str:
        return self.ref.submission_id


class SubmissionRefused(MMTError):
    """Ray refused a job, or could not be asked: what it said and what the job asks, on one line."""


def submission_id(plan: JobPlan, attempt_id: str) -> str:
    """The Ray job's id: the registered name and the attempt, unique while the job is registered."""
    return f"mmt-{plan.name}-{attempt_id}"


class RayBackend(ScheduledBackend[RayJobHandle, RaySettings], name="ray", settings=RaySettings, records=records):
    """One Ray job per mmt job; it watches the jobs it registered too."""

    # a job with roles: one placement group whose bundles have each role's shape (docs/roles.md)
    runs_roles = True
    # num_nodes=MIN:MAX: the driver forms the world again as nodes are lost and placed again (docs/elastic.md)
    runs_elastic = True

    def __init__(self, settings: RaySettings) -> None:
        super().__init__(settings)
        self._nodes: Optional[Tuple[float, List[ClusterNode]]] = None
        # the clusters (by address) that do not answer, since when (said once, and once when they answer again)
        self._silences: Dict[str, Silence] = {}

    # ------------------------------------------------------------------------------------------ planning

    def problems(self, plan: JobPlan) -> List[ConfigError]:
        if plan.after:
            return [
                ConfigError(
                    "hydra.launcher.after",
                    list(plan.after),
                    "cluster=ray does not hold a job back for others yet",
                    "launch it once those jobs have completed (mmt wait NAME && python train.py ...), or run the "
                    "chain with cluster=local or cluster=slurm",
                )
            ]
        if plan.images:
            role = next((role for role in plan.roles if role.image is not None), None)
            return [
                ConfigError(
                    "image" if role is None else f"roles.{role.name}.image",
                    plan.images[0],
                    "cluster=ray runs every node in the Ray cluster's own Python environment (its image)",
                    "drop image=... and start the cluster from that image, or add packages with "
                    "hydra.launcher.runtime_env.pip",
                )
            ]
        address = self.settings.address
        if address is None:
            return [
                ConfigError(
                    "hydra.launcher.address",
                    None,
                    "no Ray cluster named: the dashboard's address, which serves the job submission API "
                    f"(http://<head>:8265; {' and '.join(ADDRESS_VARS)} are not set either)",
                    f"set hydra.launcher.address=http://<head>:8265, or {HINT_CLUSTER}",
                )
            ]
        try:
            nodes = self._cluster_nodes()
        except (Unanswered, Refused) as exc:
            return [
                ConfigError("hydra.launcher.address", address, f"no Ray cluster answers there: {exc}", HINT_CLUSTER)
            ]
        where = f"the cluster at {address}"
        if plan.roles:
            refused = placement.roles_refusal(plan, self._role_bundles(plan), nodes, where)
        else:
            refused = placement.refusal(plan, self.settings.bundle(plan), nodes, where)
        if refused is None:
            return []
        return [
            ConfigError(
                refused.key,
                refused.value,
                refused.line,
                "ask for fewer or smaller nodes, or add nodes to the cluster (ray start --address=<head>:<port> on "
                "another machine; an autoscaling cluster must be able to grow to the job)",
            )
        ]

    def _role_bundles(self, plan: JobPlan) -> Dict[str, Dict[str, float]]:
        """A job with roles: each role's bundle (its machine's CPUs and GPUs, the site's settings first)."""
        return {role.name: self.settings.bundle(plan.for_role(role)) for role in plan.roles}

    def _cluster_nodes(self) -> List[ClusterNode]:
        now = time.monotonic()
        if self._nodes is None or now - self._nodes[0] > NODES_TTL_S:
            assert self.settings.address is not None
            self._nodes = (now, RayApi(self.settings.address).nodes())
        return self._nodes[1]

    def describe(self, plan: JobPlan) -> List[str]:
        bundle = self.settings.bundle(plan)
        shape = placement.describe(bundle)
        if plan.roles:
            shape = " + ".join(
                f"{role.name} {role.num_nodes} x {placement.describe(self._role_bundles(plan)[role.name])}"
                for role in plan.roles
            )
        task = self._task(plan, JobDir(Path(plan.job_dir)).attempt("<attempt>"), "<submission id>", {})
        runtime = self.settings.runtime_env.to_ray()
        if "env_vars" in runtime:  # values are never printed
            runtime["env_vars"] = {name: MASKED for name in runtime["env_vars"]}
        lines = [
            f"  backend    ray: one Ray job on {self.settings.address or '<no cluster address>'}; its "
            f"{plan.num_nodes} node(s) one placement group ({placement.STRATEGY}: a Ray node each) of bundles "
            f"{shape}; one node agent per node, in an actor of its bundle",
            "  rendezvous MASTER_ADDR=<node 0's Ray address>, MMT_NODE_ADDRS=<the bundles' Ray addresses, in node "
            "order>; MASTER_PORT and the framework's ports: free ports held by each node's actor",
            f"  driver     {shown(entrypoint(task, task.attempt.cluster_task))}",
            f"  runtime    {runtime or '{} (the cluster: its Python has mmt and the app installed)'}",
        ]
        return lines + [f"  WARNING    {problem}" for problem in self.problems(plan)]

    def owner_active(self, owner: OwnerRecord) -> bool:
        """Whether the Ray job of a launch recorded in a job dir still runs (on this launch's cluster)."""
        if not owner.scheduler_id or self.settings.address is None:
            return False
        try:
            job = RayApi(self.settings.address).job(str(owner.scheduler_id))
        except (Unanswered, Refused):
            return True  # it cannot be asked: it may still run
        return job is not None and not job.final

    # ------------------------------------------------------------------------------------------ the interface

    def _task(self, plan: JobPlan, attempt: Attempt, sid: str, copied: Dict[str, str]) -> RayTask:
        runtime = self.settings.runtime_env
        return RayTask(
            plan=plan,
            attempt_dir=str(attempt.dir),
            submission_id=sid,
            bundle=self.settings.bundle(plan),
            project_dir=None if runtime.working_dir is not None else self.project_dir,
            kill_grace_s=self.settings.kill_grace_s,
            start_method=self.settings.start_method,
            own_env=tuple(name for name, _ in runtime.env_vars),
            copied_env=copied,
            node_bundles=tuple(
                self._role_bundles(plan)[role.name] for role in plan.roles for _ in range(role.num_nodes)
            ),
        )

    def submit(self, submission: Submission) -> RayJobHandle:
        plan, attempt = submission.plan, submission.attempt
        assert self.settings.address is not None, "problems() names a missing address before anything is submitted"
        sid = submission_id(plan, attempt.id)
        ref = JobRef(self.settings.address, sid, self.settings.cluster_grace_s)
        ref.write(attempt)  # first: whoever finds the job later (`mmt list`) knows where to ask
        task = self._task(plan, attempt, sid, dict(submission.copied_env))
        path = write_task_file(task)
        runtime = self.settings.runtime_env
        try:
            RayApi(ref.address).submit(
                entrypoint(task, path),
                sid,
                runtime.to_ray(),
                metadata={"mmt_job": plan.name, "mmt_job_dir": plan.job_dir},
                upload=runtime.local_working_dir,
            )
        except (Unanswered, Refused) as exc:
            raise SubmissionRefused(
                f"{plan.label} ({plan.name}): Ray did not take it: {exc}; it asks {plan.num_nodes} Ray nodes with "
                f"{placement.describe(task.bundle)} each. HINT: check the cluster (ray status, "
                f"{ref.address}), then submit again"
            ) from None
        job = RayJobHandle(submission=submission, ref=ref, submitted=time.monotonic())
        self._watched.append(job)
        self._next_query = time.monotonic() + self.settings.poll_interval_s
        self._notices.append(
            f"mmt: job {plan.num} ({plan.name}) submitted as Ray job {sid} to {ref.address} ({plan.num_nodes} nodes "
            f"x {plan.devices}, bundles {placement.describe(task.bundle)}); its driver's log: "
            f"ray job logs --address {ref.address} {sid}"
        )
        return job

    def attach(self, record: JobRecord) -> RayJobHandle:
        """A job another process submitted, watched from here (``mmt wait``)."""
        attempt = JobDir(Path(record.job_dir)).attempt(record.attempt)
        ref = JobRef.read(attempt) or JobRef(self.settings.address or "", str(record.scheduler_id))
        job = RayJobHandle(
            submission=Submission(plan=read_plan(attempt), attempt=attempt),
            ref=ref,
            submitted=time.monotonic(),
            restarts=len(recorded(attempt)),
        )
        self._watched.append(job)
        self._next_query = 0.0
        return job

    def _silent(self, job: RayJobHandle) -> Optional[str]:
        silence = self._silences.get(job.ref.address)
        return None if silence is None else f"{silence.describe()}; check with {records.check(job.ref)}"

    def _record_stop(self, job: RayJobHandle, reason: str) -> None:
        records.mark_stopped(job.attempt, job.ref.submission_id, reason)

    def kill(self, handle: RayJobHandle) -> None:
        """Ray itself SIGKILLs a stopped job's driver after its grace (3 s), and the actors go with it: asked again."""
        if handle.outcome is None:
            self._stop(handle)

    def _send_stop(self, job: RayJobHandle) -> Optional[str]:
        try:
            self._api(job.ref.address).stop(job.ref.submission_id)
        except (Unanswered, Refused) as exc:
            return str(exc)
        return None

    def _stop_taken(self, job: RayJobHandle) -> None:
        records.mark_stop_sent(job.attempt)

    # ------------------------------------------------------------------------------------------ watching

    def _api(self, address: str) -> RayApi:
        """The cluster's API; while it is silent, each question waits less: a launcher stays responsive."""
        return RayApi(address, timeout_s=SILENT_TIMEOUT_S if address in self._silences else WATCH_TIMEOUT_S)

    def _query(self) -> None:
        self._next_query = time.monotonic() + self.settings.poll_interval_s
        by_address: Dict[str, List[RayJobHandle]] = {}
        for job in self._watched:
            if job.outcome is None:
                by_address.setdefault(job.ref.address, []).append(job)
        for address, jobs in by_address.items():
            self._ask(address, jobs)

    def _ask(self, address: str, jobs: List[RayJobHandle]) -> None:
        """Every job on one cluster; the first question it does not answer ends the round for that cluster (the
        others would wait as long, for the same silence)."""
        api = self._api(address)
        for job in jobs:
            try:
                seen = api.job(job.ref.submission_id)
            except (Unanswered, Refused) as exc:
                self._unanswered(address, jobs, exc.reason)
                return
            job.seen = seen if seen is not None else RayJob(job.ref.submission_id, GONE, "the cluster does not know it")
            job.answered_at = time.monotonic()
        silence = self._silences.pop(address, None)
        if silence is not None:
            self._notices.append(silence.answered_again())
            for job in jobs:
                view = read_scheduler(job.attempt)
                if view is not None and view.unreachable_since is not None:
                    write_scheduler(job.attempt, view.answered(), view)

    def _unanswered(self, address: str, jobs: List[RayJobHandle], reason: str) -> None:
        silence = self._silences.get(address)
        if silence is None:
            silence = Silence(who=f"the Ray dashboard at {address}", since=time.time(), why=reason)
            self._silences[address] = silence
            self._notices.append(silence.waiting(min(job.ref.grace_s for job in jobs), len(jobs)))
        for job in jobs:
            job.silence = job.silence or silence
            view = read_scheduler(job.attempt)
            write_scheduler(
                job.attempt,
                (view or SchedulerRecord(scheduler_id=job.ref.submission_id)).unanswered(records.DASHBOARD),
                view,
            )

    def _update(self, job: RayJobHandle) -> None:
        now = time.monotonic()
        if self._completed(job, now):  # the driver still removes the placement group: nothing that changes the result
            return
        if self._concluded_itself(job, now):
            return
        self._note_restarts(job)
        self._note_waiting(job)
        self._note_world_changes(job)
        seen = job.seen
        if seen is None:
            return
        if job.silence is not None and self._lost(job, seen, now):
            return
        if not seen.final:
            if seen.status == "RUNNING" and job.started is None:
                job.started = now
            if job.stopped_because is None:
                job.state = JobState(records.running_state(job.attempt, seen))
            return
        if self._concluded_itself(job, now):  # the driver wrote its result as it ended
            return
        outcome = records.outcome_ended(
            job.plan, job.attempt, job.ref.submission_id, None if seen.status == GONE else seen
        )
        if job.stopped_because is not None and outcome.status != JobState.COMPLETED:
            outcome = replace(
                outcome, status=JobState.INTERRUPTED, failure=None, detail=f"stopped: {job.stopped_because}"
            )
        outcome.duration_s = now - (job.started or job.submitted)
        self._conclude(job, outcome)

    def _lost(self, job: RayJobHandle, seen: RayJob, now: float) -> bool:
        """A job whose cluster went silent: lost with it once the grace has run out, or when the cluster answers
        again without it (its head was restarted); an answer that knows the job ends the silence for it."""
        assert job.silence is not None
        if job.ref.address not in self._silences:  # answered again since: about the job, which it knows or not
            silence, job.silence = job.silence, None
            if seen.status != GONE:
                return False
            detail = silence.came_back_without(records.check(job.ref))
        elif job.silence.over(job.ref.grace_s):
            detail = job.silence.lost(job.ref.grace_s, records.LOST_WHILE_SILENT, records.check(job.ref))
        else:
            return False
        ended = job.answered_at or now
        outcome = JobOutcome(
            JobState.FAILED,
            max(0.0, ended - (job.started or job.submitted)),
            detail=detail,
            scheduler_id=job.ref.submission_id,
        )
        self._conclude(job, outcome)
        return True

    def _note_restarts(self, job: RayJobHandle) -> None:
        """A run that failed and restarts (its driver recorded it): said once."""
        runs = recorded(job.attempt)
        for run in runs[job.restarts :]:
            self._notices.append(
                f"mmt: job {job.plan.num} (Ray {job.ref.submission_id}): run {run.restart} failed: {run.error}; "
                f"restart {run.restart + 1} of {job.plan.max_restarts} on the nodes that are left; it resumes in "
                f"{job.plan.job_dir}"
            )
        job.restarts = max(job.restarts, len(runs))

    def _note_waiting(self, job: RayJobHandle) -> None:
        """Why the job waits for its nodes, as its driver wrote it (scheduler.json): said once per reason."""
        view = read_scheduler(job.attempt)
        reason = view.explanation if view is not None and view.state == "PENDING" else None
        if reason != job.reason:
            job.reason = reason
            if reason:
                self._notices.append(f"mmt: job {job.plan.num} ({job.plan.name}) {reason}")
