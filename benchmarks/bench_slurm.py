"""Submit-to-result time of a probe job on the local SLURM cluster: mmt against hydra-submitit-launcher, the floor,
and (``--against``) an earlier version of mmt.

    (a) mmt:      python train.py -m cluster=slurm recipe=probe num_nodes=N devices=M
                  (one task per node: its agent imports torch once and forks the node's M ranks)
    (b) submitit: hydra-submitit-launcher's submitit_slurm, nodes=N tasks_per_node=M, the same probe
                  (one task per rank, each importing torch on its own), its other settings at their defaults
    (c) earlier:  (a) with another version of mmt (a git revision, installed beside: benchmarks/_install.py)
    (d) floor:    srun -N N python -c "import torch" (what any launcher pays on every node: no job at all)

Each is timed from the command's start to its exit (compose, sbatch, scheduling, the ranks, result back), the
variants alternate within each round, and the medians of ``--rounds`` rounds are compared as ratios; mmt runs with
its own defaults too. ``--per-node 1,2,4`` repeats it for each number of ranks per node.

    scripts/slurm_cluster.sh start && eval "$(scripts/slurm_cluster.sh env)"
    python benchmarks/bench_slurm.py --rounds 5                                   # 2 nodes x 2
    python benchmarks/bench_slurm.py --rounds 5 --against 3f93098 --floor
    python benchmarks/bench_slurm.py --rounds 3 --per-node 1,2,4
    MMT_SLURM_NODES=16 ... python benchmarks/bench_slurm.py --nodes 16 --per-node 1 --floor   # a 16-node cluster

The report's first line is the cluster's shape (nodes, CPUs per node, accounting): a small job's figures must not
depend on it (2 x 2 on a 3-node and a 16-node cluster).
"""

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Callable, Dict, Optional, Tuple

import _install
from _timing import alternate, report, run, slurm_idle

REPO = Path(__file__).resolve().parents[1]
PY = sys.executable


def _env() -> Dict[str, str]:
    return dict(os.environ, PYTHONPATH=str(REPO), OMP_NUM_THREADS="1")


def _mmt(
    version: _install.Version, nodes: int, per_node: int, name: str, slurm_conf: Optional[Path] = None
) -> Callable[[Path], None]:
    def one(scratch: Path) -> None:
        env = {k: v for k, v in _env().items() if k != "PYTHONPATH"}
        if slurm_conf is not None:
            env["SLURM_CONF"] = str(slurm_conf)
        run(
            [
                version.python,
                "train.py",
                "-m",
                "cluster=slurm",
                "recipe=probe",
                f"num_nodes={nodes}",
                f"devices={per_node}",
                f"hydra.sweep.dir={tempfile.mkdtemp(prefix=name, dir=scratch)}",
            ],
            cwd=version.tree,
            env=env,
        )

    return one


def variants(
    nodes: int, per_node: int, earlier: Optional[_install.Version], floor: bool, other: Optional[Path] = None
) -> Tuple[Dict[str, Callable[[Path], None]], Dict[str, Tuple[str, str]]]:
    shape = f"{nodes}x{per_node}"
    mmt_name = f"a_mmt_slurm_{shape}"
    found: Dict[str, Callable[[Path], None]] = {mmt_name: _mmt(_install.current(), nodes, per_node, "mmt")}

    def submitit(scratch: Path) -> None:
        run(
            [
                PY,
                "benchmarks/submitit_probe_app.py",
                "-m",
                "hydra/launcher=submitit_slurm",
                f"hydra.launcher.nodes={nodes}",
                f"hydra.launcher.tasks_per_node={per_node}",
                f"hydra.sweep.dir={tempfile.mkdtemp(prefix='submitit', dir=scratch)}",
            ],
            cwd=REPO,
            env=_env(),
        )

    found[f"b_submitit_slurm_{shape}"] = submitit
    ratios = {f"mmt/submitit_slurm {shape}": (mmt_name, f"b_submitit_slurm_{shape}")}
    if earlier is not None:
        found[f"c_earlier_{shape}"] = _mmt(earlier, nodes, per_node, "earlier")
        ratios[f"mmt/{earlier.label} {shape}"] = (mmt_name, f"c_earlier_{shape}")
    if other is not None:
        found[f"e_mmt_other_cluster_{shape}"] = _mmt(_install.current(), nodes, per_node, "other", other)
        ratios[f"mmt this/other cluster {shape}"] = (mmt_name, f"e_mmt_other_cluster_{shape}")
    if floor:

        def bare(scratch: Path) -> None:
            run(["srun", f"-N{nodes}", "--ntasks-per-node=1", PY, "-c", "import torch"], env=_env())

        found[f"d_floor_{nodes}"] = bare
        ratios[f"mmt/floor {shape}"] = (mmt_name, f"d_floor_{nodes}")
    return found, ratios


