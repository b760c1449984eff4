"""A small job plan for tests that need one without planning it from a config: 2 nodes x 2, no machine, a minute."""

from typing import Any

from mmt.planning.machine import UNSPECIFIED_MACHINE
from mmt.planning.plan import JobPlan


def local_plan(**fields: Any) -> JobPlan:
    """Job 0 of a local sweep; ``fields`` replace any of the plan's."""
    values: dict = dict(
        num=0,
        name="job-0",
        job_id="local-1-0",
        overrides=(),
        job_dir="/tmp/job",
        num_nodes=2,
        devices=2,
        machine=UNSPECIFIED_MACHINE,
        image=None,
        command=None,
        command_mode="per_node",
        env={},
        timeout_s=60.0,
    )
    values.update(fields)
    return JobPlan(**values)
