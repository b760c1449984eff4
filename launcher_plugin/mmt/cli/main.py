"""The ``mmt`` command: its verbs and flags mirror ``lightning mmt`` / ``lightning job``.

mmt run --name N --num-machines K --machine T4 --command "python train.py" [--image I] [-e KEY=VALUE ...]
        [--cluster local|slurm|ray|<backend>|<site>] [--detach] [--dry-run] [--dashboard]
mmt list [--all] [--json]          mmt inspect NAME [--json]
mmt logs NAME [-f] [--rank R] [--role ROLE] [--tail N]
mmt stop NAME                      mmt wait NAME [--timeout S]
mmt delete NAME                    mmt dashboard [DIR ...] [--port P]
"""

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any, Dict, List, Mapping, Optional

from mmt.backends.registry import specs as backend_specs
from mmt.core.errors import MMTError

# every backend mmt knows (mmt's own first), as the flags' help spells them
_CLUSTERS = "|".join(spec.name for spec in backend_specs())

# Lightning's flags (`lightning job` / `lightning mmt`) that mean nothing here, per verb, and what to use instead:
# a Lightning user's flag is answered with mmt's equivalent, never matched to another flag or left unexplained. The
# run verb's hints are the SDK's for the same parameters, where these do not say it in the CLI's terms.
_LIGHTNING_FLAGS: Dict[str, Dict[str, Optional[str]]] = {
    "run": {
        "studio": None,
        "teamspace": None,
        "org": None,
        "user": None,
        "cloud": f"pick the cluster with --cluster {_CLUSTERS}|<site config>",
        "cloud-account": f"mmt runs on this host or on SLURM: use --cluster {_CLUSTERS}|<site config>",
        "interruptible": None,
        "image-credentials": None,
        "cloud-account-auth": None,
        "entrypoint": None,
        "path-mapping": None,
        "path-mappings": None,
        "tag": "name jobs instead (--name); `mmt list` shows every job",
        "tags": "name jobs instead (--name); `mmt list` shows every job",
        "keep-minutes": None,
    },
    "logs": {
        flag: "mmt's logs are each process's own output, without timestamps or levels: filter them with grep "
        "(mmt logs NAME | grep ...), or read the files in the job dir's logs/"
        for flag in ("timestamps", "since", "until", "query", "severity", "json")
    },
    "list": {
        "sort-by": "mmt list --json, sorted by your own tool (jobs come newest first)",
        "filter": "mmt list --json, filtered by your own tool",
        "tag": "jobs have names, not tags",
    },
}

# the names an error gives a value (the SDK's, the planner's) -> the flag a CLI user typed, per verb
_FLAG_OF = {
    "run": {
        "num_machines": "--num-machines",
        "machine": "--machine",
        "cluster": "--cluster",
        "command": "--command",
        "image": "--image",
        "devices": "--devices",
        "command_mode": "--command-mode",
        "max_runtime": "--max-runtime",
        "max_restarts": "--max-restarts",
        "after": "--after",
        "name": "--name",
    },
    "logs": {"rank": "--rank", "tail": "--tail", "role": "--role"},
}


def _env_pair(text: str) -> tuple:
    name, sep, value = text.partition("=")
    if not sep or not name:
        raise argparse.ArgumentTypeError(f"expected KEY=VALUE, got {text!r}")
    return name, value


