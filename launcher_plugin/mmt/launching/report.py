"""The sweep summary: one row per job, printed at the end of a launch and appended to ``summary.csv``; then
``summary.png`` drawn, and what could not be written said in one line."""

import csv
import signal
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, List, Optional, Sequence

from mmt.core.jobdir import SweepDir
from mmt.core.states import JobState
from mmt.launching.console import Console, clean
from mmt.launching.jobs import JobReport, LaunchReport, NotStarted
from mmt.planning.redact import env_names_in, masked_overrides
from mmt.records.metric import summary_metric, sweep_metric_name
from mmt.records.world import shape as world_shape

# characters of a job's overrides the printed summary shows (summary.csv keeps them all): a sweep over long values
# (a command, a list) must not widen every row of the table to hundreds of columns
MAX_OVERRIDES = 100
_ELISION = " ... "


@dataclass(frozen=True)
class SummaryRow:
    job: int
    name: str
    overrides: str
    status: str
    num_nodes: int
    devices: int
    duration_s: Optional[float]
    metric: str
    note: str = ""
    # a job with roles: each role's shape (``trainer 2 x 2 + scorer 1 x 1``)
    shape: Optional[str] = None

    @property
    def topology(self) -> str:
        if self.shape:
            return self.shape
        return f"{self.num_nodes} x {self.devices}" if self.num_nodes else "-"


def first_line(text: str) -> str:
    """The first line that says something (torch's errors start with blank lines), as a terminal may show it: an
    exception's message can carry colours and other control sequences (rich, click), which never reach the
    summary raw."""
    return next((shown for line in text.splitlines() if (shown := clean(line).strip())), "")


def one_line(text: str, limit: int = MAX_OVERRIDES) -> str:
    """``text`` on one line of at most ``limit`` characters: control sequences removed, a newline shown as ``\\n``,
    the middle elided (both ends say the most: the first override, and the last that varies)."""
    text = clean(text.replace("\r\n", "\\n").replace("\n", "\\n").replace("\r", "\\r"))
    if len(text) <= limit:
        return text
    keep = max(2, limit - len(_ELISION))
    head = (keep + 1) // 2
    # no double space around the elision: readers split the table's columns on them
    return text[:head].rstrip() + _ELISION + text[len(text) - (keep - head) :].lstrip()


def metric_of(value: object, key: Optional[str]) -> Dict[str, str]:
    """The number shown in the summary, chosen as summary.png and the live page choose it (mmt.records.metric)."""
    chosen = summary_metric(value, key)
    return {"name": chosen.name, "value": "-" if chosen.value is None else f"{chosen.value:.4g}"}


def format_summary(title: str, rows: Sequence[SummaryRow], metric_name: str) -> str:
    header = ["#", "overrides", "status", "nodes x devices", "duration", metric_name]
    body = [
        [
            str(r.job),
            one_line(r.overrides) or "(none)",
            r.status,
            r.topology,
            "-" if r.duration_s is None else f"{r.duration_s:.1f} s",
            r.metric,
        ]
        for r in rows
    ]
    widths = [max(len(line[i]) for line in [header] + body) for i in range(len(header))]
    render = lambda cells: "  ".join(c.ljust(w) for c, w in zip(cells, widths)).rstrip()  # noqa: E731
    lines = [title, render(header), render(["-" * w for w in widths])] + [render(b) for b in body]
    lines += [f"  job {r.job}: {r.note}" for r in rows if r.note]
    return "\n".join(lines)


def append_summary_csv(path: Path, rows: List[SummaryRow], metric_name: str) -> None:
    new = not path.exists()
    with open(path, "a", newline="") as handle:
        writer = csv.writer(handle)
        if new:
            writer.writerow(
                ["job", "name", "overrides", "status", "num_nodes", "devices", "duration_s", metric_name, "note"]
            )
        for row in rows:
            writer.writerow(
                [
                    row.job,
                    row.name,
                    row.overrides,
                    row.status,
                    row.num_nodes,
                    row.devices,
                    "" if row.duration_s is None else f"{row.duration_s:.2f}",
                    row.metric,
                    row.note,
                ]
            )


