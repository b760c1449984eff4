#!/usr/bin/env bash
# Add TensorFlow (CPU), tf-keras, JAX (CPU), LitData, litgpt and tokenizers to ./.venv, for
# tests/e2e/test_frameworks.py, examples/frameworks/ and recipe=llm (tests/e2e/test_llm.py). Run after
# scripts/setup.sh. Safe to re-run: it installs only what is missing or pinned differently (a second run takes
# about a second).
#
# Three packages would otherwise pull what they must not (see docs/frameworks.md#installing):
#   * tf-keras declares `tensorflow`, the 570 MB GPU wheel, next to tensorflow-cpu: installed with --no-deps;
#   * litdata declares torchvision, whose PyPI wheel is a CUDA build that asks for another torch: installed with
#     --no-deps, its other requirements named here (torchvision is imported only for images and video);
#   * litgpt's requirements (huggingface-hub, jsonargparse, safetensors, tokenizers, ...) are small, but it also
#     declares torch and lightning: the constraints pin the installed torch and lightning, so pip keeps them;
#   * nothing may replace the CPU torch that scripts/setup.sh installed: a constraint pins the installed one.
set -euo pipefail
cd "$(dirname "$0")/.."
[[ -x .venv/bin/python ]] || { echo "run scripts/setup.sh first (no .venv)" >&2; exit 1; }

TF_VERSION=${MMT_TF_VERSION:-2.21.0}
JAX_VERSION=${MMT_JAX_VERSION:-0.10.2}
LITDATA_VERSION=${MMT_LITDATA_VERSION:-0.2.76}
LITGPT_VERSION=${MMT_LITGPT_VERSION:-0.5.13}
TOKENIZERS_VERSION=${MMT_TOKENIZERS_VERSION:-0.23.3}
PY=.venv/bin/python
PIP=("$PY" -m pip install --quiet --disable-pip-version-check)

installed() {  # installed DIST VERSION: exit 0 when DIST==VERSION is installed
    "$PY" - "$1" "$2" <<'PY'
import sys
from importlib.metadata import PackageNotFoundError, version
try:
    sys.exit(version(sys.argv[1]) != sys.argv[2])
except PackageNotFoundError:
    sys.exit(1)
PY
}

if installed tensorflow-cpu "$TF_VERSION" && installed tf-keras "$TF_VERSION" && installed jax "$JAX_VERSION" \
        && installed jaxlib "$JAX_VERSION" && installed litdata "$LITDATA_VERSION" \
        && installed litgpt "$LITGPT_VERSION" && installed tokenizers "$TOKENIZERS_VERSION"; then
    echo "frameworks ready (already installed): tensorflow-cpu $TF_VERSION, jax $JAX_VERSION, litdata $LITDATA_VERSION," \
        "litgpt $LITGPT_VERSION, tokenizers $TOKENIZERS_VERSION"
    exit 0
fi

constraints=$(mktemp)
trap 'rm -f "$constraints"' EXIT
"$PY" -c 'import lightning, torch; print(f"torch=={torch.__version__}\nlightning=={lightning.__version__}")' \
    >"$constraints"

"${PIP[@]}" -c "$constraints" "tensorflow-cpu==$TF_VERSION" "jax==$JAX_VERSION" "jaxlib==$JAX_VERSION"
"${PIP[@]}" --no-deps "tf-keras==$TF_VERSION"
"${PIP[@]}" --no-deps "litdata==$LITDATA_VERSION"
"${PIP[@]}" -c "$constraints" lightning-utilities filelock boto3 requests "urllib3>=1.26" tifffile obstore
"${PIP[@]}" -c "$constraints" "litgpt==$LITGPT_VERSION" "tokenizers==$TOKENIZERS_VERSION"

"$PY" - <<'PY'
import os
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
import jax, litdata, litgpt, tensorflow as tf, tf_keras, tokenizers, torch
from importlib.metadata import version
assert "+cpu" in torch.__version__ or not torch.version.cuda, f"torch was replaced: {torch.__version__}"
print(f"frameworks ready: tensorflow {tf.__version__} (tf-keras {tf_keras.__version__}), jax {jax.__version__}, "
      f"litdata {litdata.__version__}, litgpt {version('litgpt')}, tokenizers {tokenizers.__version__}, "
      f"torch {torch.__version__}")
PY