def _parser() -> argparse.ArgumentParser:
    # allow_abbrev=False everywhere: a flag mmt lacks (--cloud-account) must not be taken for one it has that it
    # begins (--cloud-account-auth)
    parser = argparse.ArgumentParser(
        prog="mmt", description="Multi-machine training jobs: run, follow, stop.", allow_abbrev=False
    )
    verbs = parser.add_subparsers(dest="verb", required=True, metavar="VERB")

    run = verbs.add_parser("run", help="run a command on N machines (attached unless --detach)", allow_abbrev=False)
    _job_arguments(run)
    _run_arguments(run)
    _view_arguments(
        verbs.add_parser("list", help="jobs in the registry", allow_abbrev=False),
        verbs.add_parser("inspect", help="one job in detail", allow_abbrev=False),
        verbs.add_parser("logs", help="a job's output", allow_abbrev=False),
    )
    _control_arguments(
        verbs.add_parser("stop", help="stop a running job, or every job of a launch", allow_abbrev=False),
        verbs.add_parser(
            "wait", help="re-attach: follow a job until it ends; its exit status is the job's", allow_abbrev=False
        ),
        verbs.add_parser("delete", help="forget an ended job (its files stay)", allow_abbrev=False),
    )

    dashboard = verbs.add_parser("dashboard", help="the live page", add_help=False)
    dashboard.add_argument("rest", nargs=argparse.REMAINDER)
    parser.set_defaults(verb_parsers=verbs.choices)
    _lightning_arguments(verbs.choices)
    return parser


def _job_arguments(run: argparse.ArgumentParser) -> None:
    """``mmt run``'s flags that say what the job is: name, machines, command, image, environment, cluster."""
    run.add_argument("--name", help="the job's name (default: mmt-<Mon-DD-HH_MM>-<random>)")
    run.add_argument("--num-machines", type=int, default=1, help="nodes (Lightning's --num-machines)")
    run.add_argument("--machine", default="cpu", help="a machine type, Lightning's names in any case (T4, A100_X_8)")
    run.add_argument("--command", required=True, help="the shell command every node runs")
    run.add_argument("--image", help="a container image (cluster=slurm: pyxis or apptainer)")
    run.add_argument(
        "-e",
        "--env",
        type=_env_pair,
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="an environment variable for every process (repeatable); its value is never printed",
    )
    run.add_argument(
        "--env-from",
        action="append",
        default=[],
        metavar="NAME",
        help="copy this variable from this shell's environment (secrets stay off the command line)",
    )
    run.add_argument(
        "--cluster", default="local", help=f"{_CLUSTERS.replace('|', ' | ')} | a site config in ./conf/cluster/"
    )
    run.add_argument("--devices", type=int, help="processes per machine (default: its GPUs, 1 on CPU machines)")
    run.add_argument(
        "--command-mode",
        default="per_node",
        choices=("per_node", "per_rank"),
        help="the command starts its own ranks (per_node) or runs once per rank",
    )


def _run_arguments(run: argparse.ArgumentParser) -> None:
    """``mmt run``'s flags that say how it runs: time limit, dependencies, restarts, overrides, how it is followed."""
    run.add_argument(
        "--max-runtime", metavar="DURATION", help="stop the job after this long: seconds (3600), or 90m, 1h30m, 2h ..."
    )
    run.add_argument(
        "--after",
        action="append",
        default=[],
        metavar="NAME",
        help="start only once this registered job (or every job of this launch) has completed; repeatable",
    )
    run.add_argument(
        "--max-restarts",
        type=int,
        metavar="N",
        help="restart the whole job after a failure, at most N times (cluster=local); never after a stop",
    )
    run.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="any Hydra override, e.g. --set hydra.launcher.partition=gpu (repeatable)",
    )
    run.add_argument("--detach", action="store_true", help="submit and return at once")
    run.add_argument("--dry-run", action="store_true", help="print the plan, start nothing")
    run.add_argument(
        "--dashboard",
        action="store_true",
        help="serve the live page while the job runs (attached runs; else: mmt dashboard)",
    )
    run.add_argument("--json", action="store_true", help="print the submitted job as JSON (with --detach)")


def _view_arguments(
    listing: argparse.ArgumentParser, inspect: argparse.ArgumentParser, logs: argparse.ArgumentParser
) -> None:
    """The flags of the verbs that show jobs: ``list``, ``inspect``, ``logs``."""
    listing.add_argument("--all", action="store_true", help="every job (default: the last 7 days and running ones)")
    listing.add_argument("--json", action="store_true")

    inspect.add_argument("name", nargs="?")
    inspect.add_argument("--name", dest="name_flag", metavar="NAME", help="the job (Lightning's spelling)")
    inspect.add_argument("--json", action="store_true")

    logs.add_argument("name")
    logs.add_argument("-f", "--follow", action="store_true", help="keep printing until the job ends")
    logs.add_argument("--rank", type=int, default=0, help="global rank (per-node command jobs: the machine)")
    logs.add_argument("--role", help="a job with roles: the role whose rank --rank names (default: the primary)")
    logs.add_argument("--tail", type=int, help="only the last N lines (N >= 1; with -f: then follow)")
    logs.add_argument(
        "--raw",
        action="store_true",
        help="the log's bytes as written, control sequences included (default: as the console shows them)",
    )


