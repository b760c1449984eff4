"""The ``mmt`` command: its verbs and flags mirror ``lightning mmt`` / ``lightning job``.

    mmt run --name N --num-machines K --machine T4 --command "python train.py" [--image I] [-e KEY=VALUE ...]
            [--cluster local|slurm|<site>] [--detach] [--dry-run] [--dashboard]
    mmt list [--all] [--json]          mmt inspect NAME [--json]
    mmt logs NAME [-f] [--rank R] [--tail N]
    mmt stop NAME                      mmt wait NAME [--timeout S]
    mmt delete NAME                    mmt dashboard [DIR ...] [--port P]
"""

import argparse
import json
import sys
import time
from typing import Any, Dict, List, Optional

from mmt.core.errors import MMTError

# Lightning's flags that mean nothing here, and what to use instead (the SDK refuses the same parameters)
_LIGHTNING_FLAGS = ("studio", "teamspace", "org", "cloud", "interruptible", "image-credentials", "cloud-account-auth",
                    "entrypoint", "path-mapping", "tag", "keep-minutes")


def _env_pair(text: str) -> tuple:
    name, sep, value = text.partition("=")
    if not sep or not name:
        raise argparse.ArgumentTypeError(f"expected KEY=VALUE, got {text!r}")
    return name, value


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="mmt", description="Multi-machine training jobs: run, follow, stop.")
    verbs = parser.add_subparsers(dest="verb", required=True, metavar="VERB")

    run = verbs.add_parser("run", help="run a command on N machines (attached unless --detach)")
    run.add_argument("--name", help="the job's name (default: mmt-<Mon-DD-HH_MM>-<random>)")
    run.add_argument("--num-machines", type=int, default=1, help="nodes (Lightning's --num-machines)")
    run.add_argument("--machine", default="cpu", help="a machine type, Lightning's names in any case (T4, A100_X_8)")
    run.add_argument("--command", required=True, help="the shell command every node runs")
    run.add_argument("--image", help="a container image (cluster=slurm: pyxis or apptainer)")
    run.add_argument("-e", "--env", type=_env_pair, action="append", default=[], metavar="KEY=VALUE",
                     help="an environment variable for every process (repeatable); its value is never printed")
    run.add_argument("--env-from", action="append", default=[], metavar="NAME",
                     help="copy this variable from this shell's environment (secrets stay off the command line)")
    run.add_argument("--cluster", default="local", help="local | slurm | a site config in ./conf/cluster/")
    run.add_argument("--devices", type=int, help="processes per machine (default: its GPUs, 1 on CPU machines)")
    run.add_argument("--command-mode", default="per_node", choices=("per_node", "per_rank"),
                     help="the command starts its own ranks (per_node) or runs once per rank")
    run.add_argument("--max-runtime", type=float, metavar="SECONDS", help="stop the job after this long")
    run.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                     help="any Hydra override, e.g. --set hydra.launcher.partition=gpu (repeatable)")
    run.add_argument("--detach", action="store_true", help="submit and return at once")
    run.add_argument("--dry-run", action="store_true", help="print the plan, start nothing")
    run.add_argument("--dashboard", action="store_true", help="serve the live page while the job runs")
    run.add_argument("--json", action="store_true", help="print the submitted job as JSON (with --detach)")
    for flag in _LIGHTNING_FLAGS:
        run.add_argument(f"--{flag}", dest=f"lightning_{flag.replace('-', '_')}", help=argparse.SUPPRESS)

    listing = verbs.add_parser("list", help="jobs in the registry")
    listing.add_argument("--all", action="store_true", help="every job (default: the last 7 days and running ones)")
    listing.add_argument("--json", action="store_true")

    inspect = verbs.add_parser("inspect", help="one job in detail")
    inspect.add_argument("name")
    inspect.add_argument("--json", action="store_true")

    logs = verbs.add_parser("logs", help="a job's output")
    logs.add_argument("name")
    logs.add_argument("-f", "--follow", action="store_true", help="keep printing until the job ends")
    logs.add_argument("--rank", type=int, default=0, help="global rank (per-node command jobs: the machine)")
    logs.add_argument("--tail", type=int, help="only the last N lines")

    stop = verbs.add_parser("stop", help="stop a running job")
    stop.add_argument("name")

    wait = verbs.add_parser("wait", help="re-attach: follow a job until it ends; its exit status is the job's")
    wait.add_argument("name")
    wait.add_argument("--timeout", type=float, help="give up after this many seconds (exit 124)")

    delete = verbs.add_parser("delete", help="forget an ended job (its files stay)")
    delete.add_argument("name")
    delete.add_argument("-y", "--yes", action="store_true")

    dashboard = verbs.add_parser("dashboard", help="the live page", add_help=False)
    dashboard.add_argument("rest", nargs=argparse.REMAINDER)
    return parser


