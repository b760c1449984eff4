"""One process of a job (a rank, or a node's command): restore Hydra, run the job's task, report.

Runs inside the process the agent started, with the rank contract already in ``os.environ``. Every process runs
Hydra's ``run_job`` like Hydra's own launchers do (``mmt.worker.job_run``: the same, less its copies); the primary
one (rank 0 / node 0) writes the job's ``.hydra/`` (env values masked, owner-only), the job log and fires the job
callbacks; the others run the same task without log file or callbacks, so a job dir is written once however many
ranks it has. Each process leaves its records in the attempt dir (``mmt.core.jobdir``): an error record if it
raised, the primary's return value, and a done marker.

``python -m mmt.worker.main <attempt dir> <process index>`` starts one in a fresh interpreter (start_method=spawn).
"""

import copy
import json
import os
import sys
import traceback
from pathlib import Path
from typing import Any, Optional

from mmt.core import preemption, stacks, timeline
from mmt.core.jobdir import Attempt, write_atomic
from mmt.core.rank_env import MMT_CONTAINER_EXEC
from mmt.planning.plan import JobPlan
from mmt.records.payload import JobPayload, read_payload
from mmt.records.schema import ErrorRecord
from mmt.worker import guards
from mmt.worker.command import CommandFailedError, command_task

# exit code of a rank that stopped because its job was requeued: not a failure, not a success
REQUEUED_EXIT = 75


def _without_file_handlers(logging_cfg: Any) -> Any:
    """The job's logging config minus handlers that write files (only the primary writes the job log)."""
    if not isinstance(logging_cfg, dict) or not isinstance(logging_cfg.get("handlers"), dict):
        return logging_cfg
    file_handlers = {name for name, h in logging_cfg["handlers"].items() if isinstance(h, dict) and "filename" in h}
    logging_cfg["handlers"] = {k: v for k, v in logging_cfg["handlers"].items() if k not in file_handlers}
    sections = [logging_cfg.get("root")] + list((logging_cfg.get("loggers") or {}).values())
    for section in sections:
        if isinstance(section, dict) and isinstance(section.get("handlers"), list):
            section["handlers"] = [h for h in section["handlers"] if h not in file_handlers]
    return logging_cfg


def _process_config(config: Any, primary: bool) -> Optional[str]:
    """The config this process runs with, changed in place (it is this process's own, unpickled from the payload: a
    copy would cost every rank a copy of the whole config): Hydra writes no ``.hydra/`` (the primary writes it,
    masked), and only the primary logs to the job's log file. Returns the ``output_subdir`` it had."""
    from omegaconf import OmegaConf, open_dict, read_write

    subdir = OmegaConf.select(config, "hydra.output_subdir")
    with read_write(config.hydra), open_dict(config.hydra):
        config.hydra.output_subdir = None
        if not primary:
            logging_cfg = OmegaConf.to_container(config.hydra.job_logging, resolve=False)
            config.hydra.job_logging = _without_file_handlers(logging_cfg)
    return None if subdir is None else str(subdir)


def _write_hydra_dir(payload: JobPayload) -> None:
    """``<job dir>/<output_subdir>/{config,hydra,overrides}.yaml`` as Hydra writes them, with env values masked and
    readable by the owner only (they may hold what a secret was derived from). The text is ``OmegaConf.to_yaml``'s
    (its container, its YAML dumper), made from one plain copy of the config: rank 0 does this before its task
    starts, on every rank's critical path (a third of the time of a copy of the config per file)."""
    import yaml
    from omegaconf import OmegaConf
    from omegaconf._utils import get_omega_conf_dumper

    from mmt.planning.redact import masked_config

    config, plan = payload.config, payload.plan
    subdir = OmegaConf.select(config, "hydra.output_subdir")
    if subdir is None:
        return
    whole = OmegaConf.to_container(config, resolve=False, enum_to_str=True)
    assert isinstance(whole, dict)
    whole["hydra"]["runtime"]["output_dir"] = plan.job_dir
    whole = masked_config(whole, plan.secret_names)
    task = {k: v for k, v in whole.items() if k != "hydra"}
    files = {
        "config.yaml": task,
        "hydra.yaml": {"hydra": whole["hydra"]},
        "overrides.yaml": whole["hydra"]["overrides"]["task"],
    }
    target = Path(plan.job_dir) / str(subdir)
    for name, content in files.items():
        text = yaml.dump(
            content, default_flow_style=False, allow_unicode=True, sort_keys=False, Dumper=get_omega_conf_dumper()
        )
        write_atomic(target / name, text.encode(), private=True)


def restore_singletons(state: Any) -> None:
    """Hydra's ``Singleton.set_state``, less its eager rebuild of the plugin registry.

    Hydra leaves the registry out of the shipped state and rebuilds it in ``set_state``, re-executing every plugin
    module installed (a seventh of a short sweep job's CPU on SLURM). A job rarely needs it (a launcher, a sweeper,
    a config source for ``compose``), and ``Plugins.instance()`` builds it on first use; a registry the process
    has already is kept.
    """
    from hydra.core.plugins import Plugins
    from hydra.core.singleton import Singleton
    from omegaconf.basecontainer import BaseContainer

    present = Singleton._instances.get(Plugins)
    Singleton._instances = dict(state["instances"])
    if present is not None:
        Singleton._instances[Plugins] = present
    BaseContainer._resolvers = copy.deepcopy(state["omegaconf_resolvers"])


def _apply_thread_count() -> None:
    # libgomp reads OMP_NUM_THREADS when torch is first imported; a rank forked from a preloading agent
    # imported it before its environment existed, so apply the contract's value explicitly.
    torch = sys.modules.get("torch")
    threads = os.environ.get("OMP_NUM_THREADS", "")
    if torch is not None and threads.isdigit() and int(threads) > 0:
        torch.set_num_threads(int(threads))


