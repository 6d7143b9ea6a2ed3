#!/usr/bin/env bash
# Issue 7 (CUDA Tile C++) feasibility: fetch a CUDA 13.3+ compiler from PyPI
# wheels, unpack it into the git-ignored .tile-nvcc/, and build the two
# self-checking tile programs for the H200 (sm_90) into .tile-bin/.
#
# Usage (from anywhere inside the repo):
#   dev/cuda_tile/setup_toolchain.sh            # toolchain 13.5 (default)
#   dev/cuda_tile/setup_toolchain.sh 13.3       # the first Tile C++ release
#   dev/cuda_tile/setup_toolchain.sh all        # both
#   SKIP_DOWNLOAD=1 ...                            # reuse wheels already there
#
# Needs: python3 + pip (PyPI reachable), unzip, g++ (12 is what it was tried
# with), about 450 MB of disk per toolchain. No GPU needed. Never touches the
# system CUDA in /usr/local/cuda.
#
# Result:
#   .tile-nvcc/wheels/<ver>/*.whl     the downloaded wheels (pinned, --no-deps)
#   .tile-nvcc/cuda-<ver>/            a CUDA root: bin/nvcc, nvvm/bin/cicc, ...
#   .tile-nvcc/out/<ver>/             build outputs, SASS listings
#   .tile-bin/<ver>/{vector_add,matmul}   what travels to the GPU machine
#   .tile-bin/<ver>/obj/              relocatable objects + libcudart_static.a
#                                     (run_on_gpu.sh relinks from these if the
#                                     prebuilt binaries cannot start there)
#   .tile-bin/<ver>/inspect.txt       what the fat binaries contain
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
SRC=$ROOT/dev/cuda_tile
TC=$ROOT/.tile-nvcc
BIN=$ROOT/.tile-bin

# Pinned wheel versions per toolchain. nvidia-cuda-nvcc and
# nvidia-cuda-tileiras declare *unpinned* dependencies (nvidia-nvvm,
# nvidia-cuda-runtime, nvidia-cuda-crt, nvidia-nvjitlink), so a plain
# `pip install nvidia-cuda-nvcc==13.3.x` pulls the newest 13.5 of those: we
# download with --no-deps and pin every piece to the same major.minor.
wheels_for() {
  case "$1" in
    13.5)
      echo nvidia-cuda-nvcc==13.5.37 nvidia-cuda-crt==13.5.37 \
           nvidia-nvvm==13.5.37 nvidia-cuda-runtime==13.5.37 \
           nvidia-cuda-tileiras==13.5.37 nvidia-cuda-cuobjdump==13.5.37 \
           nvidia-cuda-nvdisasm==13.5.37 ;;
    13.3)
      # 13.3 has no single build number across packages: nvcc/crt/nvvm
      # 13.3.73, runtime 13.3.29 (only 13.3 runtime on PyPI), tileiras
      # 13.3.36 (only 13.3 tileiras on PyPI).
      echo nvidia-cuda-nvcc==13.3.73 nvidia-cuda-crt==13.3.73 \
           nvidia-nvvm==13.3.73 nvidia-cuda-runtime==13.3.29 \
           nvidia-cuda-tileiras==13.3.36 nvidia-cuda-cuobjdump==13.3.73 \
           nvidia-cuda-nvdisasm==13.3.73 ;;
    *) echo "unknown toolchain version '$1' (want 13.5, 13.3 or all)" >&2
       return 1 ;;
  esac
}

# The Tile kernels need -enable-tile and C++20, and a real sm_80+ target:
# with no target nvcc builds for sm_75, silently emits no tile code, and the
# launch fails at run time. For sm_90 tileiras always emits an sm_90a cubin
# (wgmma/TMA), whatever -gencode says; the SIMT part follows -gencode.
# cudart is linked statically (the GPU machine has only its 13.0 runtime);
# libstdc++ stays dynamic on purpose: linking it statically raised the glibc
# the binaries need from 2.34 to 2.36 (arc4random), while dynamically they
# need only GLIBC_2.34 and GLIBCXX_3.4.
# shellcheck disable=SC2054  # the commas belong to -gencode
NVCC_FLAGS=(-enable-tile -std=c++20 -O2
            -gencode arch=compute_90,code=sm_90
            -cudart static)
PROGRAMS=(vector_add matmul)

