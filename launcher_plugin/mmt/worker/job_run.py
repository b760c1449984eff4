"""Hydra's ``run_job`` for a job's process, without the copies it makes of a config this process owns.

``hydra.core.utils.run_job`` sets Hydra's config twice (each a deep copy of the ``hydra`` node), copies the whole
config to drop ``hydra`` from the task's copy, and copies Hydra's config again for the return value: 18 ms of a
rank's start, paid again by each batch of a sweeper that sends one job at a time. A job's process owns its config
(unpickled from the payload) and its output dir is already a literal (the launcher froze it), so here Hydra's config
is set once, the task's copy is made without the ``hydra`` node, and the return value takes Hydra's config as set
(nothing else holds it once the job ends). Everything else is Hydra's, step for step; ``tests/unit/test_job_run.py``
holds the two to the same results.
"""

import copy
import os
from pathlib import Path
from textwrap import dedent
from typing import Optional

from hydra import version
from hydra._internal.deprecation_warning import deprecation_warning
from hydra.core.hydra_config import HydraConfig
from hydra.core.utils import (
    JobReturn,
    JobRuntime,
    JobStatus,
    _flush_loggers,
    _save_config,
    configure_log,
    env_override,
)
from hydra.types import HydraContext, TaskFunction
from omegaconf import DictConfig, OmegaConf, open_dict, read_write

_CHDIR_URL = "https://hydra.cc/docs/1.2/upgrades/1.1_to_1.2/changes_to_job_working_dir/"


def run_job(
    task_function: TaskFunction,
    config: DictConfig,
    job_dir_key: str,
    job_subdir_key: Optional[str],
    hydra_context: HydraContext,
    configure_logging: bool = True,
) -> JobReturn:
    """``hydra.core.utils.run_job``'s contract; ``config`` is this process's own and is changed as Hydra's is."""
    callbacks = hydra_context.callbacks
    old_cwd = os.getcwd()
    hydra_config = HydraConfig.instance()
    orig_hydra_cfg = hydra_config.cfg
    output_dir = _output_dir(config, job_dir_key, job_subdir_key)
    with read_write(config.hydra.runtime), open_dict(config.hydra.runtime):
        config.hydra.runtime.output_dir = os.path.abspath(output_dir)
    hydra_config.set_config(config)
    _chdir = None
    ret = JobReturn()
    try:
        task_cfg = _without_hydra(config)
        ret.cfg = task_cfg
        hydra_cfg = hydra_config.cfg
        assert isinstance(hydra_cfg, DictConfig)
        ret.hydra_cfg = hydra_cfg
        overrides = OmegaConf.to_container(config.hydra.overrides.task)
        assert isinstance(overrides, list)
        ret.overrides = overrides
        Path(str(output_dir)).mkdir(parents=True, exist_ok=True)
        _chdir = _job_chdir(hydra_cfg)
        if _chdir:
            os.chdir(output_dir)
            ret.working_dir = output_dir
        else:
            ret.working_dir = os.getcwd()
        if configure_logging:
            configure_log(config.hydra.job_logging, config.hydra.verbose)
        if config.hydra.output_subdir is not None:
            hydra_output = Path(config.hydra.runtime.output_dir) / Path(config.hydra.output_subdir)
            _save_config(task_cfg, "config.yaml", hydra_output)
            _save_config(hydra_cfg, "hydra.yaml", hydra_output)
            _save_config(config.hydra.overrides.task, "overrides.yaml", hydra_output)
        with env_override(hydra_cfg.hydra.job.env_set):
            callbacks.on_job_start(config=config, task_function=task_function)
            try:
                ret.return_value = task_function(task_cfg)
                ret.status = JobStatus.COMPLETED
            except Exception as e:
                ret.return_value = e
                ret.status = JobStatus.FAILED
        ret.task_name = JobRuntime.instance().get("name")
        _flush_loggers()
        callbacks.on_job_end(config=config, job_return=ret)
        return ret
    finally:
        hydra_config.cfg = orig_hydra_cfg
        # as Hydra's copy has it: its hydra node under the returned config, not under the job's whole config (which
        # its pickle would otherwise carry back to the launcher)
        if isinstance(ret.hydra_cfg, DictConfig):
            ret.hydra_cfg.hydra._set_parent(ret.hydra_cfg)
        if _chdir:
            os.chdir(old_cwd)


def _output_dir(config: DictConfig, job_dir_key: str, job_subdir_key: Optional[str]) -> str:
    output_dir = str(OmegaConf.select(config, job_dir_key))
    if job_subdir_key is not None:
        output_dir = os.path.join(output_dir, str(OmegaConf.select(config, job_subdir_key)))
    return output_dir


def _without_hydra(config: DictConfig) -> DictConfig:
    """``copy.deepcopy(config)`` less its ``hydra`` key, without copying that node (most of the config): the copy is
    made while the root's content is, for a moment, the same content in the same order less ``hydra``."""
    content = config.__dict__["_content"]
    config.__dict__["_content"] = {key: node for key, node in content.items() if key != "hydra"}
    try:
        task_cfg = copy.deepcopy(config)
    finally:
        config.__dict__["_content"] = content
    return task_cfg


def _job_chdir(hydra_cfg: DictConfig) -> bool:
    chdir = hydra_cfg.hydra.job.chdir
    if chdir is None and version.base_at_least("1.2"):
        chdir = False
    if chdir is None:
        deprecation_warning(
            message=dedent(
                f"""\
                Future Hydra versions will no longer change working directory at job runtime by default.
                See {_CHDIR_URL} for more information."""
            ),
            stacklevel=3,
        )
        chdir = True
    return bool(chdir)
