"""mmt.worker.job_run.run_job against Hydra's own run_job: the same job configs run by both, in this process, must
give the same JobReturn (task config, Hydra config, overrides, working dir, task name, status, value), the same
view to the task (its config, HydraConfig, cwd, env_set), the same callbacks, the same .hydra files, and leave
Hydra's state and the cwd as they were."""

import os
import pickle
from pathlib import Path
from typing import Any, Callable, Dict, List, Tuple

import pytest
from hydra.core.hydra_config import HydraConfig
from hydra.core.utils import JobRuntime
from hydra.core.utils import run_job as hydra_run_job
from hydra.types import HydraContext
from omegaconf import DictConfig, OmegaConf, open_dict

from helpers.config import compose_train
from mmt.worker.job_run import run_job as mmt_run_job


@pytest.fixture(autouse=True)
def version_base_1_3(monkeypatch):
    """train.py's version base (1.3: no chdir unless asked), for this test only."""
    from hydra.version import VersionBase
    from packaging.version import Version

    monkeypatch.setattr(VersionBase.instance(), "version_base", Version("1.3"))


class RecordingCallbacks:
    def __init__(self) -> None:
        self.calls: List[Tuple[str, Any]] = []

    def on_job_start(self, config: DictConfig, task_function: Any) -> None:
        self.calls.append(("start", OmegaConf.to_container(config, resolve=False)))

    def on_job_end(self, config: DictConfig, job_return: Any) -> None:
        self.calls.append(("end", (job_return.status, OmegaConf.to_container(job_return.cfg, resolve=False))))


def _job_config(tmp: Path, *overrides: str, **hydra_keys: Any) -> DictConfig:
    config = compose_train("recipe=probe", *overrides)
    with open_dict(config):
        config.hydra.sweep.dir = str(tmp / "sweep")
        config.hydra.sweep.subdir = "3"
        config.hydra.job.env_set = {"MMT_JOB_RUN_PROBE": "set"}
        config.hydra.output_subdir = None
        for key, value in hydra_keys.items():
            OmegaConf.update(config, f"hydra.{key}", value, force_add=True)
    return config


def _seen_by(task: Callable[[DictConfig], Any], seen: Dict[str, Any]) -> Callable[[DictConfig], Any]:
    def recorded(cfg: DictConfig) -> Any:
        seen["cfg"] = OmegaConf.to_container(cfg, resolve=True)
        seen["keys"] = list(cfg.keys())
        seen["flags"] = (OmegaConf.is_struct(cfg), OmegaConf.is_readonly(cfg))
        seen["hydra"] = OmegaConf.to_container(HydraConfig.get(), resolve=False)
        seen["job_name"] = HydraConfig.get().job.name
        seen["cwd"] = os.getcwd()
        seen["env"] = os.environ.get("MMT_JOB_RUN_PROBE")
        return task(cfg)

    return recorded


def _run(runner: Callable[..., Any], config: DictConfig, task: Callable[[DictConfig], Any]) -> Dict[str, Any]:
    seen: Dict[str, Any] = {}
    callbacks = RecordingCallbacks()
    cwd, hydra_cfg = os.getcwd(), HydraConfig.instance().cfg
    ret = runner(
        hydra_context=HydraContext(config_loader=None, callbacks=callbacks),  # type: ignore[arg-type]
        task_function=_seen_by(task, seen),
        config=config,
        job_dir_key="hydra.sweep.dir",
        job_subdir_key="hydra.sweep.subdir",
        configure_logging=False,
    )
    assert os.getcwd() == cwd and HydraConfig.instance().cfg is hydra_cfg  # left as they were
    value = ret._return_value
    return {
        "seen": seen,
        "callbacks": callbacks.calls,
        "cfg": (OmegaConf.to_container(ret.cfg, resolve=False), list(ret.cfg.keys())),
        "cfg_flags": (OmegaConf.is_struct(ret.cfg), OmegaConf.is_readonly(ret.cfg)),
        "hydra_cfg": OmegaConf.to_container(ret.hydra_cfg, resolve=False),
        "hydra_cfg_alone": ret.hydra_cfg.hydra._get_parent() is ret.hydra_cfg,
        "hydra_cfg_pickle": len(pickle.dumps(ret.hydra_cfg)),
        "overrides": ret.overrides,
        "working_dir": ret.working_dir,
        "task_name": ret.task_name,
        "status": ret.status,
        "value": repr(value) if isinstance(value, Exception) else value,
        "config_after": OmegaConf.to_container(config, resolve=False),
        "hydra_readonly_after": OmegaConf.is_readonly(config.hydra),
    }