def _control_arguments(
    stop: argparse.ArgumentParser, wait: argparse.ArgumentParser, delete: argparse.ArgumentParser
) -> None:
    """The flags of the verbs that act on one job: ``stop``, ``wait``, ``delete``."""
    stop.add_argument("name", help="a job's name, or a launch's (hydra.launcher.name): every job of it")

    wait.add_argument("name")
    wait.add_argument("--timeout", type=float, help="give up after this many seconds (exit 124)")

    delete.add_argument("name")
    delete.add_argument("-y", "--yes", action="store_true")


def _lightning_arguments(verbs: Mapping[str, argparse.ArgumentParser]) -> None:
    """Lightning's flags, with or without a value, on each verb: answered in _refuse_lightning_flags."""
    for verb, flags in _LIGHTNING_FLAGS.items():
        sub = verbs[verb]
        for flag in flags:
            sub.add_argument(
                f"--{flag}", dest=f"lightning_{flag.replace('-', '_')}", nargs="?", const=True, help=argparse.SUPPRESS
            )


def _refuse_lightning_flags(args: argparse.Namespace) -> None:
    """A Lightning flag that was given: one line, with mmt's equivalent."""
    for flag, hint in _LIGHTNING_FLAGS.get(args.verb, {}).items():
        if getattr(args, f"lightning_{flag.replace('-', '_')}", None) is None:
            continue
        if hint is None:
            from mmt import sdk

            key = {"path-mapping": "path_mappings", "tag": "tags"}.get(flag, flag.replace("-", "_"))
            hint = sdk.LIGHTNING_ONLY.get(key, "it has no meaning outside Lightning AI")
        raise MMTError(f"--{flag} is a Lightning AI flag that mmt does not have. HINT: {hint}")


def _unknown_flag(parser: argparse.ArgumentParser, verb: Optional[str], extra: List[str]) -> str:
    """The one line for an argument mmt does not take: the closest flags it has."""
    import difflib

    where = f"mmt {verb}" if verb else "mmt"
    sub = parser.get_default("verb_parsers").get(verb) if verb else None
    flags = [o for a in (sub or parser)._actions if a.help != argparse.SUPPRESS for o in a.option_strings]
    word = next((e for e in extra if e.startswith("-")), extra[0])
    close = difflib.get_close_matches(word.split("=")[0], flags, n=2, cutoff=0.8)
    hint = f"did you mean {' or '.join(close)}? " if close else ""
    what = "unknown flag" if word.startswith("-") else "unexpected argument"
    return f"{where}: {what} {word}. HINT: {hint}`{where} --help` lists what it takes"


def _in_flag_terms(exc: Any, verb: str) -> str:
    """A ConfigError about a value a flag gave, in the flag's terms: `--num-machines 0`, not `num_nodes=0`."""
    import re
    import shlex

    flag = _FLAG_OF.get(verb, {}).get(exc.key)
    if flag is None:
        return str(exc)
    value = exc.value if isinstance(exc.value, (int, float)) else shlex.quote(str(exc.value))
    text = f"Invalid {flag} {value}: {exc.expected}."
    if exc.hint:
        text += " HINT: " + re.sub(rf"\b{re.escape(exc.key)}=(\S+)", rf"{flag} \1", exc.hint)
    return text


