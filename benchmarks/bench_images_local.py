"""What a container costs on cluster=local: the 2 x 2 probe in a podman container per node, over the same probe
without containers, in one run, alternating.

    (a) containers:  python train.py -m image=<test image> recipe=probe num_nodes=2 devices=2
    (b) host:        python train.py -m recipe=probe num_nodes=2 devices=2
    (c) floor:       python -c "import torch.distributed"

The image is the tests' (scripts/build_test_image.py, built here if missing). On a host whose podman needs a
containers.conf (this sandbox's: runc, cgroupfs, no default ulimits), set CONTAINERS_CONF first.

    python benchmarks/bench_images_local.py --rounds 5
"""

import subprocess
import sys
from pathlib import Path
from typing import Callable, Dict

import _timing as timing

REPO = Path(__file__).resolve().parents[1]
PY = sys.executable
PROBE = ("recipe=probe", "num_nodes=2", "devices=2")


def _image() -> str:
    built = subprocess.run(
        [PY, str(REPO / "scripts" / "build_test_image.py")], capture_output=True, text=True, check=True
    )
    return built.stdout.strip().splitlines()[-1]


def _app(*overrides: str) -> Callable[[Path], None]:
    def run(scratch: Path) -> None:
        timing.run([PY, str(REPO / "train.py"), "-m", *overrides, f"hydra.sweep.dir={scratch / 'sweep'}"], cwd=REPO)

    return run


def main() -> None:
    image = _image()
    variants: Dict[str, Callable[[Path], None]] = {
        "containers": _app(f"image={image}", *PROBE),
        "host": _app(*PROBE),
        "import torch.distributed": lambda _s: timing.run([PY, "-c", "import torch.distributed"]),
    }
    ratios = {"containers/host": ("containers", "host"), "containers/floor": ("containers", "import torch.distributed")}
    timing.main(__doc__.split("\n\n")[0], variants, ratios, prefix="mmt-bench-images.")


if __name__ == "__main__":
    main()