def _close_process_group() -> None:
    # A gloo process group left open can abort the interpreter's exit ("terminate called without an active
    # exception", exit 134) after the rank has reported success; Lightning's Trainer leaves it open.
    dist = sys.modules.get("torch.distributed")
    if dist is not None and dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()


def _first_line(text: str) -> str:
    return next((line.strip() for line in text.splitlines() if line.strip()), "")


def error_record(exc: BaseException) -> ErrorRecord:
    """What a failed process reports: its root exception in one line, the traceback, a command's exit status."""
    root = exc
    while root.__cause__ is not None:  # name the original error, not a wrapper around it
        root = root.__cause__
    message = _first_line(str(root))
    exception = f"{type(root).__qualname__}: {message}" if message else type(root).__qualname__
    if isinstance(exc, CommandFailedError):  # the command's own status, which says more than the process's; mmt's
        # frames around a command that exited non-zero are no part of its story
        return ErrorRecord(exception=exception, traceback="", command=True, exit_code=exc.exit_code, signal=exc.signal)
    trace = "".join(traceback.format_exception(exc))
    return ErrorRecord(exception=exception, traceback=trace)


def report_error(attempt: Attempt, index: int, exc: BaseException) -> None:
    """``error.<index>.json``: process ``index`` failed with ``exc``."""
    error_record(exc).write(attempt.error_file(index))


def run(attempt: Attempt, index: int) -> int:
    """Run process ``index`` of the job whose payload is in ``attempt``; return the exit code."""
    os.environ[timeline.TIMELINE_VAR] = str(attempt.timeline)
    timeline.mark(timeline.RANK_START, process=index)
    try:
        payload = read_payload(attempt)
    except BaseException as exc:  # an unreadable payload must still be reported, not just crash
        report_error(attempt, index, exc)
        traceback.print_exc()
        return 1

    from hydra._internal.callbacks import Callbacks
    from hydra.core.utils import JobStatus, setup_globals
    from hydra.types import HydraContext

    from mmt.worker.job_run import run_job

    restore_singletons(payload.singleton_state)
    setup_globals()
    _apply_thread_count()
    plan = _own_plan(payload.plan, index)
    guards.install(plan)
    stacks.arm()  # where the job watches for hangs: this rank's stack, on request
    if os.environ.get(preemption.PREEMPTIBLE_VAR) == "1":
        preemption.install()

    primary = index == 0
    # run_job only uses the callbacks; the launcher's config loader is not shipped (it is large, and ranks never
    # compose); only the primary fires the job callbacks
    context = HydraContext(
        config_loader=None,  # type: ignore[arg-type]
        callbacks=payload.callbacks if primary else Callbacks(),
    )
    if primary:
        _write_hydra_dir(payload)
    container = json.loads(os.environ.get(MMT_CONTAINER_EXEC) or "[]")
    task = _marked(payload.task_function if plan.command is None else command_task(plan.command, container), index)
    output_subdir = _process_config(payload.config, primary)
    ret = run_job(
        hydra_context=context,
        task_function=task,
        config=payload.config,
        job_dir_key="hydra.sweep.dir",
        job_subdir_key="hydra.sweep.subdir",
    )
    failed = ret.status != JobStatus.COMPLETED
    if failed and isinstance(ret._return_value, preemption.Requeued):
        print(f"mmt: {ret._return_value}", flush=True)
        return REQUEUED_EXIT  # the job runs again in place; this attempt reports nothing
    if failed:
        error = ret._return_value
        told = f"mmt: {error}\n" if isinstance(error, CommandFailedError) else traceback.format_exception(error)
        print("".join(told), file=sys.stderr, end="")
        report_error(attempt, index, error)
        ret.return_value = None  # the exception travels as text: it may not be picklable
    if primary:
        _restore_output_subdir(ret, output_subdir)
        _write_return(attempt, ret)
    if not failed:  # after a failure a collective may still be pending: never block on it
        _close_process_group()
    code = 1 if failed else 0
    sys.stdout.flush()
    sys.stderr.flush()
    attempt.write_done(index, code)
    return code


def _own_plan(plan: JobPlan, index: int) -> JobPlan:
    """What process ``index`` runs: the job's plan, or in a job with roles its role's (its command, its world)."""
    role = plan.role_at(index) if plan.roles else None
    return plan if role is None else plan.for_role(role)


def _marked(task: Any, index: int) -> Any:
    """The task, marking on the job's timeline when the user's code begins (after Hydra's job setup)."""

    def marked(config: Any) -> Any:
        timeline.mark(timeline.USER_CODE, process=index)
        return task(config)

    return marked


def _restore_output_subdir(ret: Any, output_subdir: Optional[str]) -> None:
    """The JobReturn says where ``.hydra/`` is, as Hydra's own launchers' do (this process wrote it itself)."""
    from omegaconf import open_dict, read_write

    if ret.hydra_cfg is not None:
        with read_write(ret.hydra_cfg.hydra), open_dict(ret.hydra_cfg.hydra):
            ret.hydra_cfg.hydra.output_subdir = output_subdir


def _write_return(attempt: Attempt, ret: Any) -> None:
    from mmt.records import job_return  # cloudpickle: in the primary only, at its end

    write_atomic(attempt.primary_return, job_return.dumps(ret), private=True)


def main(argv: Optional[list] = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    attempt, index = Attempt(Path(args[0])), int(args[1])
    try:
        return run(attempt, index)
    except Exception as exc:  # noqa: BLE001 - mmt's own failure around the task: reported like the task's, not hidden
        traceback.print_exc()
        report_error(attempt, index, exc)
        return 1


if __name__ == "__main__":
    sys.exit(main())
