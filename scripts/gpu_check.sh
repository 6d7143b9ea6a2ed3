#!/usr/bin/env bash
# Builds mamba2ssd on a machine with an NVIDIA GPU and, in one go, runs the GPU tests,
# compute-sanitizer on a representative subset, and a short timing of the default problem.
# Ends with a summary table. Usage: scripts/gpu_check.sh [build-dir]   (logs go to $OUT if set)
set -uo pipefail
cd "$(dirname "$0")/.."
build=${1:-build-gpu}
log=${OUT:-/tmp}
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
  subset='Matrix/ForwardCuda.MatchesOracle/case3:Matrix/ForwardCuda.MatchesOracle/case4:Matrix/ForwardCuda.MatchesOracle/case40:Matrix/ForwardCuda.MatchesOracle/case46:ForwardCudaRuns.*'
  step memcheck compute-sanitizer --tool memcheck --error-exitcode 1 "$build/tests/mamba2ssd_gpu_tests" --gtest_filter="$subset" --gtest_brief=1
  step racecheck compute-sanitizer --tool racecheck --error-exitcode 1 "$build/tests/mamba2ssd_gpu_tests" --gtest_filter="$subset" --gtest_brief=1
fi
if [ -x "$build/cli/mamba2ssd" ] && "$build/cli/mamba2ssd" --help >/dev/null 2>&1; then
  step run_default "$build/cli/mamba2ssd" run --repeats 20
fi

echo
echo "| step | result |"
echo "|---|---|"
for k in configure build gpu_tests memcheck racecheck run_default; do
  [ -n "${result[$k]:-}" ] && echo "| $k | ${result[$k]} |"
done
for k in "${!result[@]}"; do [ "${result[$k]}" = PASS ] || exit 1; done
