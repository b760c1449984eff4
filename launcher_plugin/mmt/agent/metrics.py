"""The node agent's machine-metrics samplers: one per node of a job that this agent runs (the local host agent runs
every simulated node of a job, a SLURM node agent its own node), sampled in the agent's loop."""

import sys
import time
from pathlib import Path
from typing import Any, Dict, Iterable, Optional

from mmt.agent.jobs import JobProcesses
from mmt.agent.processes import ProcessSpec
from mmt.core.jobdir import JobDir


class JobMetrics:
    def __init__(self, job_dir: str, specs: Iterable[ProcessSpec], interval_s: float) -> None:
        self.node_of: Dict[int, int] = {spec.index: spec.node_rank for spec in specs}
        visible = {spec.node_rank: spec.env.get("CUDA_VISIBLE_DEVICES") for spec in specs}
        paths = JobDir(Path(job_dir))
        self.samplers: Dict[int, Any] = {}
        if interval_s <= 0:
            return
        try:  # psutil: only where metrics are sampled
            from mmt.monitor.sampler import NodeSampler
        except ImportError as exc:  # an image that brings Python, torch and Lightning but not psutil
            print(f"[mmt agent] no machine metrics for this node: {exc}", file=sys.stderr, flush=True)
            return
        self.samplers = {
            node: NodeSampler(paths.node_metrics(node), node, interval_s, visible_gpus=gpus)
            for node, gpus in sorted(visible.items())
        }

    def next_due(self) -> Optional[float]:
        return min((s._next for s in self.samplers.values()), default=None)

    def sample(self, job: JobProcesses) -> None:
        now = time.monotonic()
        for node, sampler in self.samplers.items():
            if sampler.due(now):
                roots = [p.pid for p in job.running if self.node_of.get(p.index) == node]
                try:
                    sampler.sample(roots)
                except OSError:  # a full disk or a removed job dir: metrics are best effort
                    sampler.interval_s = 0.0
