#!/usr/bin/env bash
# Install torch 2.13.0 (the version CI tests; environment.yml pins the same) into a venv.
#
#   bash scripts/install_torch.sh VENV_PYTHON
#
# Order of preference, so that a machine without a GPU never pulls the multi-GB CUDA build
# when a CPU build can be had:
#   1. a torch 2.13.0 wheel pip already finds without any index (its configured find-links);
#   2. the default build from pip's configured index, only where an NVIDIA GPU answers;
#   3. the CPU build from PyTorch's CPU index alone (downloaded first, then installed with
#      torch's own dependencies from pip's configured index).  On Linux the CPU index's
#      "2.13.0+cpu" is the CPU build; the configured index's plain "2.13.0" is the CUDA one;
#   4. where no CPU build can be had for this Python (PyTorch's CPU index unreachable, as on a
#      machine that reaches only a mirror of the default index), the default build, said
#      beforehand: on Linux it is the CUDA build, about 5 GB and minutes to download; it runs
#      on the CPU as well, only bigger.
# Kept as it is: a torch already in the venv that the course supports (torch>=2.3,<3, as
# pyproject.toml declares), e.g. a hosted runtime's own CUDA build.  pip's cache is kept (no
# --no-cache-dir): a second environment reuses what the first downloaded.
set -euo pipefail
PY=${1:?usage: install_torch.sh VENV_PYTHON}
TORCH_VERSION=2.13.0
CPU_INDEX=https://download.pytorch.org/whl/cpu

have=$("$PY" -c "import torch; print(torch.__version__)" 2>/dev/null || true)
if [ -n "$have" ]; then
    if "$PY" -c "import sys, torch; v = tuple(int(p) for p in torch.__version__.split('.')[:2]);
sys.exit(not (2, 3) <= v < (3, 0))"; then
        echo "install_torch.sh: keeping the torch $have already installed (the course needs >=2.3,<3)"
        exit 0
    fi
    echo "install_torch.sh: torch $have is installed, outside what the course needs (>=2.3,<3);" \
         "installing $TORCH_VERSION over it"
fi
wheels=$(mktemp -d)
trap 'rm -rf "$wheels"' EXIT
if "$PY" -m pip download -q --no-index --no-deps "torch==$TORCH_VERSION" -d "$wheels" 2>/dev/null; then
    "$PY" -m pip install -q "$wheels"/torch-*.whl
elif command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then
    echo "install_torch.sh: an NVIDIA GPU answers; installing torch $TORCH_VERSION's default build"
    "$PY" -m pip install -q "torch==$TORCH_VERSION"
# --isolated: PyTorch's CPU index alone (no configured extra index or find-links), so that what
# comes back is the CPU build, never the default one from elsewhere.
elif "$PY" -m pip download -q --isolated --no-deps --retries 1 --timeout 30 "torch==$TORCH_VERSION" \
        --index-url "$CPU_INDEX" -d "$wheels" 2>/dev/null; then
    "$PY" -m pip install -q "$wheels"/torch-*.whl
else
    echo "install_torch.sh: no CPU build of torch $TORCH_VERSION can be had for $("$PY" -V 2>&1):" \
         "none is on disk and PyTorch's CPU index ($CPU_INDEX) did not answer.  Installing the" \
         "default build from pip's configured index instead: on Linux that is the CUDA build," \
         "about 5 GB to download and unpack, several minutes (it runs on the CPU too)." \
         "To avoid it, make the CPU index reachable or put a CPU wheel where pip finds it."
    "$PY" -m pip install -q "torch==$TORCH_VERSION"
fi
