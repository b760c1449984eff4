"""Issue 36, in one process: ``mmt run`` (the CLI's main, called in this process) composes its job without touching
the calling process's Hydra, whether it plans the job or refuses it, and ``mmt.service.compose.kept_hydra_state``
puts the caller's Hydra back when its block raises. The SDK inside a real ``@hydra.main`` app, and from a plain
script, is tests/e2e/test_sdk_inside_hydra_app.py."""

from pathlib import Path
from typing import Any, Dict, Iterator

import pytest

from mmt.cli.main import main

APP_YAML = "lr: 0.1\njob_name: ${hydra:job.name}\n"


def _app_singletons() -> tuple:
    from hydra.core.global_hydra import GlobalHydra
    from hydra.core.hydra_config import HydraConfig
    from hydra.core.utils import JobRuntime
    from hydra.version import VersionBase

    return (GlobalHydra, HydraConfig, JobRuntime, VersionBase)


@pytest.fixture
def no_hydra(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """This process as a plain script's: no Hydra app state (this test's own, put back after it), a registry and
    a cwd of its own."""
    from hydra.core.singleton import Singleton

    held = {cls: Singleton._instances.pop(cls) for cls in _app_singletons() if cls in Singleton._instances}
    monkeypatch.setenv("MMT_HOME", str(tmp_path / "home"))
    (tmp_path / "work").mkdir()
    monkeypatch.chdir(tmp_path / "work")
    yield
    for cls in _app_singletons():
        Singleton._instances.pop(cls, None)
    Singleton._instances.update(held)


@pytest.fixture
def app_hydra(tmp_path: Path, no_hydra: None) -> Any:
    """This process as a running Hydra app's: GlobalHydra initialized with the app's config dir (version base 1.2,
    job name "app"), HydraConfig its composed config."""
    from hydra import compose, initialize_config_dir
    from hydra.core.hydra_config import HydraConfig

    conf = tmp_path / "appconf"
    conf.mkdir()
    (conf / "app.yaml").write_text(APP_YAML)
    initialize_config_dir(config_dir=str(conf), version_base="1.2", job_name="app")
    cfg = compose(config_name="app", overrides=["lr=0.5"], return_hydra_config=True)
    HydraConfig.instance().set_config(cfg)
    return cfg


def _held() -> Dict[str, Any]:
    from hydra.core.global_hydra import GlobalHydra
    from hydra.core.hydra_config import HydraConfig
    from hydra.core.singleton import Singleton
    from omegaconf.basecontainer import BaseContainer

    return {
        "hydra_config": HydraConfig.instance().cfg,
        "loader": GlobalHydra.instance().config_loader(),
        "singletons": dict(Singleton._instances),
        "resolvers": dict(BaseContainer._resolvers),
    }


def _assert_the_apps(held: Dict[str, Any]) -> None:
    from hydra import compose
    from hydra.core.global_hydra import GlobalHydra
    from hydra.core.hydra_config import HydraConfig
    from hydra.core.singleton import Singleton
    from hydra.core.utils import JobRuntime
    from hydra.version import VersionBase
    from omegaconf.basecontainer import BaseContainer

    assert HydraConfig.instance().cfg is held["hydra_config"]
    assert HydraConfig.get().job.name == "app" and list(HydraConfig.get().overrides.task) == ["lr=0.5"]
    assert GlobalHydra.instance().is_initialized() and GlobalHydra.instance().config_loader() is held["loader"]
    assert [c.__name__ for c, o in held["singletons"].items() if Singleton._instances.get(c) is not o] == []
    assert [k for k, f in held["resolvers"].items() if BaseContainer._resolvers.get(k) is not f] == []
    assert JobRuntime.instance().get("name") == "app" and str(VersionBase.instance().getbase()) == "1.2"
    again = compose(config_name="app", overrides=["lr=0.7"], return_hydra_config=True)
    assert again.lr == 0.7 and again.job_name == "app" and again.hydra.job.name == "app"


def test_mmt_run_inside_a_hydra_app_leaves_its_hydra_state(app_hydra: Any, capsys: pytest.CaptureFixture) -> None:
    held = _held()
    assert main(["run", "--name", "in-app", "--command", "echo hi", "--num-machines", "2", "--dry-run"]) == 0
    assert "echo hi" in capsys.readouterr().out
    _assert_the_apps(held)


@pytest.mark.parametrize(
    "argv, said",
    [
        (["--num-machines", "0"], "Invalid --num-machines 0"),  # refused once composed, by the planner
        (["--machine", "a100x8"], "Invalid --machine a100x8: there is no such machine"),  # refused by composing
    ],
)
def test_a_refused_mmt_run_inside_a_hydra_app_leaves_its_hydra_state(
    app_hydra: Any, capsys: pytest.CaptureFixture, argv: list, said: str
) -> None:
    held = _held()
    assert main(["run", "--command", "true", *argv, "--dry-run"]) == 2
    assert said in capsys.readouterr().err
    _assert_the_apps(held)


def test_a_block_that_raises_after_composing_leaves_the_callers_hydra_state(app_hydra: Any) -> None:
    from hydra.core.global_hydra import GlobalHydra
    from hydra.core.hydra_config import HydraConfig

    from mmt.service import compose

    held = _held()
    with pytest.raises(RuntimeError, match="after composing"):
        with compose.composed(["command=true", "hydra.launcher.name=raises"]) as (context, master):
            # inside, Hydra's state is the job's
            assert HydraConfig.get().job.name == "mmt" and master.hydra.launcher.name == "raises"
            assert GlobalHydra.instance().config_loader() is context.config_loader is not held["loader"]
            raise RuntimeError("after composing")
    _assert_the_apps(held)


def test_mmt_run_without_hydra_leaves_hydra_uninitialized(no_hydra: None, capsys: pytest.CaptureFixture) -> None:
    from hydra.core.global_hydra import GlobalHydra
    from hydra.core.hydra_config import HydraConfig

    for _ in range(2):  # and a second run in the same process composes as the first did
        assert main(["run", "--name", "plain", "--command", "echo hi", "--dry-run"]) == 0
        assert "echo hi" in capsys.readouterr().out
        assert not GlobalHydra.instance().is_initialized() and not HydraConfig.initialized()