def _all_idle(other: Optional[Path]) -> None:
    slurm_idle()
    if other is not None:
        slurm_idle(env=dict(os.environ, SLURM_CONF=str(other)))


def cluster_shape(slurm_conf: Optional[Path] = None) -> Dict[str, object]:
    """The cluster the figures were taken on: its node count, CPUs per node and whether accounting is on (what a
    launcher's path might grow with)."""
    env = dict(os.environ, **({"SLURM_CONF": str(slurm_conf)} if slurm_conf is not None else {}))

    def ask(*args: str) -> str:
        return subprocess.run(list(args), capture_output=True, text=True, env=env).stdout

    nodes = ask("sinfo", "-h", "-N", "-o", "%N %c").split("\n")
    cpus = sorted({int(line.split()[1]) for line in nodes if line.strip()})
    config = ask("scontrol", "show", "config")
    types = [line.split("=", 1)[1].strip() for line in config.splitlines() if "AccountingStorageType" in line]
    return {
        "nodes": len({line.split()[0] for line in nodes if line.strip()}),
        "cpus_per_node": cpus[0] if len(cpus) == 1 else cpus,
        "accounting": bool(types) and types[0] != "accounting_storage/none",
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--nodes", type=int, default=2)
    parser.add_argument("--per-node", default="2", help="ranks per node, comma-separated (e.g. 1,2,4)")
    parser.add_argument("--against", help="also run this git revision of mmt (installed beside this one)")
    parser.add_argument(
        "--floor", action="store_true", help='also run the floor: srun -N<nodes> python -c "import torch"'
    )
    parser.add_argument(
        "--other-cluster",
        type=Path,
        help="another cluster's slurm.conf: mmt's job also runs there, alternating (both clusters up at once, so the "
        "host's load is the same for both and only what mmt's path does with the cluster's size differs)",
    )
    parser.add_argument("--json", type=Path, help="also write the figures here")
    args = parser.parse_args()
    if shutil.which("sbatch") is None or "SLURM_CONF" not in os.environ and not Path("/etc/slurm/slurm.conf").exists():
        sys.exit('no SLURM cluster: scripts/slurm_cluster.sh start && eval "$(scripts/slurm_cluster.sh env)"')
    earlier = _install.of_revision(args.against) if args.against else None
    figures: Dict[str, object] = {}
    for label, conf in (("cluster", None), ("other cluster", args.other_cluster)):
        if label == "cluster" or conf is not None:
            shape = cluster_shape(conf)
            accounting = "on" if shape["accounting"] else "off"
            print(f"{label}: {shape['nodes']} nodes x {shape['cpus_per_node']} CPUs, accounting {accounting}")
            figures[label] = shape
    sys.stdout.flush()
    for per_node in [int(n) for n in args.per_node.split(",")]:
        scratch = Path(tempfile.mkdtemp(prefix="mmt-bench-slurm-"))
        try:
            found, ratios = variants(args.nodes, per_node, earlier, args.floor, args.other_cluster)
            times = alternate(found, args.rounds, scratch, settle=lambda: _all_idle(args.other_cluster))
        finally:
            shutil.rmtree(scratch, ignore_errors=True)
        figures[f"{args.nodes}x{per_node}"] = report(times, ratios, None, rounds=args.rounds)
    if args.json:
        args.json.write_text(json.dumps(figures, indent=2))


if __name__ == "__main__":
    main()
