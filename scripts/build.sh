#!/usr/bin/env bash
# Configures into build/ (Release; the CUDA backend too when nvcc is found) and builds with every
# core. BUILD_DIR overrides the folder; extra arguments go to cmake's configure step.
set -euo pipefail
cd "$(dirname "$0")/.."

# nvcc usually lives outside PATH on a fresh machine.
if ! command -v nvcc >/dev/null 2>&1 && [ -x /usr/local/cuda/bin/nvcc ]; then
  export PATH="/usr/local/cuda/bin:$PATH"
fi

build_dir="${BUILD_DIR:-build}"
cmake -S . -B "$build_dir" -DCMAKE_BUILD_TYPE=Release "$@"
cmake --build "$build_dir" -j "$(nproc)"
