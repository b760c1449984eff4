"""Hydra's own launcher conformance suites, run against mmt's local backend (1 node x 1 process per job)."""

from hydra.core.plugins import Plugins
from hydra.plugins.launcher import Launcher
from hydra.test_utils.launcher_common_tests import (
    BatchedSweeperTestSuite,
    IntegrationTestSuite,
    LauncherTestSuite,
)
from pytest import mark

from hydra_plugins.mmt_launcher.mmt_launcher import MMTLocalLauncher


def test_discovery() -> None:
    # Hydra 1.3 re-executes plugin modules while scanning, so compare names, as Hydra's own plugin tests do
    assert MMTLocalLauncher.__name__ in [cls.__name__ for cls in Plugins.instance().discover(Launcher)]


@mark.parametrize("launcher_name, overrides", [("mmt_local", [])])
class TestMMTLocalLauncher(LauncherTestSuite):
    pass


@mark.parametrize(
    "launcher_name, overrides",
    [("mmt_local", ["hydra/sweeper=basic", "hydra.sweeper.max_batch_size=2"])],
)
class TestMMTLocalBatchedSweeper(BatchedSweeperTestSuite):
    pass


@mark.parametrize(
    "task_launcher_cfg, extra_flags",
    [({}, ["-m", "hydra/launcher=mmt_local", "hydra/hydra_logging=disabled", "hydra/job_logging=disabled"])],
)
class TestMMTLocalIntegration(IntegrationTestSuite):
    pass
