#!/usr/bin/env bash
# Builds causal-conv1d (the CUDA extension mamba_ssm's fused Mamba-2 layer call uses for its
# convolution) for the GPU machine, into the git-ignored .peers/wheels/, so that bench/bench_layer.py
# can time mamba_ssm's own mamba_split_conv1d_scan_combined instead of its unfused path. The peer's
# code stays in .peers/ (never committed): the sdist is unpacked in .peers/_build/ and its list of
# GPU targets cut to sm_90 (its setup.py compiles for sm_75 to sm_121, about ten times the work;
# the GPU machine is Hopper), then built here against the device's torch (scripts/device_wheel.sh's
# venv: CPython 3.12, torch 2.11.0 with CUDA 13.0).
#
# Usage: scripts/peer_causal_conv1d.sh            (then carry .peers; on the GPU machine:
#   python3 -m pip install --no-deps --target /tmp/site_peers .peers/wheels/causal_conv1d-*.whl
#   and put /tmp/site_peers on PYTHONPATH; bench_layer.py's row then says "mamba_ssm")
# Needs nvcc, network the first time (PyPI), and the venv of scripts/device_wheel.sh (VENV).
set -euo pipefail
cd "$(dirname "$0")/.."
VERSION=${CAUSAL_CONV1D_VERSION:-1.7.0}
venv=${VENV:-/tmp/mamba2ssd-py312}
[ -x "$venv/bin/python" ] || { echo "peer_causal_conv1d: no venv at $venv (run scripts/device_wheel.sh first)" >&2; exit 1; }
command -v nvcc >/dev/null 2>&1 || export PATH="/usr/local/cuda/bin:$PATH"

build=.peers/_build
mkdir -p "$build" .peers/wheels
if [ ! -d "$build/causal_conv1d-$VERSION" ]; then
  "$venv/bin/pip" download -q --no-deps --no-binary :all: --no-build-isolation "causal-conv1d==$VERSION" -d "$build"
  tar -C "$build" -xzf "$build/causal_conv1d-$VERSION.tar.gz"
fi
src=$build/causal_conv1d-$VERSION
# Every `cc_flag.append("arch=compute_XX,code=sm_XX")` but sm_90's, with the "-gencode" before it, goes.
"$venv/bin/python" - "$src/setup.py" <<'PY'
import re, sys
path = sys.argv[1]
text = open(path).read()
pattern = r'^([ \t]*)cc_flag\.append\("-gencode"\)\n[ \t]*cc_flag\.append\("arch=compute_(\d+),code=sm_\d+"\)'
kept = re.sub(pattern, lambda m: m.group(0) if m.group(2) == "90" else f"{m.group(1)}pass", text, flags=re.M)
if "arch=compute_90,code=sm_90" not in kept or kept.count("arch=compute_") != 1:
    sys.exit("peer_causal_conv1d: setup.py's GPU targets are not as expected; look at " + path)
open(path, "w").write(kept)
PY
rm -f .peers/wheels/causal_conv1d-*.whl
(cd "$src" && CAUSAL_CONV1D_FORCE_BUILD=TRUE MAX_JOBS=${MAX_JOBS:-$(nproc)} PATH="$venv/bin:$PATH" \
   "$venv/bin/pip" wheel -q --no-build-isolation --no-deps -w ../../wheels .)
ls -l .peers/wheels/causal_conv1d-*.whl
