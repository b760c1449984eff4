"""What a container costs: the 2 x 2 probe job with ``image=`` over the same probe without it, on each backend.

    (a) image:  python train.py -m recipe=probe num_nodes=2 devices=2 image=<the test image> <the backend's runtime>
    (b) bare:   the same probe, no image
    SLURM only, the container start itself (no mmt at all):
    (c) srun -N2 --container=<a bundle derived as mmt derives it> /bin/sh -c true
    (d) srun -N2 /bin/sh -c true

The image is mmt's test image (scripts/build_test_image.py, built offline, cached by content): on ``--backend
slurm`` an OCI bundle run by SLURM's own ``srun --container`` (``container_runtime=oci``, the test cluster's
oci.conf: rootless runc); on ``--backend local`` a podman image (``container_runtime=podman``). Each is timed from
the command's start to its exit, the variants alternate within each round, and the medians of ``--rounds`` rounds
are compared: image/bare, and (SLURM) the container start per node, (c) - (d).

    scripts/slurm_cluster.sh start && eval "$(scripts/slurm_cluster.sh env)"
    python benchmarks/bench_images.py --backend slurm --rounds 5
    python benchmarks/bench_images.py --backend local --rounds 5
"""

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Callable, Dict, List, Tuple

from _timing import alternate, report, run, slurm_idle

REPO = Path(__file__).resolve().parents[1]
PY = sys.executable
SHAPE = ("recipe=probe", "num_nodes=2", "devices=2")


def _env() -> Dict[str, str]:
    return {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}


def _image(backend: str, scratch: Path) -> str:
    """The test image: an OCI bundle dir (slurm) or a podman image name (local)."""
    script = [PY, str(REPO / "scripts" / "build_test_image.py")]
    if backend == "slurm":
        bundle = scratch / "bundle"
        subprocess.run([*script, "--bundle", str(bundle), "--no-import"], check=True, capture_output=True)
        return str(bundle)
    out = subprocess.run(script, check=True, capture_output=True, text=True).stdout
    return out.strip().splitlines()[-1]


def _probe(backend: str, extra: List[str], name: str) -> Callable[[Path], None]:
    def one(scratch: Path) -> None:
        sweep = tempfile.mkdtemp(prefix=name, dir=scratch)
        run(
            [PY, "train.py", "-m", f"cluster={backend}", *SHAPE, *extra, f"hydra.sweep.dir={sweep}"],
            cwd=REPO,
            env=_env(),
        )

    return one


def _derived_bundle(image: str, scratch: Path) -> Path:
    """A bundle derived from the image as mmt derives an attempt's (mmt.backends.slurm.oci.derive)."""
    sys.path[:0] = [str(REPO / "launcher_plugin")]
    from mmt.backends.slurm.oci import derive
    from mmt.planning.machine import Machine
    from mmt.planning.plan import JobPlan

    plan = JobPlan(
        num=0, name="bench", job_id="bench", overrides=(), job_dir=str(scratch), num_nodes=2, devices=1,
        machine=Machine(name="cpu", accelerator="cpu", gpus=0, cpus=2, memory_gb=4, price_per_hour=0.0),
        image=image, command="true", command_mode="per_node", env={}, timeout_s=60.0, dry_run=False,
    )  # fmt: skip
    return derive(plan, [], str(REPO), scratch / "attempt")


def variants(backend: str, scratch: Path) -> Tuple[Dict[str, Callable[[Path], None]], Dict[str, Tuple[str, str]]]:
    image = _image(backend, scratch)
    runtime = "oci" if backend == "slurm" else "podman"
    found: Dict[str, Callable[[Path], None]] = {
        f"a_image_{backend}": _probe(backend, [f"image={image}", f"hydra.launcher.container_runtime={runtime}"], "img"),
        f"b_bare_{backend}": _probe(backend, [], "bare"),
    }
    ratios = {f"image/bare {backend} 2x2": (f"a_image_{backend}", f"b_bare_{backend}")}
    if backend == "slurm":
        bundle = _derived_bundle(image, scratch)
        srun = ["srun", "-N2", "--ntasks-per-node=1"]
        found["c_srun_container"] = lambda _: run([*srun, f"--container={bundle}", "/bin/sh", "-c", "true"])
        found["d_srun_bare"] = lambda _: run([*srun, "/bin/sh", "-c", "true"])
        ratios["srun container/bare"] = ("c_srun_container", "d_srun_bare")
    return found, ratios


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--backend", choices=("local", "slurm"), default="slurm")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--json", type=Path, help="also write the figures here")
    args = parser.parse_args()
    if args.backend == "slurm" and shutil.which("sbatch") is None:
        sys.exit('no SLURM cluster: scripts/slurm_cluster.sh start && eval "$(scripts/slurm_cluster.sh env)"')
    scratch = Path(tempfile.mkdtemp(prefix="mmt-bench-images-"))
    try:
        found, ratios = variants(args.backend, scratch)
        settle = slurm_idle if args.backend == "slurm" else None
        times = alternate(found, args.rounds, scratch, settle=settle)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    figures = report(times, ratios, None, backend=args.backend, rounds=args.rounds)
    if "c_srun_container" in times:
        median = figures["median_s"]  # type: ignore[index]
        start = median["c_srun_container"] - median["d_srun_bare"]
        figures["container_start_per_node_s"] = round(start, 3)
        print(f"container start per node (srun --container over a bare srun, 2 nodes at once): {start:.2f} s")
    if args.json:
        args.json.write_text(json.dumps(figures, indent=2))


if __name__ == "__main__":
    main()
