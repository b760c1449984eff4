#!/usr/bin/env bash
# Create ./.venv with mmt, its recipes' and its tests' dependencies. Safe to re-run (it only adds what is missing).
#
# torch is installed first and pinned: on a machine without an NVIDIA GPU we ask for the CPU build (an unpinned
# `pip install torch` pulls a CUDA build of several GB). Everything else comes from pyproject.toml.
set -euo pipefail
cd "$(dirname "$0")/.."
TORCH_VERSION=${MMT_TORCH_VERSION:-2.13.0}
PYTHON=${PYTHON:-python3}

"$PYTHON" -c 'import sys; sys.exit(sys.version_info < (3, 11))' || { echo "mmt needs Python >= 3.11" >&2; exit 1; }
[[ -x .venv/bin/python ]] || "$PYTHON" -m venv .venv
PIP=(.venv/bin/python -m pip install --quiet --disable-pip-version-check)

if ! .venv/bin/python -c 'import torch' 2>/dev/null; then
    if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then
        "${PIP[@]}" "torch==$TORCH_VERSION"
    elif .venv/bin/python - <<'PY'
import urllib.request, sys
try:
    urllib.request.urlopen("https://download.pytorch.org/whl/cpu/", timeout=3)
except Exception:
    sys.exit(1)
PY
    then  # PyTorch's CPU index is reachable: its +cpu build wins over PyPI's CUDA one
        "${PIP[@]}" "torch==$TORCH_VERSION" --extra-index-url https://download.pytorch.org/whl/cpu
    else  # no GPU and no PyTorch index (e.g. a mirror of PyPI only): take what the mirror offers for this pin
        "${PIP[@]}" "torch==$TORCH_VERSION"
    fi
fi
# compat editable mode: a default (PEP 660) editable install hides hydra_plugins from Hydra 1.3's plugin scan
"${PIP[@]}" -e ".[train,test]" --config-settings editable_mode=compat
# an editable install leaves mmt's own modules uncompiled; where PYTHONDONTWRITEBYTECODE is set (many images and CI
# runners set it) every launcher, agent and rank would compile them again (30-40 ms a process here)
.venv/bin/python -m compileall -q launcher_plugin recipes >/dev/null
.venv/bin/python -c 'import torch, lightning, hydra_plugins.mmt_launcher; print(f"mmt ready: torch {torch.__version__}, lightning {lightning.__version__}")'
