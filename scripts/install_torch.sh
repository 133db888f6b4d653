#!/usr/bin/env bash
# Install torch 2.13.0 (the version CI tests; environment.yml pins the same) into a venv.
#
#   bash scripts/install_torch.sh VENV_PYTHON
#
# Order of preference, so that a machine without a GPU never pulls the multi-GB CUDA build:
#   1. a torch 2.13.0 wheel pip already finds without any index (its configured find-links);
#   2. the default build from pip's configured index, only where an NVIDIA GPU answers;
#   3. the CPU build from PyTorch's CPU index, added to (not replacing) pip's configured
#      index, which still serves torch's own dependencies.  On Linux the CPU index's
#      "2.13.0+cpu" sorts above the index's plain "2.13.0", so pip takes the CPU build.
# Skipped when the venv already imports torch.
set -euo pipefail
PY=${1:?usage: install_torch.sh VENV_PYTHON}
TORCH_VERSION=2.13.0

if "$PY" -c "import torch" 2>/dev/null; then
    exit 0
fi
wheels=$(mktemp -d)
trap 'rm -rf "$wheels"' EXIT
if "$PY" -m pip download -q --no-index --no-deps "torch==$TORCH_VERSION" -d "$wheels" 2>/dev/null; then
    "$PY" -m pip install -q "$wheels"/torch-*.whl
elif command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then
    "$PY" -m pip install -q "torch==$TORCH_VERSION"
else
    "$PY" -m pip install -q "torch==$TORCH_VERSION" --extra-index-url https://download.pytorch.org/whl/cpu
fi
