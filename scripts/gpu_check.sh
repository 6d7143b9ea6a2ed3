#!/usr/bin/env bash
# Builds mamba2ssd on a machine with an NVIDIA GPU and, in one go, runs the GPU tests,
# compute-sanitizer on a representative subset, the check sweep (forward and backward), and a short
# timing of the default problem (forward, then forward + backward) and of the default decode step.
# Ends with a summary table. Usage: scripts/gpu_check.sh [build-dir]
# Each step's log is kept; with $OUT set they are packed into $OUT/gpu_check_logs.tar.gz.
set -uo pipefail
cd "$(dirname "$0")/.."
build=${1:-build-gpu}
log=$(mktemp -d)
declare -A result

step() {  # step NAME COMMAND...: runs, tees the log, records PASS/FAIL
  local name=$1; shift
  echo "=== $name: $*"
  if "$@" 2>&1 | tee "$log/$name.log"; then result[$name]=PASS; else result[$name]=FAIL; fi
}

nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
step configure cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=Release
step build cmake --build "$build" -j "$(nproc)"
step gpu_tests "$build/tests/mamba2ssd_gpu_tests" --gtest_brief=1
if command -v compute-sanitizer >/dev/null; then
  # fp32 and fp16 at both chunk lengths, packed sequences (with and without varlen states), everything
  # at once; every CUDA path that takes each (three-kernel, fused, hopper).
  subset='Matrix/ForwardCuda.MatchesOracle/case1:Matrix/ForwardCuda.MatchesOracle/case3:Matrix/ForwardCuda.MatchesOracle/case4:Matrix/ForwardCuda.MatchesOracle/case43:Matrix/ForwardCuda.MatchesOracle/case50:Matrix/ForwardCuda.MatchesOracle/case52:Matrix/ForwardCuda.MatchesOracle/case56:ForwardCudaRuns.*:Wgmma.*'
  # the decode step: its matrix, several tokens, slots outside the cache, aliasing (not the serving sizes)
  subset="$subset:Features/DecodeCuda.*:DecodeCudaRuns.MultiTokenEveryLayout:DecodeCudaRuns.SlotsOutsideTheCacheAreSkipped:DecodeCudaRuns.AliasingStaysInsideTheSlotsNamed"
  # memcheck also over each kernel's intermediates and the tile layer's unit tests (9 s on the H200)
  step memcheck compute-sanitizer --tool memcheck --error-exitcode 1 "$build/tests/mamba2ssd_gpu_tests" --gtest_filter="$subset:Kernels/Intermediates.*:Tile*" --gtest_brief=1
  step racecheck compute-sanitizer --tool racecheck --error-exitcode 1 "$build/tests/mamba2ssd_gpu_tests" --gtest_filter="$subset" --gtest_brief=1
fi
step cli_check "$build/cli/mamba2ssd" check --impl cuda
step run_default "$build/cli/mamba2ssd" run --repeats 20
step decode_default "$build/cli/mamba2ssd" decode --impl cuda
step run_backward "$build/cli/mamba2ssd" run --backward --repeats 20
if [ -z "${SKIP_PYTHON:-}" ] && python3 -c 'import torch; assert torch.cuda.is_available()' 2>/dev/null; then
  step python_tests scripts/python_test.sh
fi

echo
echo "| step | result |"
echo "|---|---|"
for k in configure build gpu_tests memcheck racecheck cli_check run_default decode_default python_tests; do
  [ -n "${result[$k]:-}" ] && echo "| $k | ${result[$k]} |"
done
[ -n "${OUT:-}" ] && tar -czf "$OUT/gpu_check_logs.tar.gz" -C "$log" .
for k in "${!result[@]}"; do [ "${result[$k]}" = PASS ] || exit 1; done
