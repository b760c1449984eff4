"""What the views over job dirs (``summary.png``, the live page) read of a ``result.json``: a typed, read-only
projection of :class:`mmt.records.schema.ResultRecord`, each field taken on its own.

The engine reads results strictly (a record it cannot fully read is refused, never misread). A view shows what it
can of any file it finds in a job dir, one written by a newer mmt or edited by hand included: a field of the wrong
type reads as absent (a status it does not know as ``UNKNOWN``, a metric key that is not text as none), and the
rest of the record still shows. The summary metric is chosen by :mod:`mmt.records.metric`, as the console's is.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, List, Mapping, Optional, Tuple

from mmt.core.jobdir import JobDir, read_json
from mmt.records.metric import SummaryMetric, number, summary_metric

UNKNOWN = "UNKNOWN"


def _int(value: Any) -> Optional[int]:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _text(value: Any) -> Optional[str]:
    return value if isinstance(value, str) else None


@dataclass(frozen=True)
class ResultView:
    status: str = UNKNOWN  # a final state's name (COMPLETED, FAILED ...), or UNKNOWN
    job: Optional[int] = None
    name: Optional[str] = None
    attempt: Optional[str] = None
    overrides: Tuple[str, ...] = ()
    num_nodes: Optional[int] = None
    devices: Optional[int] = None
    machine: Optional[str] = None
    summary_metric: Optional[str] = None
    duration_s: Optional[float] = None
    started_at: Optional[float] = None
    ended_at: Optional[float] = None
    scheduler_id: Optional[str] = None
    return_value: Any = None
    error: Optional[str] = None
    failure: Optional[Dict[str, Any]] = None
    earlier_runs: List[Dict[str, Any]] = field(default_factory=list)

    @classmethod
    def of(cls, data: Mapping[str, Any]) -> "ResultView":
        overrides = data.get("overrides")
        failure = data.get("failure")
        runs = data.get("earlier_runs")
        scheduler_id = data.get("scheduler_id")
        return cls(
            status=str(data["status"]) if isinstance(data.get("status"), str) and data["status"] else UNKNOWN,
            job=_int(data.get("job")),
            name=_text(data.get("name")),
            attempt=_text(data.get("attempt")),
            overrides=tuple(o for o in overrides if isinstance(o, str)) if isinstance(overrides, list) else (),
            num_nodes=_int(data.get("num_nodes")),
            devices=_int(data.get("devices")),
            machine=_text(data.get("machine")),
            summary_metric=_text(data.get("summary_metric")),
            duration_s=number(data.get("duration_s")),
            started_at=number(data.get("started_at")),
            ended_at=number(data.get("ended_at")),
            scheduler_id=str(scheduler_id) if isinstance(scheduler_id, (str, int)) else None,
            return_value=data.get("return_value"),
            error=_text(data.get("error")),
            failure=dict(failure) if isinstance(failure, dict) else None,
            earlier_runs=[run for run in runs if isinstance(run, dict)] if isinstance(runs, list) else [],
        )

    @classmethod
    def read(cls, job_dir: Path) -> Optional["ResultView"]:
        """``<job dir>/result.json``; None when there is none, or nothing that is a JSON object."""
        data = read_json(JobDir(job_dir).result)
        return cls.of(data) if isinstance(data, dict) else None

    @property
    def completed(self) -> bool:
        return self.status == "COMPLETED"

    def metric(self, fallback_key: Optional[str] = None) -> SummaryMetric:
        """The job's summary metric (a job that did not complete returned nothing: no number)."""
        return summary_metric(self.return_value, self.summary_metric, fallback_key)
