"""Issue 36: the SDK composes without touching the caller's Hydra. ``Job.run`` called inside a running ``@hydra.main``
app (a real app, written to a tmp dir and run with the venv's python) leaves the app's Hydra state as it was: its
``HydraConfig`` (job name, run dir, overrides, the config's ``${hydra:...}`` values), ``GlobalHydra`` initialized
with the app's own config loader, the job name and version base Hydra keeps, its resolvers; and the app can still
compose after it. So does a call that raises. A plain script (no Hydra) calling it leaves Hydra uninitialized."""

import json
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any, Dict

import pytest

from helpers.app import app_env

PY = sys.executable

APP_YAML = """\
lr: 0.1
mode: submit
name: mmt-sdk-app-job
job_name: ${hydra:job.name}
output_dir: ${hydra:runtime.output_dir}
"""

# the app records its Hydra state before and after each SDK call, and whether every object Hydra keeps globally is
# still the very one it had (HydraConfig's config, GlobalHydra's config loader, every singleton, every resolver)
APP_PY = """\
import json

import hydra
from hydra.core.global_hydra import GlobalHydra
from hydra.core.hydra_config import HydraConfig
from hydra.core.singleton import Singleton
from hydra.core.utils import JobRuntime
from hydra.version import VersionBase
from omegaconf import OmegaConf
from omegaconf.basecontainer import BaseContainer


def shown(read):
    try:
        return read()
    except Exception as exc:  # what the app could not read is part of its state: the test shows it
        return f"<{type(exc).__name__}: {exc}>"


def state(cfg):
    return {
        "job_name": shown(lambda: HydraConfig.get().job.name),
        "run_dir": shown(lambda: HydraConfig.get().run.dir),
        "output_dir": shown(lambda: HydraConfig.get().runtime.output_dir),
        "overrides": shown(lambda: list(HydraConfig.get().overrides.task)),
        "hydra": shown(lambda: OmegaConf.to_yaml(HydraConfig.get())),
        "cfg": shown(lambda: OmegaConf.to_container(cfg, resolve=True)),
        "initialized": GlobalHydra.instance().is_initialized(),
        "runtime_name": shown(lambda: JobRuntime.instance().get("name")),
        "version_base": str(VersionBase.instance().getbase()),
    }


def objects():
    return {
        "hydra_config": HydraConfig.instance().cfg,
        "loader": GlobalHydra.instance().config_loader() if GlobalHydra.instance().is_initialized() else None,
        "singletons": dict(Singleton._instances),
        "resolvers": dict(BaseContainer._resolvers),
    }


def same_objects(before):
    now = objects()
    return {
        "hydra_config": now["hydra_config"] is before["hydra_config"],
        "loader": before["loader"] is not None and now["loader"] is before["loader"],
        "singletons": [c.__name__ for c, o in before["singletons"].items() if now["singletons"].get(c) is not o],
        "resolvers": [k for k, f in before["resolvers"].items() if now["resolvers"].get(k) is not f],
    }


def composes():
    def compose():
        composed = hydra.compose(config_name="app", overrides=["lr=0.7"], return_hydra_config=True)
        return {"lr": composed.lr, "job_name": composed.hydra.job.name}

    return shown(compose)


@hydra.main(version_base="1.2", config_path="conf", config_name="app")
def main(cfg):
    from mmt import Job
    from mmt.core.errors import ConfigError

    before, held = state(cfg), objects()
    calls = []
    if cfg.mode == "submit":
        jobs = []
        for suffix in ("a", "b"):  # a second call works as the first did
            jobs.append(Job.run(command="echo hi from " + suffix, name=cfg.name + "-" + suffix))
            calls.append({"after": state(cfg), "same_objects": same_objects(held), "composes": composes()})
        statuses = [job.wait(timeout=120).value for job in jobs]
        logs = [job.logs() for job in jobs]
        print("JOBS " + json.dumps({"statuses": statuses, "logs": logs, "dirs": [str(j.dir) for j in jobs]}))
    else:
        bad = {"num_machines": {"num_machines": 0}, "machine": {"machine": "a100x8"}}[cfg.mode]
        try:
            Job.run(command="echo never", name=cfg.name, **bad)
        except ConfigError as exc:
            error = str(exc)
        else:
            error = None
        calls.append({"after": state(cfg), "same_objects": same_objects(held), "composes": composes(), "error": error})
    print("STATE " + json.dumps({"before": before, "calls": calls}))


if __name__ == "__main__":
    main()
"""

