"""Launch overhead: a 2 nodes x 2 processes probe job, end to end, mmt against three anchors, in one run.

    (a) mmt:     python train.py -m recipe=probe num_nodes=2 devices=2      (Hydra compose + plan + 4 ranks)
    (b) shell:   4 bare processes started by a shell with the same rank env  (no launcher at all)
    (c) torchrun: two torchrun agents x 2 processes, static rendezvous      (the usual glue)
    (d) submitit: hydra-submitit-launcher submitit_local, tasks_per_node=4  (the Hydra plugin people use)

Every variant runs the same probe (process group, all_reduce, all_gather_object, barrier) and must succeed.
The variants alternate within each round, and the medians of ``--rounds`` rounds are compared as ratios.

    python benchmarks/bench_launch.py --rounds 5
"""

import os
import socket
import subprocess
import sys
from pathlib import Path
from typing import Callable, Dict

import _timing as timing

REPO = Path(__file__).resolve().parents[1]
PY = sys.executable


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _env(**extra: str) -> Dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "TORCHELASTIC_"))}
    env.update(PYTHONPATH=str(REPO), **extra)
    return env


def run_mmt(scratch: Path) -> None:
    timing.run(
        [PY, "train.py", "-m", "recipe=probe", "num_nodes=2", "devices=2", f"hydra.sweep.dir={scratch}/mmt"],
        cwd=REPO,
        env=_env(),
    )


def run_shell(scratch: Path) -> None:
    port = _free_port()
    lines = [
        f"MASTER_ADDR=127.0.0.1 MASTER_PORT={port} WORLD_SIZE=4 LOCAL_WORLD_SIZE=2 NUM_NODES=2 "
        f"NODE_RANK={r // 2} LOCAL_RANK={r % 2} RANK={r} OMP_NUM_THREADS=1 {PY} benchmarks/probe_main.py &"
        for r in range(4)
    ]
    script = "\n".join(lines) + "\nfor job in $(jobs -p); do wait $job || exit 1; done\n"
    timing.run(["/bin/sh", "-c", script], cwd=REPO, env=_env())


def run_torchrun(scratch: Path) -> None:
    port = _free_port()
    agents = [
        subprocess.Popen(
            [
                PY,
                "-m",
                "torch.distributed.run",
                "--nnodes=2",
                "--nproc-per-node=2",
                f"--node-rank={node}",
                "--rdzv-backend=static",
                "--master-addr=127.0.0.1",
                f"--master-port={port}",
                "benchmarks/probe_main.py",
            ],
            cwd=REPO,
            env=_env(OMP_NUM_THREADS="1"),
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        for node in range(2)
    ]
    codes = [agent.wait() for agent in agents]
    if any(codes):
        raise RuntimeError(f"torchrun agents exited {codes}")


def run_submitit(scratch: Path) -> None:
    timing.run(
        [
            PY,
            "benchmarks/submitit_probe_app.py",
            "-m",
            "hydra/launcher=submitit_local",
            "hydra.launcher.tasks_per_node=4",
            "hydra.launcher.timeout_min=5",
            f"hydra.sweep.dir={scratch}/submitit",
        ],
        cwd=REPO,
        env=_env(OMP_NUM_THREADS="1"),
    )


VARIANTS: Dict[str, Callable[[Path], None]] = {
    "a_mmt": run_mmt,
    "b_shell": run_shell,
    "c_torchrun": run_torchrun,
    "d_submitit_local": run_submitit,
}


def main() -> None:
    timing.main(
        __doc__.split("\n\n")[0],
        VARIANTS,
        {"a/b": ("a_mmt", "b_shell"), "a/c": ("a_mmt", "c_torchrun"), "a/d": ("a_mmt", "d_submitit_local")},
        "mmt-bench-",
    )


if __name__ == "__main__":
    main()
