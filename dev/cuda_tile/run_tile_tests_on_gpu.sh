#!/usr/bin/env bash
# Issue 7: run the CUDA Tile C++ backend's GPU tests on the GPU machine (H200, driver 580.x).
#
# The test binary is prebuilt on a machine with the tile toolchain (nvcc 13.5 from PyPI wheels,
# see docs/tile-cpp.md "The tile backend"): it is the project's mamba2ssd_gpu_tests with the tile
# cases added, cudart linked statically. Nothing is compiled here. Run from the repository root with
# the git-ignored folder .tile-bin carried along (or at least .tile-bin/mamba2ssd_gpu_tests_tile):
#
#   bash dev/cuda_tile/run_tile_tests_on_gpu.sh            # the tile cases: --gtest_filter='*Tile*'
#   bash dev/cuda_tile/run_tile_tests_on_gpu.sh quick      # the same without the 1M-token case
#   bash dev/cuda_tile/run_tile_tests_on_gpu.sh stages     # only the per-kernel scratch checks
#   bash dev/cuda_tile/run_tile_tests_on_gpu.sh all        # every case of the binary (also the CUDA paths)
#   bash dev/cuda_tile/run_tile_tests_on_gpu.sh --gtest_filter=...   # anything else goes to the binary
#
# Exit status: the test binary's (0: all passed; 77: no GPU visible), 126/127 if it cannot start.
set -u

EXE=.tile-bin/mamba2ssd_gpu_tests_tile
if [[ ! -f "$EXE" ]]; then
  echo "no $EXE here: run from the repo root and carry .tile-bin" >&2
  exit 2
fi
[[ -x "$EXE" ]] || chmod u+x "$EXE" 2>/dev/null || true

echo "===== machine"
if command -v nvidia-smi >/dev/null; then
  nvidia-smi | grep -m1 "Driver Version" || true
  nvidia-smi --query-gpu=name,driver_version,compute_cap,memory.total --format=csv,noheader || true
else
  echo "nvidia-smi not found"
fi
echo "kernel: $(uname -r)   $(ldd --version 2>/dev/null | head -1)"
echo "binary: $EXE ($(stat -c %s "$EXE") bytes)"

case "${1:-}" in
  "") args=(--gtest_filter='*Tile*') ;;
  quick) args=(--gtest_filter='*Tile*:-ForwardTileLong.*') ;;
  stages) args=(--gtest_filter='ForwardTileStages.*') ;;
  all) args=() ;;
  *) args=("$@") ;;
esac

echo "===== $EXE ${args[*]}"
start=$(date +%s)
timeout 580 "$EXE" "${args[@]}"
rc=$?
echo "===== exit status $rc after $(( $(date +%s) - start )) s"
if [[ $rc -eq 124 ]]; then
  echo "timed out (580 s): rerun with 'quick', or a narrower --gtest_filter" >&2
elif [[ $rc -eq 126 || $rc -eq 127 ]]; then
  echo "the binary could not start; its needs:" >&2
  ldd "$EXE" >&2 || true
fi
exit $rc