def _run(args: argparse.Namespace) -> int:
    from mmt import sdk
    from mmt.launching.engine import LaunchReport
    from mmt.service.submit import RunSpec, exit_code, run

    given = {flag: getattr(args, f"lightning_{flag.replace('-', '_')}") for flag in _LIGHTNING_FLAGS}
    for flag, value in given.items():
        if value is not None:
            hint = sdk.LIGHTNING_ONLY.get(flag.replace("-", "_").replace("path_mapping", "path_mappings")
                                          .replace("tag", "tags"), "it has no meaning outside Lightning AI")
            raise MMTError(f"--{flag} is a Lightning AI flag that mmt does not have. HINT: {hint}")
    spec = RunSpec(command=args.command, name=args.name, num_machines=args.num_machines, machine=args.machine,
                   image=args.image, env=dict(args.env), env_from=args.env_from, cluster=args.cluster,
                   devices=args.devices, command_mode=args.command_mode,
                   timeout_min=args.max_runtime / 60.0 if args.max_runtime is not None else None,
                   dry_run=args.dry_run, detach=args.detach,
                   overrides=args.overrides + (["hydra.launcher.dashboard=true"] if args.dashboard else []))
    outcome = run(spec)
    if isinstance(outcome, str):  # a dry run
        print(outcome)
        return 0
    if isinstance(outcome, LaunchReport):
        return exit_code(outcome)
    for item in outcome:
        facts = {"name": item.plan.name, "id": item.plan.job_id, "dir": item.plan.job_dir, "cluster": item.backend,
                 "scheduler_id": item.scheduler_id, "status": "Pending"}
        print(json.dumps(facts) if args.json else
              f"mmt: {facts['name']} submitted ({item.backend}{', SLURM job ' + item.scheduler_id if item.scheduler_id else ''}"
              f"): {facts['dir']}\n     follow it: mmt logs {facts['name']} -f | mmt wait {facts['name']}")
    return 0


def _rows(records: List[Any]) -> List[Dict[str, Any]]:
    from mmt.service.status import lightning_status

    rows = []
    for record in records:
        result = record.result_record()
        duration = result.duration_s if result else None
        if duration is None and record.started_at:
            duration = (record.ended_at or time.time()) - record.started_at
        rows.append({"name": record.name, "status": lightning_status(record.state), "state": record.state,
                     "cluster": record.backend, "machine": record.machine,
                     "topology": f"{record.num_nodes} x {record.devices}", "scheduler_id": record.scheduler_id,
                     "created": time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(record.created_at)),
                     "duration_s": round(duration, 1) if duration is not None else None, "dir": record.job_dir,
                     "metric": _metric(result), "detached": record.detached})
    return rows


def _metric(result: Any) -> Optional[str]:
    """``name=value`` of a completed job's result (a ResultRecord), else None."""
    from mmt.launching.report import metric_of

    if result is None or not result.completed:
        return None
    metric = metric_of(result.return_value, result.summary_metric)
    return None if metric["value"] == "-" else f"{metric['name']}={metric['value']}"


