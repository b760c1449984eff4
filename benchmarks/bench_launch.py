"""Launch overhead: a 2 nodes x 2 processes probe job, end to end, mmt against three anchors, in one run.

    (a) mmt:     python train.py -m recipe=probe num_nodes=2 devices=2      (Hydra compose + plan + 4 ranks)
    (b) shell:   4 bare processes started by a shell with the same rank env  (no launcher at all)
    (c) torchrun: two torchrun agents x 2 processes, static rendezvous      (the usual glue)
    (d) submitit: hydra-submitit-launcher submitit_local, tasks_per_node=4  (the Hydra plugin people use)
    (e) import:   python -c "import torch.distributed"                       (the floor: one import, no job)
    (f) earlier:  (a) with another version of mmt (--against REV, installed beside: benchmarks/_install.py)

Every variant runs the same probe (process group, all_reduce, all_gather_object, barrier) and must succeed.
The variants alternate within each round, and the medians of ``--rounds`` rounds are compared as ratios.

    python benchmarks/bench_launch.py --rounds 5
    python benchmarks/bench_launch.py --rounds 5 --against 3f93098
"""

import os
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Callable, Dict

import _install
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
        [
            PY,
            "train.py",
            "-m",
            "recipe=probe",
            "num_nodes=2",
            "devices=2",
            f"hydra.sweep.dir={scratch}/mmt-{time.monotonic_ns()}",
        ],
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


def run_import(scratch: Path) -> None:
    timing.run([PY, "-c", "import torch.distributed"], cwd=REPO, env=_env(OMP_NUM_THREADS="1"))


def run_version(version: _install.Version) -> Callable[[Path], None]:
    def one(scratch: Path) -> None:
        env = {k: v for k, v in _env().items() if k != "PYTHONPATH"}
        sweep = f"hydra.sweep.dir={scratch}/earlier-{time.monotonic_ns()}"
        timing.run(
            [version.python, "train.py", "-m", "recipe=probe", "num_nodes=2", "devices=2", sweep],
            cwd=version.tree,
            env=env,
        )

    return one


VARIANTS: Dict[str, Callable[[Path], None]] = {
    "a_mmt": run_mmt,
    "b_shell": run_shell,
    "c_torchrun": run_torchrun,
    "d_submitit_local": run_submitit,
    "e_import": run_import,
}
RATIOS = {
    "a/b": ("a_mmt", "b_shell"),
    "a/c": ("a_mmt", "c_torchrun"),
    "a/d": ("a_mmt", "d_submitit_local"),
    "a/e": ("a_mmt", "e_import"),
}


def main() -> None:
    import argparse
    import shutil
    import tempfile

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--against", help="also run this git revision of mmt (installed beside this one)")
    parser.add_argument("--json", type=Path, help="also write the figures here")
    args = parser.parse_args()
    variants, ratios = dict(VARIANTS), dict(RATIOS)
    if args.against:
        earlier = _install.of_revision(args.against)
        variants["f_earlier"] = run_version(earlier)
        ratios[f"a/{earlier.label}"] = ("a_mmt", "f_earlier")
    scratch = Path(tempfile.mkdtemp(prefix="mmt-bench-"))
    try:
        times = timing.alternate(variants, args.rounds, scratch)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    timing.report(times, ratios, args.json, rounds=args.rounds)


if __name__ == "__main__":
    main()