def _both(tmp_path: Path, task: Callable[[DictConfig], Any], *overrides: str, **hydra_keys: Any) -> Tuple[Any, Any]:
    JobRuntime.instance().set("name", "train")
    theirs = _run(hydra_run_job, _job_config(tmp_path / "hydra", *overrides, **hydra_keys), task)
    ours = _run(mmt_run_job, _job_config(tmp_path / "mmt", *overrides, **hydra_keys), task)
    # no more than Hydra's copy travels back to the launcher (the dirs' names differ in length)
    assert ours.pop("hydra_cfg_pickle") <= theirs.pop("hydra_cfg_pickle") + 200
    # the same job in two dirs: the dirs are the only difference
    return repr(ours).replace(str(tmp_path / "mmt"), str(tmp_path / "hydra")), theirs, ours


def _same(tmp_path: Path, task: Callable[[DictConfig], Any], *overrides: str, **hydra_keys: Any) -> Dict[str, Any]:
    text, theirs, ours = _both(tmp_path, task, *overrides, **hydra_keys)
    assert text == repr(theirs)
    return ours


def test_a_job_returns_and_sees_what_hydra_s_run_job_gives(tmp_path):
    ours = _same(tmp_path, lambda cfg: {"metric": 1.5}, "+x=1", "+label='${recipe.backend}-${hydra:job.name}'")
    assert ours["value"] == {"metric": 1.5} and ours["seen"]["env"] == "set"
    assert ours["seen"]["cfg"]["label"] == "auto-train" and "hydra" not in ours["cfg"][0]
    assert ours["hydra_cfg_alone"] and ours["hydra_readonly_after"]
    assert [call for call, _ in ours["callbacks"]] == ["start", "end"]
    assert "MMT_JOB_RUN_PROBE" not in os.environ


def test_a_job_that_changes_dir_and_one_that_raises_are_hydra_s(tmp_path):
    ours = _same(tmp_path / "chdir", lambda cfg: os.getcwd(), "+x=2", **{"job.chdir": True})
    assert ours["working_dir"] == ours["value"] == str(tmp_path / "chdir" / "mmt" / "sweep" / "3")
    assert _same(tmp_path / "stay", lambda cfg: os.getcwd(), "+x=2")["value"] == os.getcwd()

    def broken(cfg: DictConfig) -> None:
        raise ValueError("the task's own error")

    ours = _same(tmp_path / "raises", broken, "+x=3")
    assert "the task's own error" in ours["value"] and ours["status"].name == "FAILED"


def test_the_hydra_dir_is_written_as_hydra_writes_it(tmp_path):
    _same(tmp_path, lambda cfg: None, "+x=4", output_subdir=".hydra")
    for name in ("config.yaml", "hydra.yaml", "overrides.yaml"):
        theirs = (tmp_path / "hydra" / "sweep" / "3" / ".hydra" / name).read_text()
        ours = (tmp_path / "mmt" / "sweep" / "3" / ".hydra" / name).read_text()
        assert ours == theirs.replace(str(tmp_path / "hydra"), str(tmp_path / "mmt")), name


@pytest.mark.parametrize("overrides", [("+x=5",), ("recipe.backend=gloo", "+nested.deep.key=1")])
def test_the_task_config_keeps_the_order_and_flags_of_hydra_s_copy(tmp_path, overrides):
    ours = _same(tmp_path, lambda cfg: None, *overrides)
    assert ours["cfg"][1] == [key for key in ours["config_after"] if key != "hydra"]
    assert ours["cfg_flags"] == ours["seen"]["flags"]
