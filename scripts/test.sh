#!/usr/bin/env bash
# Builds (scripts/build.sh) and runs the whole test suite: the CPU tests, the CLI's tests and the GPU
# tests, which CTest lists as skipped on a machine without a GPU. BUILD_DIR overrides the folder.
set -euo pipefail
cd "$(dirname "$0")/.."

scripts/build.sh "$@"
ctest --test-dir "${BUILD_DIR:-build}" --output-on-failure -j "$(nproc)"
