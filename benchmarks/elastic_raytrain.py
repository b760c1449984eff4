"""benchmarks/bench_elastic.py's Ray Train variant: the same probe (benchmarks/elastic_probe.py) as Ray Train's
elastic job, ``ScalingConfig(num_workers=(4, 6))`` with a CPU per worker, on the cluster of scripts/ray_cluster.sh
(3 workers of 2 CPUs: 6 workers, 2 per node), Ray Train's defaults otherwise (``FailureConfig(max_failures=3)``
so that a lost node is retried at all). Ray Train makes the process group; the probe reads its rank from the
environment, which this wrapper sets from Ray Train's context.

    python benchmarks/elastic_raytrain.py <out dir>     (RAY_ADDRESS: the cluster's GCS, e.g. 127.0.0.5:6390)
"""

import os
import sys


def _worker(config: dict) -> None:
    import ray.train

    context = ray.train.get_context()
    os.environ["RANK"] = str(context.get_world_rank())
    os.environ["NODE_RANK"] = str(context.get_node_rank())
    sys.path.insert(0, config["here"])
    import elastic_probe

    elastic_probe.train(config["out"])


def main() -> None:
    import ray
    from ray.train import FailureConfig, RunConfig, ScalingConfig
    from ray.train.torch import TorchConfig, TorchTrainer

    out = sys.argv[1]
    ray.init(address=os.environ["RAY_ADDRESS"], log_to_driver=False)
    trainer = TorchTrainer(
        _worker,
        train_loop_config={"out": out, "here": os.path.dirname(os.path.abspath(__file__))},
        torch_config=TorchConfig(backend="gloo"),
        scaling_config=ScalingConfig(num_workers=(4, 6), resources_per_worker={"CPU": 1}),
        run_config=RunConfig(storage_path=os.path.join(out, "ray"), failure_config=FailureConfig(max_failures=3)),
    )
    trainer.fit()


if __name__ == "__main__":
    main()
