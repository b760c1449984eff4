#!/usr/bin/env bash
# Add Ray (ray[default,train], pinned) to ./.venv, for cluster=ray (mmt.backends.ray), its tests
# (tests/e2e/test_ray.py, on the test cluster of scripts/ray_cluster.sh) and benchmarks/bench_ray.py. Run after
# scripts/setup.sh. Safe to re-run: it installs only what is missing or pinned differently (a second run takes
# about a second).
#
#   * [default]: the dashboard, which serves the job submission API that mmt submits through, and the state API;
#   * [train]: Ray Train's TorchTrainer, which benchmarks/bench_ray.py runs against mmt on the same cluster;
#   * nothing may replace the CPU torch that scripts/setup.sh installed: a constraint pins the installed one (Ray
#     itself does not ask for torch).
set -euo pipefail
cd "$(dirname "$0")/.."
[[ -x .venv/bin/python ]] || { echo "run scripts/setup.sh first (no .venv)" >&2; exit 1; }

RAY_VERSION=${MMT_RAY_VERSION:-2.60.0}
PY=.venv/bin/python

if "$PY" - "$RAY_VERSION" <<'PY'
import sys
from importlib.metadata import PackageNotFoundError, version
try:
    # the extras' own packages, not only ray: aiohttp_cors (default), pyarrow (train)
    sys.exit(version("ray") != sys.argv[1] or not version("aiohttp-cors") or not version("pyarrow"))
except PackageNotFoundError:
    sys.exit(1)
PY
then
    echo "ray ready (already installed): ray $RAY_VERSION"
    exit 0
fi

constraints=$(mktemp)
trap 'rm -f "$constraints"' EXIT
"$PY" -c 'import torch; print(f"torch=={torch.__version__}")' >"$constraints"
"$PY" -m pip install --quiet --disable-pip-version-check -c "$constraints" "ray[default,train]==$RAY_VERSION"

"$PY" - <<'PY'
import ray, torch
from ray.job_submission import JobSubmissionClient  # noqa: F401 - the dashboard's client: [default] is there
from ray.train.torch import TorchTrainer  # noqa: F401 - [train]
assert "+cpu" in torch.__version__ or not torch.version.cuda, f"torch was replaced: {torch.__version__}"
print(f"ray ready: ray {ray.__version__}, torch {torch.__version__}")
PY