def _run(args: argparse.Namespace) -> int:
    from mmt.backends import registry
    from mmt.launching.engine import LaunchReport
    from mmt.service.submit import RunSpec, exit_code, max_runtime_s, run

    if args.detach and args.dashboard:
        raise MMTError(
            "--dashboard serves the live page for as long as an attached run lasts, and --detach returns "
            "at once. HINT: leave --dashboard out, and run `mmt dashboard` when you want the page: it "
            "shows every registered job"
        )
    seconds = max_runtime_s("max_runtime", args.max_runtime) if args.max_runtime is not None else None
    spec = RunSpec(
        command=args.command,
        name=args.name,
        num_machines=args.num_machines,
        machine=args.machine,
        image=args.image,
        env=dict(args.env),
        env_from=args.env_from,
        cluster=args.cluster,
        devices=args.devices,
        command_mode=args.command_mode,
        timeout_min=seconds / 60.0 if seconds is not None else None,
        max_restarts=args.max_restarts,
        after=args.after,
        dry_run=args.dry_run,
        detach=args.detach,
        overrides=args.overrides + (["hydra.launcher.dashboard=true"] if args.dashboard else []),
    )
    outcome = run(spec)
    if isinstance(outcome, str):  # a dry run
        print(outcome)
        return 0
    if isinstance(outcome, LaunchReport):
        return exit_code(outcome)
    for item in outcome:
        facts = {
            "name": item.plan.name,
            "id": item.plan.job_id,
            "dir": item.plan.job_dir,
            "cluster": item.backend,
            "scheduler_id": item.scheduler_id,
            "status": "Pending",
        }
        job = registry.scheduler_job(item.backend, item.scheduler_id) if item.scheduler_id else None
        where = item.backend + (f", {job}" if job else "")
        follow = f"mmt logs {facts['name']} -f | mmt wait {facts['name']}"
        print(
            json.dumps(facts)
            if args.json
            else f"mmt: {facts['name']} submitted ({where}): {facts['dir']}\n     follow it: {follow}"
        )
    return 0


def _rows(records: List[Any]) -> List[Dict[str, Any]]:
    """The jobs as `mmt list` shows them: the SDK's rows (``Job.dict()``), one per record."""
    from mmt.service.handle import job_row

    return [job_row(record) for record in records]


def _list(args: argparse.Namespace) -> int:
    from rich.console import Console
    from rich.markup import escape
    from rich.table import Table

    from mmt.records.registry import Registry
    from mmt.service.status import refresh_all

    registry = Registry()
    records = refresh_all(registry.list(since=None if args.all else time.time() - 7 * 86400), registry)
    rows = _rows(records)
    from mmt.remote import forward  # the jobs launched over SSH: listed where they live

    if args.json:
        print(
            json.dumps([*rows, *forward.listed(["list", "--json", *(["--all"] if args.all else [])], True)], indent=2)
        )
        return 0
    table = Table(box=None, header_style="bold")
    scheduled = any(row["scheduler_job"] for row in rows)  # the scheduler's job column, where one has one
    columns = ("NAME", "STATUS", "CLUSTER", "MACHINE", "NODES x DEV", "RESTARTS", "CREATED", "DURATION", "METRIC")
    for column in (*columns, *(("SCHEDULER JOB",) if scheduled else ())):  # last: the others keep their places
        table.add_column(column)
    colours = {
        "Completed": "green",
        "Failed": "red",
        "Running": "cyan",
        "Restarting": "magenta",
        "Stopped": "yellow",
        "Cancelled": "yellow",
    }
    for row in rows:
        status = row["status"]
        note = f" ({escape(row['note'])})" if row["note"] else ""
        table.add_row(
            row["name"],
            f"[{colours.get(status, 'white')}]{status}[/]{note}",
            row["cluster"],
            row["machine"],
            row["topology"],
            str(row["restarts"]),
            row["created"],
            "-" if row["duration_s"] is None else f"{row['duration_s']} s",
            row["metric"] or "-",
            *((row["scheduler_job"] or "-",) if scheduled else ()),
        )
    # Piped (grep, a script, a test): one line per job whatever its width, as squeue's; a terminal wraps to fit.
    Console(width=None if sys.stdout.isatty() else 100_000).print(table)
    sys.stdout.flush()
    forward.listed(["list", *(["--all"] if args.all else [])], False)
    return 0


