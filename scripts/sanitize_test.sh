#!/usr/bin/env bash
# The CPU test suite (CPU tests and CLI tests) under AddressSanitizer and UndefinedBehaviorSanitizer:
# a CPU-only build (no nvcc, so it stays fast) in its own folder, build-sanitize/ (BUILD_DIR
# overrides it). UBSan runs with -fno-sanitize-recover=all and ASan aborts on its first report, so
# any finding fails the test that made it, and this script exits non-zero. Extra arguments go to ctest.
set -euo pipefail
cd "$(dirname "$0")/.."

build_dir="${BUILD_DIR:-build-sanitize}"
cmake -S . -B "$build_dir" -DCMAKE_BUILD_TYPE=Release -DMAMBA2SSD_CUDA=OFF -DMAMBA2SSD_SANITIZE=ON >/dev/null
cmake --build "$build_dir" -j "$(nproc)"

# halt_on_error: the first report ends the process; print_stacktrace: where UBSan found it.
export ASAN_OPTIONS="${ASAN_OPTIONS:-halt_on_error=1:abort_on_error=0:detect_leaks=1:allocator_may_return_null=0}"
export UBSAN_OPTIONS="${UBSAN_OPTIONS:-halt_on_error=1:print_stacktrace=1}"
ctest --test-dir "$build_dir" --output-on-failure -j "$(nproc)" "$@"
