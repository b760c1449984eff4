"""One process of a job (a rank, or a node in per-node command mode): restore Hydra, run the job, report.

Runs inside the process the backend started, with the rank contract already in ``os.environ``. The primary
process (rank 0 / node 0) runs Hydra's ``run_job`` exactly like Hydra's own launchers: it writes ``.hydra/``,
the job log and fires the job callbacks. The others run the same task with ``output_subdir=null``, no log file
and no callbacks, so a job dir is written once however many ranks it has; their output is their rank log.

``python -m hydra_plugins.mmt_launcher._worker <payload dir> <process index>`` starts one in a fresh interpreter.
"""

import copy
import json
import os
import sys
import traceback
from pathlib import Path
from typing import Any, Optional

from . import _payload
from ._command import command_task


def _secondary_config(config: Any) -> Any:
    from omegaconf import OmegaConf, open_dict, read_write

    config = copy.deepcopy(config)
    with read_write(config.hydra), open_dict(config.hydra):
        config.hydra.output_subdir = None
        logging_cfg = OmegaConf.to_container(config.hydra.job_logging, resolve=False)
        config.hydra.job_logging = _without_file_handlers(logging_cfg)
    return config


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


def _error_record(exc: BaseException) -> dict:
    root = exc
    while root.__cause__ is not None:  # name the original error, not a wrapper around it
        root = root.__cause__
    return {
        "exception": f"{type(root).__qualname__}: {root}",
        "traceback": "".join(traceback.format_exception(exc)),
    }


def run(directory: Path, index: int) -> int:
    """Run process ``index`` of the job whose payload is in ``directory``; return the exit code."""
    try:
        payload = _payload.read_payload(directory)
    except BaseException as exc:  # an unreadable payload must still be reported, not just crash
        _payload.write_atomic(_payload.error_path(directory, index), json.dumps(_error_record(exc)).encode())
        traceback.print_exc()
        return 1

    from hydra.core.singleton import Singleton
    from hydra.core.utils import JobStatus, run_job, setup_globals
    from hydra.types import HydraContext

    Singleton.set_state(payload.singleton_state)
    setup_globals()
    _apply_thread_count()

    primary = index == 0
    config = payload.config if primary else _secondary_config(payload.config)
    context = payload.hydra_context
    if not primary:
        from hydra._internal.callbacks import Callbacks

        context = HydraContext(config_loader=context.config_loader, callbacks=Callbacks())
    task = payload.task_function if payload.command is None else command_task(payload.command)

    ret = run_job(
        hydra_context=context,
        task_function=task,
        config=config,
        job_dir_key="hydra.sweep.dir",
        job_subdir_key="hydra.sweep.subdir",
    )
    failed = ret.status != JobStatus.COMPLETED
    if failed:
        error = ret._return_value
        print("".join(traceback.format_exception(error)), file=sys.stderr, end="")
        _payload.write_atomic(_payload.error_path(directory, index), json.dumps(_error_record(error)).encode())
        ret.return_value = None  # the exception travels as text: it may not be picklable
    if primary:
        _write_return(directory, ret)
    if not failed:  # after a failure a collective may still be pending: never block on it
        _close_process_group()
    code = 1 if failed else 0
    sys.stdout.flush()
    sys.stderr.flush()
    _payload.write_atomic(_payload.done_path(directory, index), str(code).encode())
    return code


def _write_return(directory: Path, ret: Any) -> None:
    import cloudpickle

    try:
        data = cloudpickle.dumps(ret)
    except Exception as exc:  # an unpicklable return value: keep its text rather than lose the job
        ret.return_value = f"<unpicklable {type(ret._return_value).__name__}: {exc}> {ret._return_value!r}"
        data = cloudpickle.dumps(ret)
    _payload.write_atomic(_payload.return_path(directory), data)


def main(argv: Optional[list] = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    return run(Path(args[0]), int(args[1]))


if __name__ == "__main__":
    sys.exit(main())
