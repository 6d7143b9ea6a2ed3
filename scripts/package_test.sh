#!/usr/bin/env bash
# Packaging, tried from a consumer's side (docs/packaging.md). Two parts, both by default:
#
#   cmake  1. cmake --install of the CMake build (BUILD_DIR, default build/; scripts/build.sh builds it
#             when missing) into a fresh prefix; checks that exactly the library, its two headers and
#             the CMake package landed there; builds examples/consumer against the prefix (nothing
#             but find_package) and runs it: the CPU forward, and the GPU's when there is one.
#             Then `--component cli` into the same prefix: it adds bin/mamba2ssd and nothing else, and
#             its --version names VERSION's number.
#          2. The same for a CPU-only shared library (MAMBA2SSD_CUDA=OFF, BUILD_SHARED_LIBS=ON, no
#             tests, no CLI), configured and built in build-pkg-cpu-shared/ (incremental).
#   wheel  builds the CPU wheel (MAMBA2SSD_BUILD_CUDA=0 pip wheel --no-build-isolation --no-deps, into
#          build-py/cpu/ like scripts/python_test.sh, so its objects are reused), installs it into a
#          fresh venv with --no-index (PyTorch comes from the system site-packages, nothing is
#          downloaded) and runs scripts/package_smoke.py there.
#
# Usage: scripts/package_test.sh [cmake] [wheel]. PYTHON (default python3) builds the wheel; it needs
# PyTorch (scripts/python_test.sh installs it). Prefixes, consumer builds and the venv live in a
# temporary folder, removed at exit unless KEEP=1.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD

PYTHON=${PYTHON:-python3}
export PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_ROOT_USER_ACTION=ignore
if ! command -v nvcc >/dev/null 2>&1 && [ -x /usr/local/cuda/bin/nvcc ]; then
  export PATH="/usr/local/cuda/bin:$PATH"
fi
jobs=$(nproc)
version=$(head -n 1 VERSION)

parts=("$@")
[ "${#parts[@]}" -gt 0 ] || parts=(cmake wheel)
for part in "${parts[@]}"; do
  case "$part" in cmake | wheel) ;; *) echo "package_test: unknown part '$part' (expected cmake, wheel)" >&2; exit 2 ;; esac
done

tmp=$(mktemp -d "${TMPDIR:-/tmp}/mamba2ssd-package.XXXXXX")
if [ "${KEEP:-0}" = 1 ]; then
  echo "package_test: keeping $tmp"
else
  trap 'rm -rf "$tmp"' EXIT
fi

fail() {
  echo "package_test: FAIL: $*" >&2
  exit 1
}

# The files under a prefix, relative to it, sorted.
installed_files() { (cd "$1" && find . \( -type f -o -type l \) | sed 's|^\./||' | LC_ALL=C sort); }