def summarise(
    sweep_dir: Path,
    report: LaunchReport,
    console: Console,
    write_csv: bool = True,
    not_started: Sequence[NotStarted] = (),
) -> None:
    """The sweep's summary: printed, appended to summary.csv and drawn (summary.png), then what was left running."""
    chosen = [summary_metric(job.record.return_value, job.record.summary_metric) for job in report.jobs]
    metric_name = sweep_metric_name(chosen) or "metric"
    rows = sorted([*map(_job_row, report.jobs), *map(_not_started_row, not_started)], key=lambda row: row.job)
    if rows:
        console.write("\n" + format_summary(f"mmt summary ({sweep_dir})", rows, metric_name) + "\n\n")
    unwritten = [job.write_error for job in report.jobs if job.write_error is not None]
    if rows and write_csv:
        unwritten += _write_files(sweep_dir, rows, metric_name)
    if unwritten:
        console.write(
            f"mmt: could not write {len(unwritten)} file(s); the summary above is complete: "
            + "; ".join(unwritten)
            + "\n"
        )
    ending = _ending(report)
    if ending:
        console.write(ending + "\n")


def _job_row(job: JobReport) -> SummaryRow:
    plan, outcome = job.plan, job.outcome
    # the key the number is under, as result.json records it (a returned number: the app's optimized_metric)
    metric = metric_of(job.record.return_value, job.record.summary_metric)
    note = "" if outcome.status == JobState.COMPLETED else first_line(job.record.error or "")
    note = note.removeprefix(f"{plan.label}: ")
    if job.record.restarts and outcome.status == JobState.COMPLETED:
        note = f"completed after {job.record.restarts} restart(s): " + "; ".join(
            f"run {run.restart}: {run.error.removeprefix(f'{plan.label}: ')}" for run in job.record.earlier_runs
        )
    return SummaryRow(
        job=plan.num,
        name=plan.name,
        overrides=" ".join(masked_overrides(plan.overrides, plan.secret_names)),
        status=outcome.status.value,
        num_nodes=plan.num_nodes,
        devices=plan.devices,
        duration_s=outcome.duration_s,
        metric=metric["value"],
        note=note,
        shape=plan.topology if plan.roles else world_shape(plan.devices, job.record.world_changes, job.record.restarts),
    )


def _not_started_row(refused: NotStarted) -> SummaryRow:
    return SummaryRow(
        job=refused.num,
        name="-",
        overrides=" ".join(masked_overrides(refused.overrides, env_names_in(refused.overrides))),
        status="FAILED",
        num_nodes=0,
        devices=0,
        duration_s=None,
        metric="-",
        note=f"not started: {first_line(refused.reason)}",
    )


def _write_files(sweep_dir: Path, rows: List[SummaryRow], metric_name: str) -> List[str]:
    """summary.csv appended and summary.png drawn; what could not be written, and why."""
    unwritten = []
    try:
        append_summary_csv(SweepDir(sweep_dir).summary_csv, rows, metric_name)
    except OSError as exc:
        unwritten.append(f"{SweepDir(sweep_dir).summary_csv}: {exc.strerror or exc}")
    try:
        from mmt.monitor.plots import Plotter

        Plotter.draw(sweep_dir)
    except OSError as exc:
        unwritten.append(f"{SweepDir(sweep_dir).summary_png}: {exc.strerror or exc}")
    return unwritten


def _ending(report: LaunchReport) -> Optional[str]:
    """What the launch left running, or what stopped it."""
    if report.detached:
        return (
            f"mmt: {len(report.detached)} job(s) run on, detached: {', '.join(report.detached)}. "
            "Follow them with `mmt wait NAME`, `mmt logs NAME -f` or `mmt list`"
        )
    if report.interrupted_by is None:
        return None
    name = signal.Signals(report.interrupted_by).name
    if report.unconfirmed:
        return (
            f"mmt: {name} received; the stop of {len(report.unconfirmed)} job(s) could not be confirmed, their "
            f"cluster does not answer: {', '.join(report.unconfirmed)}. `mmt list` asks again once it answers"
        )
    return f"mmt: {name} received; every rank of every job was stopped"
