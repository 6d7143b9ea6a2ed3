#!/usr/bin/env bash
# The PyTorch package: installs what is missing (PyTorch, pytest, build tools), builds and installs
# mamba2ssd with `pip install --no-build-isolation .`, then runs the Python tests (tests/python).
#
# Which extension gets built:
#   MAMBA2SSD_BUILD_CUDA=1  the CUDA backend (needs nvcc of PyTorch's CUDA version)
#   MAMBA2SSD_BUILD_CUDA=0  CPU only (src/cuda/no_cuda.cpp stands in for the CUDA sources)
#   unset                   1 where PyTorch sees a GPU, else 0: without a GPU nothing would run the
#                           CUDA code, and compiling it costs minutes on 2 cores (CMake's build
#                           compiles those sources already)
# Other knobs: PYTHON (default python3), MAMBA2SSD_TORCH (the PyTorch to install when none is
# importable; default torch==2.11.0, the GPU machine's version, whose CUDA 13.0 matches nvcc here),
# MAX_JOBS (parallel compiles, default every core). Extra arguments go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."

PYTHON=${PYTHON:-python3}
export PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_ROOT_USER_ACTION=ignore
if ! command -v nvcc >/dev/null 2>&1 && [ -x /usr/local/cuda/bin/nvcc ]; then
  export PATH="/usr/local/cuda/bin:$PATH"
fi

have() { "$PYTHON" -c "import $1" >/dev/null 2>&1; }

missing=()
have torch || missing+=("${MAMBA2SSD_TORCH:-torch==2.11.0}")
have pytest || missing+=(pytest)
have wheel || missing+=(wheel)       # setuptools < 70 builds wheels through it
have ninja || missing+=(ninja)       # parallel compiles
have numpy || missing+=(numpy)       # keeps torch's import quiet
if [ "${#missing[@]}" -gt 0 ]; then
  echo "python_test: installing ${missing[*]}"
  "$PYTHON" -m pip install -q "${missing[@]}"
fi

gpu=$("$PYTHON" -c "import torch; print(int(torch.cuda.is_available()))" 2>/dev/null || echo 0)
if [ -z "${MAMBA2SSD_BUILD_CUDA:-}" ]; then
  export MAMBA2SSD_BUILD_CUDA=$gpu
  [ "$gpu" = 1 ] || echo "python_test: no GPU visible to PyTorch: building the CPU-only extension (MAMBA2SSD_BUILD_CUDA=1 compiles the CUDA backend anyway)"
fi
"$PYTHON" -c "import torch; print(f'python_test: torch {torch.__version__} (CUDA {torch.version.cuda}), GPU visible: {torch.cuda.is_available()}')"

mkdir -p build-py
log=build-py/pip-install.log
start=$SECONDS
if ! "$PYTHON" -m pip install -v --no-build-isolation . >"$log" 2>&1; then
  tail -n 60 "$log"
  echo "python_test: pip install failed (whole log: $log)" >&2
  exit 1
fi
grep -m1 "mamba2ssd setup:" "$log" | sed 's/^ *//' || true
echo "python_test: built and installed in $((SECONDS - start)) s"
(cd /tmp && "$PYTHON" -c "import mamba2ssd; print(f'python_test: mamba2ssd {mamba2ssd.__version__} from {mamba2ssd.__file__}, CUDA backend: {mamba2ssd.has_cuda_backend()}')")

# With a GPU, list why anything was skipped (the peer not importable, one GPU only, ...); without
# one, the reason is the same for every skipped test: no CUDA device.
report=()
[ "$gpu" = 1 ] && report=(-rs)
"$PYTHON" -m pytest tests/python -q "${report[@]}" "$@"