# install_and_consume BUILD_DIR NAME: installs BUILD_DIR into $tmp/NAME, checks the file list, builds
# examples/consumer against it and runs it.
install_and_consume() {
  local build=$1 name=$2
  local prefix="$tmp/$name" consumer="$tmp/$name-consumer"
  cmake --install "$build" --prefix "$prefix" >"$tmp/$name-install.log"

  local libdir shared cuda
  libdir=$(sed -n 's/^CMAKE_INSTALL_LIBDIR:PATH=//p' "$build/CMakeCache.txt")
  shared=$(sed -n 's/^BUILD_SHARED_LIBS:BOOL=//p' "$build/CMakeCache.txt")
  cuda=$(grep -c '^#define MAMBA2SSD_GPU_TARGETS "..*"' "$build/generated/src/api/build_config.h" || true)
  {
    echo include/mamba2ssd/mamba2ssd.h
    echo include/mamba2ssd/version.h
    for f in Config ConfigVersion Targets Targets-release; do echo "$libdir/cmake/mamba2ssd/mamba2ssd$f.cmake"; done
    if [ "$shared" = ON ]; then
      echo "$libdir/libmamba2ssd.so"
      echo "$libdir/libmamba2ssd.so.${version%.*}"
      echo "$libdir/libmamba2ssd.so.$version"
    else
      echo "$libdir/libmamba2ssd.a"
    fi
  } | LC_ALL=C sort >"$tmp/$name-expected.txt"
  installed_files "$prefix" >"$tmp/$name-installed.txt"
  if ! diff -u "$tmp/$name-expected.txt" "$tmp/$name-installed.txt"; then
    fail "$name: cmake --install put other files under the prefix than the library, its headers and its package (diff above: - expected, + installed)"
  fi
  echo "package_test: $name: installed $(wc -l <"$tmp/$name-installed.txt") files ($([ "$shared" = ON ] && echo shared || echo static), CUDA backend: $([ "$cuda" = 1 ] && echo yes || echo no))"

  # The consumer finds the package through CMAKE_PREFIX_PATH, like any project would.
  cmake -S examples/consumer -B "$consumer" -DCMAKE_PREFIX_PATH="$prefix" -DCMAKE_BUILD_TYPE=Release \
    >"$tmp/$name-consumer-configure.log" 2>&1 || { cat "$tmp/$name-consumer-configure.log"; fail "$name: the consumer does not configure"; }
  grep -q "consumer: mamba2ssd $version from $prefix/" "$tmp/$name-consumer-configure.log" ||
    { cat "$tmp/$name-consumer-configure.log"; fail "$name: the consumer did not find mamba2ssd $version under $prefix"; }
  cmake --build "$consumer" -j "$jobs" >"$tmp/$name-consumer-build.log" 2>&1 ||
    { cat "$tmp/$name-consumer-build.log"; fail "$name: the consumer does not build"; }
  local out
  out=$("$consumer/consumer" 2>&1) || { echo "$out"; fail "$name: the consumer failed"; }
  echo "$out" | sed "s/^/package_test: $name: consumer: /"
  echo "$out" | grep -q '^cpu: .*: PASS$' || fail "$name: the consumer printed no passing CPU forward"
}

cmake_part() {
  local build=${BUILD_DIR:-build}
  if [ ! -f "$build/CMakeCache.txt" ]; then
    echo "package_test: no CMake build in $build: building it (scripts/build.sh)"
    BUILD_DIR=$build scripts/build.sh
  else
    # Up to date: a no-op after scripts/test.sh.
    cmake --build "$build" -j "$jobs" >"$tmp/build.log" 2>&1 || { tail -n 40 "$tmp/build.log"; fail "$build does not build"; }
  fi
  install_and_consume "$build" install

  # The CLI is a component of its own, installed only when asked for: into the same prefix, it adds
  # bin/mamba2ssd and nothing else (from a shared build, it loads the library installed there).
  if grep -q '^MAMBA2SSD_CLI:BOOL=ON' "$build/CMakeCache.txt"; then
    cmake --install "$build" --prefix "$tmp/install" --component cli >/dev/null
    local added line
    added=$(installed_files "$tmp/install" | LC_ALL=C comm -13 "$tmp/install-installed.txt" -)
    [ "$added" = bin/mamba2ssd ] || fail "--component cli installed: $(echo "$added" | tr '\n' ' ')"
    line=$("$tmp/install/bin/mamba2ssd" --version | head -n 1)
    [ "$line" = "mamba2ssd $version" ] || fail "the installed CLI's --version says '$line', expected 'mamba2ssd $version'"
    echo "package_test: cli: $("$tmp/install/bin/mamba2ssd" --version | tr '\n' ';' | sed 's/;$//; s/;/; /g')"
  else
    echo "package_test: cli: not built in $build (MAMBA2SSD_CLI=OFF)"
  fi

  # A CPU-only shared build: no nvcc needed, nothing but the library.
  local cpu_build=build-pkg-cpu-shared
  cmake -S . -B "$cpu_build" -DCMAKE_BUILD_TYPE=Release -DMAMBA2SSD_CUDA=OFF -DBUILD_SHARED_LIBS=ON \
    -DMAMBA2SSD_TESTS=OFF -DMAMBA2SSD_CLI=OFF >"$tmp/cpu-configure.log" || { cat "$tmp/cpu-configure.log"; fail "the CPU-only shared build does not configure"; }
  cmake --build "$cpu_build" -j "$jobs" >"$tmp/cpu-build.log" 2>&1 || { cat "$tmp/cpu-build.log"; fail "the CPU-only shared build does not build"; }
  install_and_consume "$cpu_build" cpu-shared-install
}