def _inspect(args: argparse.Namespace) -> int:
    from mmt.records.registry import Registry
    from mmt.records.world import WorldChange
    from mmt.service.handle import job_facts
    from mmt.service.status import refresh

    registry = Registry()
    record = refresh(registry.require(args.name), registry)
    facts = job_facts(record)  # what the SDK's job.dict() returns
    if args.json:
        print(json.dumps(facts, indent=2))
        return 0
    for key in (
        "name",
        "status",
        "cluster",
        "machine",
        "topology",
        "scheduler_id",
        "scheduler_job",
        "created",
        "duration_s",
        "dir",
        "command",
        "overrides",
        "metric",
    ):
        print(f"{key:<13} {facts[key]}")
    print("machines      " + ", ".join(f"{m['rank']}: {m['status']}" for m in facts["machines"]))
    if not facts["dir_exists"]:
        from mmt.service.handle import JobDirGone

        print("files         " + str(JobDirGone(record)))
    if facts["scheduler"]:
        print("scheduler     " + facts["scheduler"])
    if facts["restarts"]:
        print(f"restarts      {facts['restarts']}")
    for run in facts["earlier_runs"]:
        took = "" if run["duration_s"] is None else f" after {run['duration_s']:.1f} s"
        print(f"run {run['restart']:<9} failed{took}: {run['error']}")
    for one in facts["requeues"]:
        print(f"requeued      run {one['restart']}: {one['why']}")
    for change in facts["world_changes"]:
        described = WorldChange.of(change)
        if described is not None:
            print(f"world {change['generation']:<7} {described.describe().split(': ', 1)[1]}")
    code = facts["snapshot"]
    if code is not None:
        commit = f"commit {code['commit']}" if code["commit"] else "no git"
        dirty = " + uncommitted changes (snapshot.diff)" if code["dirty"] else ""
        print(f"code          snapshot {code['id']} of {code['source']} ({commit}{dirty}) in {code['dir']}")
    result = record.result_record()
    if result is not None and result.error:
        print("error         " + result.error)
    return 0


def _logs(args: argparse.Namespace) -> int:
    """A rank's log, streamed: the last lines found by seeking back from the end, the rest read in bounded chunks,
    so that a many-GB log costs no more memory than a small one. As the console shows lines (no control sequences)
    unless --raw."""
    from mmt.sdk import Job
    from mmt.service import logs as log_files

    job = Job.get(args.name)
    path, start = job.log_start(args.rank, args.tail, args.role)
    if args.raw and not args.follow:
        if path.exists():
            for data in log_files.chunks(path, start):
                sys.stdout.buffer.write(data)
        return 0
    if args.follow:
        blocks = log_files.follow(path, start, lambda: job.status.final, sanitise=not args.raw, by_line=False)
    else:
        blocks = log_files.text_blocks(path, start, sanitise=True) if path.exists() else iter(())
    for block in blocks:
        sys.stdout.write(block)
        if args.follow:
            sys.stdout.flush()
    return 0


def _stop(args: argparse.Namespace) -> int:
    from mmt.records.registry import Registry
    from mmt.service.status import stop_named

    for line in stop_named(args.name, Registry()):
        print(line)
    return 0  # a stop that could not be asked raises NotCarriedOut: exit 1 (main)


def _wait(args: argparse.Namespace) -> int:
    from pathlib import Path

    from mmt.core.states import JobState
    from mmt.launching import engine
    from mmt.launching.report import format_summary
    from mmt.records.registry import Registry
    from mmt.service.status import reattach, refresh, summary_row
    from mmt.service.submit import exit_code

    registry = Registry()
    record = refresh(registry.require(args.name), registry)
    if JobState(record.state).final:  # ended already: its summary, and the exit status its run had
        row, metric_name = summary_row(record)
        print(format_summary(f"mmt summary ({record.sweep_dir})", [row], metric_name))
        return 0 if record.state == JobState.COMPLETED.value else 1
    backend, handles = reattach([record])
    try:
        report = engine.attach(
            handles,
            backend,
            engine.LaunchOptions(sweep_dir=Path(record.sweep_dir), registry=registry),
            timeout_s=args.timeout,
        )
    finally:
        backend.close()
    if report.detached and report.interrupted_by is None:
        print(f"mmt: {args.name} is still running after {args.timeout:g} s", file=sys.stderr)
        return 124
    if report.detached:
        return 130  # Ctrl-C: stopped waiting; the job runs on
    return exit_code(report)


