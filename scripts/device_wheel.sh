#!/usr/bin/env bash
# Builds the Python package for the GPU machine on this one, so that a device call need not: there
# the build takes 140-170 s of the session's 30 minutes of device time (docs/gpu-runs.md), here
# about 4 minutes on two cores, off the device's clock. The wheel is built for what the GPU machine
# runs (docs/gpu.md): CPython 3.12, torch 2.11.0 (CUDA 13.0), sm_90a code only.
#
# Usage: scripts/device_wheel.sh [OUT_DIR]        (default .device/wheel, git-ignored by
#                                                  .git/info/exclude in our sessions)
# On the GPU machine, with OUT_DIR carried:
#   python3 -m pip install --no-deps --target /tmp/site OUT_DIR/mamba2ssd-*.whl
#   export PYTHONPATH=/tmp/site
#
# Needs nvcc, a Python 3.12 (PY312; default python3.12 on PATH, else pyenv's), and network the
# first time: the build environment is a venv (VENV, default /tmp/mamba2ssd-py312) with torch 2.11.0
# from PyPI (about 5 GB with its CUDA libraries). The objects stay in build-py/cuda (git-ignored),
# so a second build recompiles only what changed.
set -euo pipefail
cd "$(dirname "$0")/.."

out=${1:-.device/wheel}
venv=${VENV:-/tmp/mamba2ssd-py312}
# The first Python 3.12 that runs (a pyenv shim on PATH may name one it then refuses to start).
py=${PY312:-}
if [ -z "$py" ]; then
  for c in $(command -v python3.12 || true) "${PYENV_ROOT:-$HOME/.pyenv}"/versions/3.12*/bin/python; do
    if [ -x "$c" ] && "$c" -c "import sys" 2>/dev/null; then py=$c; break; fi
  done
fi
if [ ! -x "$venv/bin/python" ]; then
  [ -n "$py" ] && [ -x "$py" ] || { echo "device_wheel: no Python 3.12 that runs was found (set PY312)" >&2; exit 1; }
  "$py" -m venv "$venv"
fi
if ! "$venv/bin/python" -c "import torch" 2>/dev/null; then
  echo "device_wheel: installing torch==2.11.0 into $venv"
  "$venv/bin/pip" install -q torch==2.11.0 numpy setuptools wheel ninja
fi
"$venv/bin/python" - <<'EOF'
import sys, torch
assert sys.version_info[:2] == (3, 12), f"the GPU machine runs CPython 3.12, this venv {sys.version}"
assert torch.__version__.startswith("2.11.0") and torch.version.cuda == "13.0", \
    f"the GPU machine runs torch 2.11.0 with CUDA 13.0, this venv {torch.__version__} ({torch.version.cuda})"
EOF
command -v nvcc >/dev/null 2>&1 || export PATH="/usr/local/cuda/bin:$PATH"

mkdir -p "$out"
rm -f "$out"/mamba2ssd-*.whl
PATH="$venv/bin:$PATH" MAMBA2SSD_CUDA_GENCODE="-gencode=arch=compute_90a,code=sm_90a" MAX_JOBS=${MAX_JOBS:-$(nproc)} \
  "$venv/bin/python" -m pip wheel --no-build-isolation --no-deps -q -w "$out" .
ls -l "$out"/mamba2ssd-*.whl