wheel_part() {
  "$PYTHON" -c "import torch" 2>/dev/null || fail "$PYTHON cannot import torch (scripts/python_test.sh installs it)"
  local missing=()
  "$PYTHON" -c "import wheel" 2>/dev/null || missing+=(wheel)  # setuptools < 70 builds wheels through it
  "$PYTHON" -c "import ninja" 2>/dev/null || missing+=(ninja)  # parallel compiles
  if [ "${#missing[@]}" -gt 0 ]; then
    echo "package_test: installing ${missing[*]}"
    "$PYTHON" -m pip install -q "${missing[@]}"
  fi

  local start=$SECONDS log="$tmp/wheel-build.log"
  MAMBA2SSD_BUILD_CUDA=0 MAX_JOBS=${MAX_JOBS:-$jobs} "$PYTHON" -m pip wheel -v --no-build-isolation --no-deps \
    -w "$tmp/wheels" . >"$log" 2>&1 || { tail -n 60 "$log"; fail "pip wheel failed"; }
  local wheels=("$tmp/wheels"/mamba2ssd-"$version"-*.whl)
  [ "${#wheels[@]}" = 1 ] && [ -f "${wheels[0]}" ] || fail "expected one wheel mamba2ssd-$version-*.whl, got: $(ls "$tmp/wheels")"
  local wheel=${wheels[0]}
  echo "package_test: wheel: built $(basename "$wheel") in $((SECONDS - start)) s"
  # Only the package: no headers, sources or tests.
  "$PYTHON" - "$wheel" <<'PY' || fail "the wheel holds files outside the mamba2ssd package"
import sys, zipfile
names = zipfile.ZipFile(sys.argv[1]).namelist()
stray = [n for n in names if not (n.startswith("mamba2ssd/") or n.split("/")[0].endswith(".dist-info"))]
print(f"package_test: wheel: {len(names)} files: {', '.join(n for n in names if n.startswith('mamba2ssd/'))}")
for n in stray:
    print(f"package_test: wheel: stray file {n}", file=sys.stderr)
sys.exit(1 if stray or not any(n.startswith("mamba2ssd/_C.") for n in names) else 0)
PY

  # A clean environment that reuses the system's PyTorch. --force-reinstall --no-deps: a mamba2ssd of
  # the same version may sit in the system site-packages (scripts/python_test.sh installs one), and
  # pip would otherwise take it as installed; the wheel's own requirements are checked next.
  # A Python without ensurepip (Debian's without python3-venv) gets a venv without pip, driven by
  # this Python's pip (--python, pip 22.3 or newer).
  local venv="$tmp/venv" venv_pip
  if "$PYTHON" -m venv --system-site-packages "$venv" >"$tmp/venv.log" 2>&1; then
    venv_pip=("$venv/bin/python" -m pip)
  else
    echo "package_test: no ensurepip here ($(tail -n 1 "$tmp/venv.log")): a venv without pip, filled by $PYTHON's pip"
    rm -rf "$venv"
    "$PYTHON" -m venv --system-site-packages --without-pip "$venv"
    venv_pip=("$PYTHON" -m pip --python "$venv/bin/python")
  fi
  "${venv_pip[@]}" install -q --no-index --no-deps --force-reinstall "$wheel"
  local broken
  broken=$("${venv_pip[@]}" check 2>&1 | grep '^mamba2ssd ' || true)
  [ -z "$broken" ] || fail "the wheel's requirements are not met: $broken"
  (cd "$tmp" && "$venv/bin/python" "$root/scripts/package_smoke.py" "$version") || fail "the smoke test failed in the venv"
}

for part in "${parts[@]}"; do
  "${part}_part"
done
echo "package_test: all passed (${parts[*]})"
