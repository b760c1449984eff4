"""``<sweep dir>/summary.png``: the summary metric against each swept parameter, and the training curves.

Built from what the jobs left on disk (``<job>/result.json``, ``<job>/metrics.csv``), so it can be drawn
during a sweep, after it, or for an old sweep dir. What cannot be read is skipped: bad or partial inputs
never raise. matplotlib is imported only when a figure is built (``Figure`` and the Agg canvas, never pyplot,
so no global backend or figure state is touched), which keeps importing this module cheap.
"""

from __future__ import annotations

import csv
import io
import json
import math
import os
import secrets
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Dict, List, Optional, Sequence, Tuple

from mmt.core.jobdir import JobDir, SweepDir
from mmt.records.metric import UNNAMED, number, sweep_metric_name
from mmt.records.result_view import ResultView
from mmt.records.training import read as read_training_metrics

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

# a text chunk of summary.png: the metric and the jobs drawn, as JSON, so the file itself says what it shows
PLOTTED_KEY = "mmt:plotted"


class Plotter:
    """A process that imports matplotlib while the jobs run, on another core, and draws the plot when asked.

    Importing matplotlib costs a third of a second of CPU; drawing a sweep's plot a tenth, more as the sweep grows.
    Started with the launch, the import is paid while the launcher composes and supervises; in the same process,
    with threads, it would hold the GIL against the launcher's own work. The launcher does not wait for a drawing
    when it asks for one: it waits in :meth:`settle`, at the end of a launch that is the caller's last (the CLI, the
    SDK) or at the exit of a process that may launch again (a sweeper's next batch, which would otherwise wait for
    each batch's drawing). One drawing at a time: a sweep dir asked for again meanwhile is drawn once more after it,
    so a sweep of batches of one never queues a drawing per batch.
    """

    current: Optional["Plotter"] = None
    _settled_at_exit = False

    def __init__(self) -> None:
        import os
        import subprocess
        import sys

        # a session of its own: the terminal's Ctrl-C is the launcher's to handle; it ends when the launcher closes
        # its pipe, or goes
        # one BLAS thread: drawing a plot needs none, and numpy's import would start a pool of them
        env = dict(os.environ, OPENBLAS_NUM_THREADS="1", OMP_NUM_THREADS="1")
        self.process = subprocess.Popen(
            [sys.executable, "-m", "mmt.monitor.plots"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
            env=env,
            start_new_session=True,
        )
        self.drawing: Optional[Path] = None  # the sweep dir being drawn (asked, not yet answered)
        self.waiting: Dict[Path, None] = {}  # sweep dirs to draw after it, in the order asked
        self.unwritten: List[str] = []  # "<summary.png>: why", for each drawing that could not be written

    @classmethod
    def start(cls) -> None:
        if cls.current is None or cls.current.process.poll() is not None:
            cls.current = cls()
            if not cls._settled_at_exit:
                import atexit

                atexit.register(cls._settle_at_exit)
                cls._settled_at_exit = True

    @classmethod
    def draw(cls, sweep_dir: Path) -> None:
        """``write_sweep_plot`` in the plotter process when there is one (its outcome collected by :meth:`settle`),
        else here (an OSError when it cannot be written)."""
        plotter = cls.current
        if plotter is None or not plotter._ask(Path(sweep_dir)):
            cls.current = None
            _drawn_here(sweep_dir)

    @classmethod
    def settle(cls) -> List[str]:
        """Wait for every drawing asked for; what could not be written ("<summary.png>: why"), once each."""
        plotter = cls.current
        if plotter is None:
            return []
        while plotter.drawing is not None:
            if not plotter._answer():  # the plotter died: what it still had to draw is drawn here
                cls.current = None
                left = [plotter.drawing, *plotter.waiting]
                plotter.drawing, plotter.waiting = None, {}
                for sweep_dir in left:
                    try:
                        _drawn_here(sweep_dir)
                    except OSError as exc:
                        plotter.unwritten.append(f"{SweepDir(sweep_dir).summary_png}: {exc.strerror or exc}")
        unwritten, plotter.unwritten = plotter.unwritten, []
        return unwritten

    @classmethod
    def _settle_at_exit(cls) -> None:
        import sys

        try:
            for line in cls.settle():
                print(f"mmt: could not write {line}", file=sys.stderr)
        except KeyboardInterrupt:  # a Ctrl-C at exit: the plotter finishes what it has on its own
            pass

    def _ask(self, sweep_dir: Path) -> bool:
        """Ask for ``sweep_dir``'s drawing, now or after the one in progress; False if the plotter is gone."""
        import select

        if self.process.poll() is not None or self.process.stdout is None:
            return False
        # the drawing in progress may be done: its answer read now, so the plot follows the sweep as it goes (one
        # answer at most is outstanding, so none waits in the pipe's read buffer unseen by select)
        if self.drawing is not None and select.select([self.process.stdout], [], [], 0)[0] and not self._answer():
            return False
        if self.drawing is None:
            return self._send(sweep_dir)
        self.waiting[sweep_dir] = None  # also the dir being drawn: once more after, with the jobs ended since
        return True

    def _send(self, sweep_dir: Path) -> bool:
        if self.process.stdin is None:
            return False
        try:
            self.process.stdin.write(str(sweep_dir) + "\n")
            self.process.stdin.flush()
        except OSError:
            return False
        self.drawing = sweep_dir
        return True

    def _answer(self) -> bool:
        """Read the answer for the drawing in progress and ask for the next one; False if the plotter is gone."""
        assert self.drawing is not None
        try:
            answer = self.process.stdout.readline() if self.process.stdout is not None else ""
        except OSError:
            answer = ""
        if not answer:
            return False
        if answer.startswith("error "):
            why = answer.split(" ", 1)[1].strip()
            self.unwritten.append(f"{SweepDir(self.drawing).summary_png}: {why}")
        self.drawing = None
        if self.waiting:
            following = next(iter(self.waiting))
            del self.waiting[following]
            if not self._send(following):
                self.drawing = following  # read as gone by the caller's next answer
        return True


def _drawn_here(sweep_dir: Path) -> Optional[Path]:
    """``write_sweep_plot`` in this process: a plot that cannot be drawn is reported like one that cannot be
    written (a line under the summary), never an exception that fails the launch."""
    try:
        return write_sweep_plot(sweep_dir)
    except OSError:
        raise
    except Exception as exc:  # noqa: BLE001 - matplotlib may raise anything on odd data: reported, not fatal
        raise OSError(f"the plot could not be drawn ({type(exc).__name__}: {exc})") from exc


def _serve() -> None:
    """The plotter process: import matplotlib now; draw each sweep dir read from stdin, say what was written; end
    when the launcher closes the pipe (or goes)."""
    import sys

    import matplotlib.backends.backend_agg  # noqa: F401
    import matplotlib.figure  # noqa: F401

    for line in sys.stdin:
        try:
            written = _drawn_here(Path(line.strip()))
        except OSError as exc:
            print(f"error {' '.join(str(exc.strerror or exc).split())}", flush=True)
            continue
        print(written or "", flush=True)


CURVES = ("train_loss", "val_loss")  # the columns plotted from metrics.csv; both recipe styles name them so
RATE = "tokens_per_s"  # recipe=llm's throughput column: a panel of its own where a job wrote it
_NO_METRIC = {"metric", "result"}  # the metric column of summary.csv when the engine found no metric
_FAILED_Y = 0.03  # failed jobs sit at the bottom of a metric panel (axes coordinates)

Curve = Tuple[List[float], List[float]]  # steps, values


@dataclass
class _Job:
    num: int
    status: str
    params: Dict[str, str]  # override key -> value as typed; env overrides left out
    value: Any  # rank 0's return value
    curves: Dict[str, Curve] = field(default_factory=dict)
    metric: Optional[float] = None
    label: str = ""
    dir: str = ""  # the job dir's name in the sweep dir


# --------------------------------------------------------------------------------------------- reading inputs


def _parse(text: Optional[str]) -> Optional[float]:
    """An override's value as a finite float; None for blanks, text and nan."""
    try:
        return number(float(text))  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return None


def _params(overrides: Any) -> Dict[str, str]:
    """``["num_nodes=2", "+env.X=***"]`` -> ``{"num_nodes": "2"}``: env values are secrets, not axes."""
    params: Dict[str, str] = {}
    for item in overrides if isinstance(overrides, list) else []:
        if not isinstance(item, str):
            continue
        key, _, value = item.partition("=")
        key = key.lstrip("+")  # +key / ++key set the same parameter (~key deletes it: a value of its own)
        if key and key != "env" and not key.startswith("env."):
            params[key] = value
    return params


def _summary_csv_metric(sweep_dir: Path) -> Optional[str]:
    """The metric column of summary.csv: what the engine's summary showed (result.json may omit it)."""
    try:
        with open(SweepDir(sweep_dir).summary_csv, newline="") as handle:
            header = next(csv.reader(handle), [])
    except (OSError, UnicodeDecodeError, csv.Error):
        return None
    # job,name,overrides,status,num_nodes,devices,duration_s,<metric>,note
    column = header.index("duration_s") + 1 if "duration_s" in header else len(header)
    return header[column] if column < len(header) and header[column] not in _NO_METRIC | {"note"} else None


def _load(sweep_dir: Path) -> Tuple[List[_Job], str]:
    """The jobs that have a readable result.json, in job order, with their metric; and the metric's name. The
    metric is the console summary's (:mod:`mmt.records.metric`); a result that names none takes the column the
    sweep's summary.csv shows."""
    jobs, metrics = [], []
    try:
        dirs = [d for d in sweep_dir.iterdir() if d.name.isdigit() and d.is_dir()]
    except OSError:  # no sweep dir (yet), or not readable
        dirs = []
    from_csv = _summary_csv_metric(sweep_dir)
    for job_dir in sorted(dirs, key=lambda d: int(d.name)):
        view = ResultView.read(job_dir)
        if view is None:  # missing, unreadable, not JSON, not an object
            continue
        training = read_training_metrics(JobDir(job_dir).training_metrics)
        jobs.append(
            _Job(
                num=view.job if view.job is not None else int(job_dir.name),
                status=view.status,
                params=_params(list(view.overrides)),
                value=view.return_value,
                curves={column: training.points(column) for column in (*CURVES, RATE) if training.points(column)[0]},
                dir=job_dir.name,
            )
        )
        metrics.append(view.metric(fallback_key=from_csv))
    name = sweep_metric_name(metrics) or UNNAMED
    for job, metric in zip(jobs, metrics):
        job.metric = metric.value if metric.name == name and job.status == "COMPLETED" else None
    return jobs, name


def _swept(jobs: Sequence[_Job]) -> List[str]:
    """Parameters whose value differs between jobs (a job without the override counts as a value), in the
    order they were typed."""
    keys = list(dict.fromkeys(key for job in jobs for key in job.params))
    return [key for key in keys if len({job.params.get(key) for job in jobs}) > 1]


def _typed(key: str, value: str) -> str:
    return f"{key}={value}" if value or not key.startswith("~") else key  # "~trainer.logger" has no value


def _label_jobs(jobs: Sequence[_Job], swept: Sequence[str]) -> None:
    """A job is named by its swept overrides ("num_nodes=2"), and by its number where that is not unique."""
    for job in jobs:
        typed = [_typed(key, job.params[key]) for key in swept if key in job.params]
        job.label = " ".join(typed) or f"job {job.num}"
    counts: Dict[str, int] = {}
    for job in jobs:
        counts[job.label] = counts.get(job.label, 0) + 1
    for job in jobs:
        if counts[job.label] > 1:
            job.label = f"#{job.num} {job.label}"


# ---------------------------------------------------------------------------------------------------- drawing


def _why_no_metric(job: _Job) -> str:
    return job.status if job.status != "COMPLETED" else "no metric"


def _mark_failed(ax: "Axes", x: float, job: _Job) -> None:
    """A job without a metric: a red x at the bottom of the panel, with its status, not a missing point."""
    transform = ax.get_xaxis_transform()  # x in data, y in axes: at the bottom whatever the metric's range
    ax.plot(
        [x],
        [_FAILED_Y],
        linestyle="none",
        marker="x",
        markersize=9,
        color="tab:red",
        transform=transform,
        clip_on=False,
        label=job.label,
    )
    ax.annotate(
        _why_no_metric(job),
        (x, _FAILED_Y),
        xycoords=transform,
        xytext=(0, 7),
        textcoords="offset points",
        ha="center",
        fontsize=7,
        color="tab:red",
    )


def _groups(jobs: Sequence[_Job], others: Sequence[str]) -> Dict[str, List[_Job]]:
    """Jobs by their values of the other swept parameters: one series each, so a grid sweep does not zigzag.
    Where no series would join two values (parameters swept together, not as a grid), all are one series."""
    groups: Dict[str, List[_Job]] = {}
    for job in jobs:
        groups.setdefault(_series(job, others), []).append(job)
    joined = any(sum(job.metric is not None for job in members) > 1 for members in groups.values())
    return groups if joined else {"": list(jobs)}


def _series(job: _Job, others: Sequence[str]) -> str:
    return " ".join(_typed(key, job.params[key]) if key in job.params else f"{key}=(unset)" for key in others)


def _numeric_panel(ax: "Axes", jobs: Sequence[_Job], param: str, others: Sequence[str]) -> None:
    """A line per series through its jobs sorted by the parameter's value; a marker per job."""
    x_of = lambda job: float(job.params[param])  # noqa: E731 (checked numeric by the caller)
    groups = _groups(jobs, others)
    for index, (name, members) in enumerate(groups.items()):
        done = sorted((job for job in members if job.metric is not None), key=x_of)
        metrics = [float(job.metric) for job in done if job.metric is not None]
        ax.plot([x_of(job) for job in done], metrics, "-", color=_color(index), label=name or "_series")
        for job, metric in zip(done, metrics):
            ax.plot([x_of(job)], [metric], linestyle="none", marker="o", color=_color(index), label=job.label)
            if len(groups) == 1:  # several series: the values would overlap
                ax.annotate(
                    f"{job.metric:.4g}",
                    (x_of(job), job.metric),
                    xytext=(0, 6),
                    textcoords="offset points",
                    ha="center",
                    fontsize=7,
                )
        for job in members:
            if job.metric is None:
                _mark_failed(ax, x_of(job), job)
    typed = {x_of(job): job.params[param] for job in jobs}
    ticks = sorted(typed)
    if ticks[0] > 0 and ticks[-1] / ticks[0] >= 100:  # lr=1e-4,1e-3,1e-2: evenly spaced on a log axis
        ax.set_xscale("log")
    if len(ticks) <= 12:  # the swept values themselves, as typed
        ax.set_xticks(ticks, [typed[t] for t in ticks])
        ax.minorticks_off()
    ax.margins(y=0.2)  # room for the value labels above and the failed jobs' row below the lowest point
    if len(groups) > 1:
        _legend(ax, [line for line in ax.get_lines() if line.get_label() in groups])


def _bar_panel(ax: "Axes", jobs: Sequence[_Job], categories: Dict[str, List[_Job]], others: Sequence[str]) -> None:
    """One bar per job, side by side within its category, coloured by its series (the other swept values)."""
    groups = _groups(jobs, others)
    color = {id(job): _color(index) for index, members in enumerate(groups.values()) for job in members}
    width = 0.8 / max(len(members) for members in categories.values())
    for position, members in enumerate(categories.values()):
        for slot, job in enumerate(members):
            x = position + (slot - (len(members) - 1) / 2) * width
            if job.metric is None:
                _mark_failed(ax, x, job)
                continue
            bars = ax.bar([x], [job.metric], width=width * 0.9, color=color[id(job)], label=job.label)
            if len(members) <= 4:  # narrower bars: the values would overlap
                ax.bar_label(bars, fmt="%.4g", fontsize=7)
    ax.set_xticks(range(len(categories)), list(categories))
    ax.set_xlim(-0.6, len(categories) - 0.4)
    if len(groups) > 1:
        from matplotlib.patches import Patch

        _legend(ax, [Patch(color=_color(index), label=name) for index, name in enumerate(groups)])


def _metric_panel(ax: "Axes", jobs: Sequence[_Job], param: Optional[str], swept: Sequence[str], metric: str) -> None:
    others = [key for key in swept if key != param]
    if param is None:  # nothing swept: the job's value (or each job's, if several share their overrides)
        _bar_panel(ax, jobs, {job.label: [job] for job in jobs}, others)
        ax.set_title(f"{metric} ({len(jobs)} job{'s' if len(jobs) > 1 else ''})")
        ax.set_xlabel("job")
    elif all(_parse(job.params.get(param)) is not None for job in jobs):
        _numeric_panel(ax, jobs, param, others)
        ax.set_title(f"{metric} vs {param}")
        ax.set_xlabel(param)
    else:
        categories: Dict[str, List[_Job]] = {}
        for job in jobs:
            value = job.params.get(param, "(unset)")
            categories.setdefault(value or _typed(param, value), []).append(job)  # "": show "~key" or "key="
        _bar_panel(ax, jobs, categories, others)
        ax.set_title(f"{metric} vs {param}")
        ax.set_xlabel(param)
    ax.set_ylabel(metric)
    if all(job.metric is None for job in jobs):
        ax.set_yticks([])
    ax.grid(True, axis="y", alpha=0.3)


def _curves_panel(ax: "Axes", jobs: Sequence[_Job]) -> None:
    for index, job in enumerate(jobs):
        color = _color(index)
        if not job.curves:
            continue
        train, val = job.curves.get("train_loss"), job.curves.get("val_loss")
        if train:
            ax.plot(*train, "-", color=color, linewidth=1.2, label=job.label)
        if val:  # the legend names the job once; a val-only job is named by its markers
            ax.plot(
                *val,
                linestyle="none",
                marker="o",
                markersize=5,
                color=color,
                label=f"_{job.label} val_loss" if train else job.label,
            )
    ax.set_title("training curves: train_loss (line), val_loss (o)")
    ax.set_xlabel("step")
    ax.set_ylabel("loss")
    ax.grid(True, alpha=0.3)
    _legend(ax, [line for line in ax.get_lines() if not str(line.get_label()).startswith("_")])


def _rates_panel(ax: "Axes", jobs: Sequence[_Job]) -> None:
    """The job's tokens/s against step (recipe=llm's metrics.csv), one line per job."""
    for index, job in enumerate(jobs):
        if RATE in job.curves:
            ax.plot(*job.curves[RATE], "-", color=_color(index), linewidth=1.2, label=job.label)
    ax.set_title("throughput: tokens/s of the job")
    ax.set_xlabel("step")
    ax.set_ylabel("tokens/s")
    ax.grid(True, alpha=0.3)
    _legend(ax, list(ax.get_lines()))


def _legend(ax: "Axes", handles: List[Any]) -> None:
    """Below the panel's x label, where it hides no data; the constrained layout makes room for it."""
    if handles:  # borderaxespad is in font sizes: 5 x 7 pt clears the tick labels and the x label
        ax.legend(
            handles=handles,
            fontsize=7,
            loc="upper center",
            bbox_to_anchor=(0.5, 0),
            borderaxespad=5,
            ncols=2 if len(handles) > 6 else 1,
            frameon=False,
        )


def _color(index: int) -> str:
    return f"C{index % 10}"  # matplotlib's default cycle


def worth_drawing(jobs: int, curves: bool) -> bool:
    """A picture adds something to the printed summary for two jobs or more, or for training curves; one job's
    single number is in the summary already (a one-job probe or command run draws nothing)."""
    return jobs >= 2 or curves


def sweep_may_be_drawn(sweep_dir: Path, job_dirs: Sequence[str]) -> bool:
    """Whether the sweep will have two jobs or more to draw once the jobs in ``job_dirs`` end (then the plotter is
    started early); a single job whose curves appear is drawn in the launcher at the end instead."""
    jobs = {Path(job_dir).resolve() for job_dir in job_dirs}
    if len(jobs) < 2:
        try:  # the sweep's earlier jobs (an earlier batch of the sweeper, or another launch into this dir)
            jobs |= {path.parent.resolve() for path in Path(sweep_dir).glob("*/result.json")}
        except OSError:
            pass
    return len(jobs) >= 2


def sweep_figure(sweep_dir: Path) -> Optional["Figure"]:
    """The sweep's figure: a metric panel per swept parameter (one if nothing is swept) and a panel of
    training curves when any job wrote metrics.csv. None when nothing is worth drawing: no job has a readable
    result.json, or a single job without curves."""
    drawn = _draw(Path(sweep_dir))
    return drawn[0] if drawn else None


def _worth_drawing(jobs: Sequence[_Job]) -> bool:
    return bool(jobs) and worth_drawing(len(jobs), any(set(job.curves) & set(CURVES) for job in jobs))


def _draw(
    sweep_dir: Path, loaded: Optional[Tuple[List[_Job], str]] = None
) -> Optional[Tuple["Figure", List[_Job], str]]:
    """The sweep's figure (see ``sweep_figure``), the jobs drawn in it and the metric's name (``loaded``: the
    sweep's jobs and metric, when the caller has read them already)."""
    jobs, metric = loaded or _load(sweep_dir)
    with_curves = any(set(job.curves) & set(CURVES) for job in jobs)
    with_rates = any(RATE in job.curves for job in jobs)
    if not _worth_drawing(jobs):
        return None
    swept = _swept(jobs)
    _label_jobs(jobs, swept)
    panels: List[Optional[str]] = list(swept) or [None]
    count = len(panels) + with_curves + with_rates
    cols = min(count, 3)
    rows = math.ceil(count / cols)

    from matplotlib.figure import Figure

    legend_rows = math.ceil(len(jobs) / 2) if len(jobs) > 6 else len(jobs)  # the longest legend: one per job
    size = (max(5.2 * cols, 7.0), (4.0 + 0.15 * legend_rows) * rows + 0.4)  # inches
    fig = Figure(figsize=size, layout="constrained")
    axes = list(fig.subplots(rows, cols, squeeze=False).flat)
    for ax in axes[count:]:  # the grid's spare cells
        fig.delaxes(ax)
    for ax, param in zip(axes, panels):
        _metric_panel(ax, jobs, param, swept, metric)
    if with_curves:
        _curves_panel(axes[len(panels)], jobs)
    if with_rates:
        _rates_panel(axes[len(panels) + with_curves], jobs)
    statuses: Dict[str, int] = {}
    for job in jobs:
        statuses[job.status] = statuses.get(job.status, 0) + 1
    counts = ", ".join(f"{count} {status}" for status, count in sorted(statuses.items()))
    fig.suptitle(f"mmt sweep {sweep_dir.name}: {len(jobs)} job{'s' if len(jobs) > 1 else ''} ({counts})")
    return fig, jobs, metric


def plot_metadata(title: str, jobs: Sequence[_Job], metric: str) -> Dict[str, str]:
    """The PNG's text chunks: what it plots, read from the file alone (a plot drawn before the last job ended
    lists fewer jobs). ASCII JSON: a tEXt chunk is Latin-1, and overrides may be any text."""
    plotted = [
        {
            "job": job.num,
            "dir": job.dir,
            "label": job.label,
            "status": job.status,
            "metric": job.metric,
            "curves": sorted(job.curves),
        }
        for job in jobs
    ]
    described = "; ".join(f"{job.dir}: {job.label}" for job in jobs)
    return {
        "Title": title,
        "Description": f"{metric} of {len(jobs)} jobs: {described}",
        PLOTTED_KEY: json.dumps({"metric": metric, "jobs": plotted}),
    }


def write_sweep_plot(sweep_dir: Path) -> Optional[Path]:
    """Draw the sweep's figure into ``<sweep dir>/summary.png`` (replaced atomically: a reader sees the old
    plot or the new one) and return its path; None when there is nothing to plot. Unreadable inputs are
    skipped; only a failure to write the file raises (OSError): the caller reports it as for summary.csv."""
    sweep_dir = Path(sweep_dir)
    loaded = _load(sweep_dir)
    if not _worth_drawing(loaded[0]):  # decided before matplotlib is imported (a third of a second of CPU)
        return None
    import matplotlib
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    # labels are literal text: a swept value such as '$x^^y$' is not mathtext
    with matplotlib.rc_context({"text.parse_math": False}):
        drawn = _draw(sweep_dir, loaded)
        if drawn is None:
            return None
        fig, jobs, metric = drawn
        FigureCanvasAgg(fig)  # attaches itself to the figure: renders without pyplot or a global backend
        buffer = io.BytesIO()
        fig.savefig(buffer, format="png", dpi=100, metadata=plot_metadata(fig.get_suptitle(), jobs, metric))
        fig.clear()  # a Figure not made by pyplot is registered nowhere: clearing it is all the closing it needs
    target = SweepDir(sweep_dir).summary_png
    tmp = target.with_name(f".{target.name}.{os.getpid()}.{secrets.token_hex(4)}")  # same dir: os.replace is atomic
    try:
        # 0o666 less the umask, like the sweep's other files (mkstemp's 0600 would need a chmod)
        with open(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666), "wb") as handle:
            handle.write(buffer.getvalue())
        os.replace(tmp, target)
    except BaseException as exc:
        tmp.unlink(missing_ok=True)
        if isinstance(exc, FileNotFoundError) and not sweep_dir.is_dir():
            return None  # the sweep dir was removed while it was drawn (a test's tmp dir): nothing to report
        raise
    return target


if __name__ == "__main__":
    _serve()