def _list(args: argparse.Namespace) -> int:
    from rich.console import Console
    from rich.table import Table

    from mmt.records.registry import Registry
    from mmt.service.status import refresh

    registry = Registry()
    records = [refresh(r, registry) for r in registry.list(since=None if args.all else time.time() - 7 * 86400)]
    rows = _rows(records)
    if args.json:
        print(json.dumps(rows, indent=2))
        return 0
    table = Table(box=None, header_style="bold")
    for column in ("NAME", "STATUS", "CLUSTER", "MACHINE", "NODES x DEV", "CREATED", "DURATION", "METRIC"):
        table.add_column(column)
    colours = {"Completed": "green", "Failed": "red", "Running": "cyan", "Stopped": "yellow"}
    for row in rows:
        status = row["status"]
        table.add_row(row["name"], f"[{colours.get(status, 'white')}]{status}[/]", row["cluster"], row["machine"],
                      row["topology"], row["created"], "-" if row["duration_s"] is None else f"{row['duration_s']} s",
                      row["metric"] or "-")
    Console(width=None if sys.stdout.isatty() else 250).print(table)
    return 0


def _inspect(args: argparse.Namespace) -> int:
    from mmt.records.registry import Registry
    from mmt.service.status import lightning_status, refresh

    registry = Registry()
    record = refresh(registry.require(args.name), registry)
    facts = {**_rows([record])[0], "job_id": record.job_id, "attempt": record.attempt, "command": record.command,
             "overrides": record.overrides, "sweep_dir": record.sweep_dir, "supervisor_pid": record.supervisor_pid,
             "result": record.result,
             "machines": [{"rank": n, "status": _node_status(record, n, lightning_status(record.state))}
                          for n in range(record.num_nodes)]}
    if args.json:
        print(json.dumps(facts, indent=2))
        return 0
    for key in ("name", "status", "cluster", "machine", "topology", "scheduler_id", "created", "duration_s", "dir",
                "command", "overrides", "metric"):
        print(f"{key:<13} {facts[key]}")
    print("machines      " + ", ".join(f"{m['rank']}: {m['status']}" for m in facts["machines"]))
    result = record.result_record()
    if result is not None and result.error:
        print("error         " + result.error)
    return 0


def _node_status(record: Any, node: int, job: str) -> str:
    result = record.result_record()
    failure = result.failure if result else None
    if job == "Failed" and failure is not None and failure.node_rank != node:
        return "Stopped"
    return job


def _logs(args: argparse.Namespace) -> int:
    from mmt.sdk import Job

    job = Job.get(args.name)
    if args.follow:
        for line in job.logs(rank=args.rank, follow=True):
            sys.stdout.write(line)
            sys.stdout.flush()
        return 0
    sys.stdout.write(job.logs(rank=args.rank, tail=args.tail))
    return 0


def _stop(args: argparse.Namespace) -> int:
    from mmt.records.registry import Registry
    from mmt.service.status import refresh, stop

    registry = Registry()
    print(stop(refresh(registry.require(args.name), registry)))
    return 0


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
        report = engine.attach(handles, backend, engine.LaunchOptions(sweep_dir=Path(record.sweep_dir),
                                                                      registry=registry), timeout_s=args.timeout)
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
    from mmt.records.registry import Registry
    from mmt.service.status import refresh

    registry = Registry()
    record = refresh(registry.require(args.name), registry)
    if not JobState(record.state).final:
        raise MMTError(f"{args.name} is {record.state}. HINT: mmt stop {args.name} first")
    registry.delete(args.name)
    print(f"mmt: {args.name} forgotten (its files stay in {record.job_dir})")
    return 0


def main(argv: Optional[List[str]] = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["dashboard"]:
        from pathlib import Path

        from mmt.dashboard.server import main as dashboard
        from mmt.records.registry import Registry

        def registered() -> List[Path]:  # the registry's recent jobs, beside the dirs given
            return [Path(r.job_dir) for r in Registry().list(since=time.time() - 7 * 86400)]

        return dashboard(argv[1:], extra_job_dirs=registered)
    args = _parser().parse_args(argv)
    verbs = {"run": _run, "list": _list, "inspect": _inspect, "logs": _logs, "stop": _stop, "wait": _wait,
             "delete": _delete}
    from hydra.errors import HydraException

    try:
        return verbs[args.verb](args)
    except (MMTError, HydraException, ValueError) as exc:
        print(f"mmt: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:  # `mmt logs NAME | head`
        return 0


if __name__ == "__main__":
    sys.exit(main())
