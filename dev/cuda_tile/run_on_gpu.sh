#!/usr/bin/env bash
# Issue 7 (CUDA Tile C++) feasibility: run the prebuilt tile programs on the
# GPU machine (H200, driver 580.x) and print everything needed to judge them.
#
# Run from the repository root, with the git-ignored folder .tile-bin/ carried
# along (it is built here by dev/cuda_tile/setup_toolchain.sh; ~9 MB):
#
#   bash dev/cuda_tile/run_on_gpu.sh            # every toolchain in .tile-bin
#   bash dev/cuda_tile/run_on_gpu.sh 13.5       # only one
#
# Nothing is compiled with CUDA here: the GPU machine has nvcc 13.0, which has
# no Tile support. If a prebuilt binary cannot even start (system-library
# mismatch: exit 126/127 or a loader message), it is relinked from the carried
# objects with this machine's g++ and run again; that is labelled "relinked".
#
# Ends with a line "N passed, M failed" and exits non-zero if anything failed.
set -u

BIN=.tile-bin
if [[ ! -d "$BIN" ]]; then
  echo "no $BIN/ here: run from the repo root and carry .tile-bin" >&2
  exit 2
fi

echo "===== machine"
if command -v nvidia-smi >/dev/null; then
  nvidia-smi | grep -m1 "Driver Version" || true
  nvidia-smi --query-gpu=name,driver_version,compute_cap,memory.total \
    --format=csv,noheader || true
else
  echo "nvidia-smi not found"
fi
head -1 /proc/driver/nvidia/version 2>/dev/null || true
echo "kernel: $(uname -r)   $(ldd --version 2>/dev/null | head -1)"

if [[ $# -gt 0 ]]; then
  versions=("$@")
else
  # toolchain folders only (.tile-bin also holds mamba2ssd_gpu_tests_tile, see dev/cuda_tile/run_tile_tests_on_gpu.sh)
  mapfile -t versions < <(find "$BIN" -mindepth 1 -maxdepth 1 -type d -printf "%f\n" | sort -rV)
fi

passed=0
failed=0
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT

# run_one LABEL VERSION PROGRAM [ARGS...]
run_one() {
  local label=$1 ver=$2 prog=$3
  shift 3
  local exe=$BIN/$ver/$prog
  echo
  echo "----- [$ver] $label: $exe $*"
  local out rc
  # (the carried copy may have lost its x bit)
  [[ -x $exe ]] || chmod u+x "$exe" 2>/dev/null || true
  out=$(timeout 300 "$exe" "$@" 2>&1)
  rc=$?
  echo "$out"
  if [[ $rc -eq 126 || $rc -eq 127 ]] ||
     grep -qE "GLIBC|GLIBCXX|error while loading shared libraries|cannot execute" <<<"$out"; then
    echo "(exit $rc: the binary did not start; relinking from $BIN/$ver/obj with $(command -v g++ || echo 'no g++'))"
    local re=$TMP/$ver-$prog
    if [[ ! -x $re ]]; then
      g++ -o "$re" "$BIN/$ver/obj/$prog.o" "$BIN/$ver/obj/libcudart_static.a" \
        -ldl -lpthread -lrt || { echo "relink failed"; }
    fi
    if [[ -x $re ]]; then
      echo "----- [$ver] $label (relinked): $re $*"
      out=$(timeout 300 "$re" "$@" 2>&1)
      rc=$?
      echo "$out"
    fi
  fi
  case $rc in
    0) echo "=> [$ver] $label: PASS"; passed=$((passed + 1)) ;;
    1) echo "=> [$ver] $label: FAIL (wrong results)"; failed=$((failed + 1)) ;;
    2) echo "=> [$ver] $label: FAIL (CUDA error, see above)"; failed=$((failed + 1)) ;;
    124) echo "=> [$ver] $label: FAIL (timed out after 300 s)"; failed=$((failed + 1)) ;;
    *) echo "=> [$ver] $label: FAIL (exit $rc)"; failed=$((failed + 1)) ;;
  esac
}

for ver in "${versions[@]}"; do
  if [[ ! -e $BIN/$ver/vector_add ]]; then
    echo "no $BIN/$ver/vector_add, skipping $ver"
    continue
  fi
  echo
  echo "===== toolchain $ver"
  # vector_add first runs a plain SIMT kernel, then the tile kernel.
  run_one vector_add "$ver" vector_add
  # Each matmul case in its own process: a sticky CUDA error in one case
  # (e.g. an illegal instruction) cannot hide the result of the next.
  for c in f16_nohint f16 bf16 tf32 f32; do
    run_one "matmul/$c" "$ver" matmul "$c"
  done
done

echo
echo "===== summary"
echo "$passed passed, $failed failed"
[[ $failed -eq 0 ]]