PLAIN_PY = """\
import json, sys

from hydra.core.global_hydra import GlobalHydra
from hydra.core.hydra_config import HydraConfig

from mmt import Job


def hydra_state():
    return {"initialized": GlobalHydra.instance().is_initialized(), "config_set": HydraConfig.initialized()}


seen = [hydra_state()]
jobs = []
for suffix in ("a", "b"):
    jobs.append(Job.run(command="echo plain " + suffix, name=sys.argv[1] + "-" + suffix))
    seen.append(hydra_state())
statuses = [job.wait(timeout=120).value for job in jobs]
print("STATE " + json.dumps({"seen": seen, "statuses": statuses, "logs": [job.logs() for job in jobs]}))
"""


def _write_app(where: Path) -> Path:
    (where / "conf").mkdir(parents=True)
    (where / "conf" / "app.yaml").write_text(APP_YAML)
    (where / "app.py").write_text(APP_PY)
    return where


def _line(stdout: str, prefix: str) -> Dict[str, Any]:
    found = [line[len(prefix) :] for line in stdout.splitlines() if line.startswith(prefix)]
    assert found, f"no {prefix!r} line in:\n{stdout[-3000:]}"
    return json.loads(found[-1])


def _run_app(tmp_path: Path, tag: str, *overrides: str) -> subprocess.CompletedProcess:
    app = _write_app(tmp_path / "app")
    done = subprocess.run(
        [PY, str(app / "app.py"), *overrides, f"hydra.run.dir={tmp_path / 'run'}"],
        cwd=app,
        env=app_env(tag, MMT_HOME=str(tmp_path / "home")),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-4000:]
    return done


def _assert_hydra_unchanged(tmp_path: Path, before: Dict[str, Any], call: Dict[str, Any], overrides: list) -> None:
    # the app's state as it was before the call: what HydraConfig.get() says, and what ${hydra:...} resolves to
    assert before["job_name"] == "app" and before["run_dir"] == str(tmp_path / "run")
    assert before["overrides"] == overrides
    assert before["cfg"]["job_name"] == "app" and before["cfg"]["output_dir"] == str(tmp_path / "run")
    assert before["initialized"] and before["runtime_name"] == "app" and before["version_base"] == "1.2"
    assert call["after"] == before
    # the same objects, not copies: HydraConfig's config, GlobalHydra's config loader, every singleton and resolver
    assert call["same_objects"] == {"hydra_config": True, "loader": True, "singletons": [], "resolvers": []}
    # and the app composes its own config after the call, with its own job name
    assert call["composes"] == {"lr": 0.7, "job_name": "app"}


def test_job_run_inside_a_hydra_app_leaves_its_hydra_state_as_it_was(tmp_path, tag):
    name = f"sdk-in-app-{uuid.uuid4().hex[:8]}"
    done = _run_app(tmp_path, tag, "mode=submit", "lr=0.5", f"name={name}")
    state = _line(done.stdout, "STATE ")
    assert len(state["calls"]) == 2
    for call in state["calls"]:
        _assert_hydra_unchanged(tmp_path, state["before"], call, ["mode=submit", "lr=0.5", f"name={name}"])
    # the SDK's jobs ran as they do from a plain script: their own composed config, their own dirs
    jobs = _line(done.stdout, "JOBS ")
    assert jobs["statuses"] == ["Completed", "Completed"]
    assert jobs["logs"] == ["hi from a\n", "hi from b\n"]
    assert jobs["dirs"] == [str(tmp_path / "app" / "outputs" / "mmt" / f"{name}-{s}" / "0") for s in ("a", "b")]


@pytest.mark.parametrize(
    "mode, said",
    [
        ("num_machines", "Invalid num_machines=0"),  # refused by the planner, once composed
        ("machine", "Invalid machine='a100x8': there is no such machine"),  # refused by composing itself
    ],
)
def test_a_job_run_that_raises_inside_a_hydra_app_leaves_its_hydra_state_as_it_was(tmp_path, tag, mode, said):
    done = _run_app(tmp_path, tag, f"mode={mode}")
    state = _line(done.stdout, "STATE ")
    (call,) = state["calls"]
    assert call["error"] is not None and call["error"].startswith(said), call["error"]
    _assert_hydra_unchanged(tmp_path, state["before"], call, [f"mode={mode}"])


def test_job_run_from_a_plain_script_leaves_hydra_uninitialized(tmp_path, tag):
    (tmp_path / "plain.py").write_text(PLAIN_PY)
    name = f"sdk-plain-{uuid.uuid4().hex[:8]}"
    done = subprocess.run(
        [PY, str(tmp_path / "plain.py"), name],
        cwd=tmp_path,
        env=app_env(tag, MMT_HOME=str(tmp_path / "home")),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-4000:]
    state = _line(done.stdout, "STATE ")
    assert state["seen"] == [{"initialized": False, "config_set": False}] * 3
    assert state["statuses"] == ["Completed", "Completed"]
    assert state["logs"] == ["plain a\n", "plain b\n"]