def _delete(args: argparse.Namespace) -> int:
    from mmt.core.states import JobState
    from mmt.records import snapshot_use
    from mmt.records.registry import Registry
    from mmt.service.status import refresh

    registry = Registry()
    record = refresh(registry.require(args.name), registry)
    if not JobState(record.state).final:
        raise MMTError(f"{args.name} is {record.state}. HINT: mmt stop {args.name} first")
    registry.delete(args.name)
    removed = snapshot_use.forget(record.job_dir, record.job_id)
    print(f"mmt: {args.name} forgotten (its files stay in {record.job_dir})")
    if removed is not None:
        print(f"mmt: snapshot {removed} removed: no job runs from it any more")
    return 0


def _dashboard(argv: List[str]) -> int:
    from mmt.dashboard.server import main as dashboard
    from mmt.records.registry import Registry

    warned: List[str] = []

    def registered() -> List[Path]:  # the registry's recent jobs, beside the dirs given
        try:
            return [Path(r.job_dir) for r in Registry().list(since=time.time() - 7 * 86400)]
        except MMTError as exc:  # an unusable registry: the page still shows the dirs given
            if not warned:
                warned.append(str(exc))
                print(f"mmt dashboard: WARNING {exc}; showing the dirs given only", file=sys.stderr)
            return []

    return dashboard(argv, extra_job_dirs=registered)


def _where_it_lives(args: argparse.Namespace, argv: List[str]) -> Optional[int]:
    """A job launched over SSH (and unknown to the registry here): the command runs on its cluster
    (mmt.remote.forward); its exit status. None: the job is here."""
    from mmt.records.registry import Registry
    from mmt.remote import forward

    name = getattr(args, "name", None)
    if args.verb not in forward.NAMED or not name:
        return None
    try:
        if Registry().get(name) is not None:
            return None
    except MMTError:
        pass  # an unusable registry here: the verb says so, unless the job lives on a cluster
    return forward.named(args.verb, name, argv)


def main(argv: Optional[List[str]] = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["dashboard"]:
        return _dashboard(argv[1:])
    parser = _parser()
    args, extra = parser.parse_known_args(argv)
    if extra:
        print(_unknown_flag(parser, getattr(args, "verb", None), extra), file=sys.stderr)
        return 2
    if args.verb == "inspect":
        args.name = args.name or args.name_flag
        if not args.name:
            print("mmt inspect: which job? HINT: mmt inspect NAME (`mmt list` lists them)", file=sys.stderr)
            return 2
    verbs = {
        "run": _run,
        "list": _list,
        "inspect": _inspect,
        "logs": _logs,
        "stop": _stop,
        "wait": _wait,
        "delete": _delete,
    }
    from hydra.errors import HydraException

    from mmt.core.errors import ConfigError, NotCarriedOut

    try:
        _refuse_lightning_flags(args)
        there = _where_it_lives(args, argv)
        if there is not None:
            return there
        return verbs[args.verb](args)
    except NotCarriedOut as exc:  # accepted, and could not be done (a stop the cluster did not take)
        for line in exc.done:
            print(line)
        print(f"mmt: {exc}", file=sys.stderr)
        return 1
    except ConfigError as exc:  # a value a flag gave: named as the flag the user typed
        print(f"mmt: {_in_flag_terms(exc, args.verb)}", file=sys.stderr)
        return 2
    except (MMTError, HydraException, ValueError) as exc:
        print(f"mmt: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:  # `mmt logs NAME | head`
        return 0


if __name__ == "__main__":
    sys.exit(main())