setup_one() {
  local ver=$1
  local whl=$TC/wheels/$ver cuda=$TC/cuda-$ver out=$TC/out/$ver
  local bin=$BIN/$ver
  echo "=== toolchain $ver"

  # 1. download -----------------------------------------------------------
  mkdir -p "$whl"
  if [[ "${SKIP_DOWNLOAD:-0}" != 1 ]]; then
    # shellcheck disable=SC2046
    python3 -m pip download --quiet --no-deps --only-binary=:all: \
      --dest "$whl" $(wheels_for "$ver")
  fi
  ls -1 "$whl"

  # 2. unpack: every wheel is rooted at nvidia/cu13/{bin,include,lib,nvvm},
  #    which together form a CUDA root that bin/nvcc.profile describes
  #    relative to itself (TOP = $(_HERE_)/..).
  rm -rf "$cuda" "$TC/stage-$ver"
  mkdir -p "$TC/stage-$ver"
  for w in "$whl"/*.whl; do
    unzip -q -o "$w" -d "$TC/stage-$ver"
  done
  mv "$TC/stage-$ver/nvidia/cu13" "$cuda"
  mkdir -p "$cuda/dist-info"
  mv "$TC/stage-$ver"/*.dist-info "$cuda/dist-info/"
  rm -rf "$TC/stage-$ver"
  # The wheels store the executables as rwxr--r--: fine for root, not for
  # anyone else.
  chmod a+rx "$cuda"/bin/* "$cuda"/nvvm/bin/* 2>/dev/null || true

  for f in bin/nvcc bin/nvcc.profile bin/cudafe++ bin/ptxas bin/fatbinary \
           bin/nvlink bin/tileiras nvvm/bin/cicc nvvm/libdevice/libdevice.10.bc \
           include/cuda_tile.h include/crt/cuda_tile.h include/cuda_runtime.h \
           lib/libcudart_static.a lib/libnvvm.so.4; do
    [[ -e "$cuda/$f" ]] || { echo "missing $cuda/$f" >&2; return 1; }
  done

  # tileiras loads libnvvm at run time. Called by nvcc it finds the right
  # one (nvcc exports CUDA_ROOT); called by hand with CUDA_HOME pointing at
  # an older toolkit it loads *that* libnvvm and fails with only
  # "error: failed to compile Tile IR program". Keep CUDA_HOME away.
  unset CUDA_HOME CUDA_PATH
  export CUDA_ROOT=$cuda

  "$cuda/bin/nvcc" --version | tail -2
  "$cuda/bin/tileiras" --version | sed -n 4p
  echo "tileiras bytecode versions: $("$cuda/bin/tileiras" --list-versions | tr '\n' ' ')"

  # 3. build --------------------------------------------------------------
  rm -rf "$out" "$bin"
  mkdir -p "$out/obj" "$bin/obj"
  for p in "${PROGRAMS[@]}"; do
    echo "--- nvcc ${NVCC_FLAGS[*]} -o $p $p.cu"
    "$cuda/bin/nvcc" "${NVCC_FLAGS[@]}" -o "$out/$p" "$SRC/$p.cu"
    # The same translation unit as a relocatable object, for relinking on
    # the GPU machine with its own g++ if the prebuilt binary cannot start
    # there (different system libraries).
    "$cuda/bin/nvcc" "${NVCC_FLAGS[@]}" -c -o "$out/obj/$p.o" "$SRC/$p.cu"
  done
  cp "$cuda/lib/libcudart_static.a" "$out/obj/"

  # 4. inspect ------------------------------------------------------------
  {
    echo "# toolchain $ver: $("$cuda/bin/nvcc" --version | tail -1)"
    echo "# flags: ${NVCC_FLAGS[*]}"
    for p in "${PROGRAMS[@]}"; do
      echo
      echo "## $p"
      "$cuda/bin/cuobjdump" -lelf -lptx "$out/$p" 2>&1 || true
      local tmp
      tmp=$(mktemp -d)
      (cd "$tmp" && "$cuda/bin/cuobjdump" -xelf all "$out/$p" >/dev/null)
      for c in "$tmp"/*.cubin; do
        echo "### $(basename "$c")"
        "$cuda/bin/cuobjdump" -elf "$c" 2>/dev/null |
          grep -E "Language:|Tool Version|CUDA Virtual SM|CUDA Tool Kit" |
          sed 's/^[[:space:]]*/  /' | sort -u || true
        # threads per block the tile compiler chose (launch says 1)
        "$cuda/bin/cuobjdump" -elf "$c" 2>/dev/null |
          awk '/^\.nv\.info\./{k=substr($1,10)} /EIATTR_REQNTID/{r=1; next}
               r && /Value:/{sub(/.*Value:[ \t]*/,""); print "  REQNTID " k ": " $0; r=0}' || true
        PATH=$cuda/bin:$PATH "$cuda/bin/cuobjdump" -sass "$c" \
          > "$out/$p.$(basename "$c" .cubin).sass" 2>&1 || true
        awk '/Function :/{f=$3}
             / (HGMMA|HMMA|FFMA|FMUL|FADD|UTMALDG|UTMASTG|UBLKCP|LDGSTS|LDG|STG|LDL|STL)[ .]/{
               split($0,a,";"); sub(/.*\*\/ */,"",a[1]); split(a[1],w," ");
               op = (w[1] ~ /^@/) ? w[2] : w[1];
               print "  " f " " op}' \
          "$out/$p.$(basename "$c" .cubin).sass" | sort | uniq -c || true
      done
      rm -rf "$tmp"
    done
    echo
    echo "## host-side needs"
    for p in "${PROGRAMS[@]}"; do
      echo "$p: $(readelf -d "$out/$p" | grep -oE 'NEEDED.*\[.*\]' |
                   grep -oE '\[.*\]' | tr '\n' ' ')"
      echo "  newest symbol versions: $(objdump -T "$out/$p" |
             grep -oE 'GLIBC(XX)?_[0-9.]+' | sort -V | uniq |
             awk -F_ '{v[$1]=$0} END{for (k in v) printf "%s ", v[k]}')"
    done
  } > "$out/inspect.txt"

  # 5. stage what travels ---------------------------------------------------
  for p in "${PROGRAMS[@]}"; do
    cp "$out/$p" "$bin/$p"
    cp "$out/obj/$p.o" "$bin/obj/"
  done
  cp "$out/obj/libcudart_static.a" "$bin/obj/"
  cp "$out/inspect.txt" "$bin/inspect.txt"
  echo "--- staged in $bin:"
  (cd "$bin" && ls -l "${PROGRAMS[@]}" obj inspect.txt)
}

mode=${1:-13.5}
if [[ "$mode" == all ]]; then
  setup_one 13.5
  setup_one 13.3
else
  setup_one "$mode"
fi
echo "=== .tile-bin total: $(du -sh "$BIN" | cut -f1)"
