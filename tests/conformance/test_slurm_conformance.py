"""Hydra's own launcher conformance suites, with every job submitted to the project's two-node SLURM test cluster
(1 node x 1 task per job)."""

import pytest
from hydra.test_utils.launcher_common_tests import (
    BatchedSweeperTestSuite,
    IntegrationTestSuite,
    LauncherTestSuite,
)

pytestmark = pytest.mark.slurm


@pytest.fixture(autouse=True)
def _cluster(slurm_cluster):
    yield


@pytest.mark.parametrize("launcher_name, overrides", [("mmt_slurm", ["hydra.launcher.poll_interval_s=0.3"])])
class TestSlurmLauncherConformance(LauncherTestSuite):
    pass


@pytest.mark.parametrize(
    "launcher_name, overrides",
    [("mmt_slurm", ["hydra/sweeper=basic", "hydra.sweeper.max_batch_size=2", "hydra.launcher.poll_interval_s=0.3"])],
)
class TestSlurmBatchedSweeperConformance(BatchedSweeperTestSuite):
    pass


@pytest.mark.parametrize(
    "task_launcher_cfg, extra_flags",
    [
        (
            {},
            [
                "-m",
                "hydra/launcher=mmt_slurm",
                "hydra/hydra_logging=disabled",
                "hydra/job_logging=disabled",
                "hydra.launcher.poll_interval_s=0.3",
            ],
        )
    ],
)
class TestSlurmIntegrationConformance(IntegrationTestSuite):
    pass
