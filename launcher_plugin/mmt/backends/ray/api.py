"""Ray's job submission API and state API, over HTTP, from any process (the launcher, ``mmt list``, ``mmt stop``).

Plain HTTP (``urllib``): a launcher or ``mmt list`` never imports ray (a second of CPU), and needs no Ray of the
cluster's version. The one exception is a job whose ``runtime_env.working_dir`` is a directory of this machine: Ray's
own client zips and uploads it (``submit`` imports it then).
"""

import json
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass
from typing import Any, Dict, List, Mapping, Optional

# seconds a request may take before the dashboard counts as not answering
TIMEOUT_S = 10.0
# Ray's job states (ray.job_submission.JobStatus) after which a job never runs again
FINAL = ("STOPPED", "SUCCEEDED", "FAILED")


class Unanswered(Exception):
    """The dashboard did not answer (nothing listens there, a timeout): nothing is known about the job.
    ``reason``: what the question met, in a few words (``[Errno 111] Connection refused``)."""

    def __init__(self, message: str, reason: str = "") -> None:
        self.reason = reason or message
        super().__init__(message)


class Refused(Exception):
    """The dashboard answered with an error: its status and what it said."""

    def __init__(self, status: int, said: str) -> None:
        self.status, self.said = status, said
        self.reason = f"HTTP {status}: {said}"
        super().__init__(self.reason)


@dataclass(frozen=True)
class RayJob:
    """One Ray job as the job submission API describes it."""

    submission_id: str
    status: str  # PENDING, RUNNING, STOPPED, SUCCEEDED, FAILED
    message: str = ""
    driver_exit_code: Optional[int] = None
    start_time: Optional[float] = None  # seconds (Ray says milliseconds)
    end_time: Optional[float] = None

    @property
    def final(self) -> bool:
        return self.status in FINAL

    @classmethod
    def of(cls, data: Mapping[str, Any]) -> "RayJob":
        def seconds(key: str) -> Optional[float]:
            value = data.get(key)
            return float(value) / 1000.0 if isinstance(value, (int, float)) and value else None

        code = data.get("driver_exit_code")
        return cls(
            submission_id=str(data.get("submission_id") or data.get("job_id") or ""),
            status=str(data.get("status") or "PENDING"),
            message=str(data.get("message") or ""),
            driver_exit_code=int(code) if isinstance(code, int) else None,
            start_time=seconds("start_time"),
            end_time=seconds("end_time"),
        )


@dataclass(frozen=True)
class ClusterNode:
    """One node of the cluster as Ray holds it: its address, whether it is alive, what it has in all."""

    ip: str
    node_id: str
    alive: bool
    head: bool
    resources: Mapping[str, float]


class RayApi:
    """The job submission and state APIs of the cluster whose dashboard is at ``address`` (``http://host:port``)."""

    def __init__(self, address: str, timeout_s: float = TIMEOUT_S) -> None:
        self.address, self.timeout_s = address.rstrip("/"), timeout_s

    def _call(self, method: str, path: str, body: Optional[Dict[str, Any]] = None) -> Any:
        data = json.dumps(body).encode() if body is not None else None
        request = urllib.request.Request(
            self.address + path, data=data, method=method, headers={"Content-Type": "application/json"}
        )
        try:
            with urllib.request.urlopen(request, timeout=self.timeout_s) as answer:
                text = answer.read().decode(errors="replace")
        except urllib.error.HTTPError as exc:
            said = exc.read().decode(errors="replace").strip()
            raise Refused(exc.code, _first_line(said) or exc.reason) from None
        except (urllib.error.URLError, OSError, ValueError) as exc:  # refused, unreachable, timed out, bad URL
            reason = str(getattr(exc, "reason", exc))
            raise Unanswered(f"the Ray dashboard at {self.address} does not answer ({reason})", reason) from None
        try:
            return json.loads(text) if text else None
        except ValueError:
            raise Unanswered(f"{self.address} answered {text[:80]!r}, not Ray's job API") from None

    # ------------------------------------------------------------------------------------------ jobs

    def submit(
        self,
        entrypoint: str,
        submission_id: str,
        runtime_env: Mapping[str, Any],
        metadata: Mapping[str, str],
        upload: bool = False,
    ) -> str:
        """Submit a job; its submission id. ``upload``: the runtime env names a directory here, which Ray's own
        client uploads first. The driver takes no resource of its own: it runs on the head, as Ray's jobs do."""
        if upload:
            from ray.job_submission import JobSubmissionClient  # lazy: only a local working_dir needs it

            client = JobSubmissionClient(self.address)
            return str(
                client.submit_job(
                    entrypoint=entrypoint,
                    submission_id=submission_id,
                    runtime_env=dict(runtime_env),
                    metadata=dict(metadata),
                )
            )
        body = {
            "entrypoint": entrypoint,
            "submission_id": submission_id,
            "runtime_env": dict(runtime_env),
            "metadata": dict(metadata),
        }
        answer = self._call("POST", "/api/jobs/", body)
        return str((answer or {}).get("submission_id") or submission_id)

    def job(self, submission_id: str) -> Optional[RayJob]:
        """The job's state; None when the cluster has no job of that id."""
        try:
            return RayJob.of(self._call("GET", f"/api/jobs/{urllib.parse.quote(submission_id, safe='')}"))
        except Refused as exc:
            if exc.status == 404:
                return None
            raise

    def stop(self, submission_id: str) -> bool:
        """Ask Ray to stop the job (SIGTERM to its driver, SIGKILL 3 s later); whether it was running."""
        try:
            answer = self._call("POST", f"/api/jobs/{urllib.parse.quote(submission_id, safe='')}/stop")
        except Refused as exc:
            if exc.status == 404:
                return False
            raise
        return bool((answer or {}).get("stopped"))

    def logs(self, submission_id: str) -> str:
        """What the job's driver printed (Ray keeps it on the head)."""
        answer = self._call("GET", f"/api/jobs/{urllib.parse.quote(submission_id, safe='')}/logs")
        return str((answer or {}).get("logs") or "")

    # ------------------------------------------------------------------------------------------ the cluster

    def nodes(self) -> List[ClusterNode]:
        """Every node the cluster knows, alive or dead, with what it has in all (the state API)."""
        answer = self._call("GET", "/api/v0/nodes?limit=10000")
        try:
            rows = answer["data"]["result"]["result"]
        except (KeyError, TypeError):
            raise Unanswered(f"{self.address} answered without a node list: not Ray's state API") from None
        return [
            ClusterNode(
                ip=str(row.get("node_ip") or ""),
                node_id=str(row.get("node_id") or ""),
                alive=row.get("state") == "ALIVE",
                head=bool(row.get("is_head_node")),
                resources={str(k): float(v) for k, v in (row.get("resources_total") or {}).items()},
            )
            for row in rows
        ]


def _first_line(text: str) -> str:
    """The gist of an error body: Ray answers JSON or a traceback; its last non-blank line says what was wrong."""
    try:
        data = json.loads(text)
        if isinstance(data, dict):
            text = str(data.get("msg") or data.get("message") or data.get("error") or text)
    except ValueError:
        pass
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    return lines[-1] if lines else ""
