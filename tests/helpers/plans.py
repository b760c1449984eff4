"""Job plans for tests: a small one without planning it from a config (2 nodes x 2, no machine, a minute), and one
planned from train.py's composed config as a launch plans it."""

import os
from pathlib import Path
from typing import Any, List

from helpers.config import compose_train
from mmt.launching.prepare import make_backend
from mmt.launching.submit import refuse_unrunnable
from mmt.planning.machine import UNSPECIFIED_MACHINE
from mmt.planning.plan import JobPlan, plan_job


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


def planned(overrides: List[str], job_dir: Path, cluster: str = "local") -> JobPlan:
    """Job 0 of ``python train.py -m cluster=<cluster> <overrides>`` (recipe=lm: a batch plan), planned and checked by
    its backend as a launch does, before anything starts (a ConfigError is raised as the launch raises it)."""
    config = compose_train(f"cluster={cluster}", *overrides)
    launcher_cfg = config.hydra.launcher
    backend = make_backend(launcher_cfg)
    try:
        plan = plan_job(
            launcher_cfg,
            num=0,
            name="train-0",
            job_id="unit-0",
            overrides=list(overrides),
            job_dir=str(job_dir),
            limits=backend.limits,
            launcher_env=os.environ,
        )
        refuse_unrunnable(backend, [plan])
        return plan
    finally:
        backend.close()
