#!/usr/bin/env bash
# The SASS of one CUDA source on the development machine (no GPU needed): compiles it for sm_90a with
# the library's flags to a cubin, disassembles it with cuobjdump, and prints per kernel (names
# matching PATTERN) the instruction count and the instructions that matter for wgmma kernels: R2UR
# (a value moved into a uniform register, e.g. a descriptor built from a per-thread value), HGMMA,
# BAR, SHFL. With BASE (a .sass file from an earlier run) it prints the change from it.
#
# Usage: scripts/sass.sh SOURCE.cu [PATTERN] [BASE.sass]
#   e.g. scripts/sass.sh src/cuda/bwd/kernels_sm90.cu chunk_grads
# The full disassembly is left in /tmp/mamba2ssd-sass/<source name>.sass (pass it as BASE later).
#
# cuobjdump is not in this machine's CUDA install: the first run takes it and nvdisasm from PyPI
# (nvidia-cuda-cuobjdump, nvidia-cuda-nvdisasm) into $SASS_TOOLS (default /tmp/mamba2ssd-sass/tools).
set -euo pipefail
cd "$(dirname "$0")/.."
src=${1:?usage: scripts/sass.sh SOURCE.cu [PATTERN] [BASE.sass]}
pattern=${2:-}
base=${3:-}
[ -f "$src" ] || { echo "sass.sh: no such source: $src" >&2; exit 1; }
[ -z "$base" ] || [ -f "$base" ] || { echo "sass.sh: no such base: $base" >&2; exit 1; }
work=/tmp/mamba2ssd-sass
tools=${SASS_TOOLS:-$work/tools}
mkdir -p "$work"
cuobjdump=$(command -v cuobjdump || true)
if [ -z "$cuobjdump" ]; then
  cuobjdump=$(find "$tools" -name cuobjdump -type f 2>/dev/null | head -n 1 || true)
  if [ -z "$cuobjdump" ]; then
    echo "sass.sh: fetching cuobjdump and nvdisasm (nvidia-cuda-cuobjdump, -nvdisasm) into $tools" >&2
    python3 -m pip download -q --no-deps -d "$tools/dl" nvidia-cuda-cuobjdump nvidia-cuda-nvdisasm
    for w in "$tools"/dl/*.whl; do python3 -m zipfile -e "$w" "$tools"; done
    cuobjdump=$(find "$tools" -name cuobjdump -type f | head -n 1)
    chmod +x "$(dirname "$cuobjdump")"/*
  fi
  export PATH="$(dirname "$cuobjdump"):$PATH"  # cuobjdump runs nvdisasm from its own folder
fi
command -v nvcc >/dev/null 2>&1 || export PATH="/usr/local/cuda/bin:$PATH"

# The library's CUDA defines and flags (CMakeLists.txt), without a build tree: generated headers
# are not needed by the kernels' sources.
out="$work/$(basename "$src" .cu).sass"
nvcc -DMAMBA2SSD_HAVE_CUDA=1 -DMAMBA2SSD_SM90A_CODE=1 -Iinclude -Isrc -O3 -DNDEBUG \
  -gencode=arch=compute_90a,code=sm_90a --expt-relaxed-constexpr -std=c++17 -cubin -o "$work/k.cubin" "$src"
"$cuobjdump" -sass "$work/k.cubin" > "$out.new"

python3 - "$out.new" "$pattern" "$base" <<'EOF'
import collections, re, sys
def kernels(path):
    ks, cur = {}, None
    for line in open(path):
        m = re.search(r"Function : (\S+)", line)
        if m:
            cur = m.group(1); ks[cur] = []; continue
        m = re.match(r"\s+/\*[0-9a-f]{4,}\*/\s+(.*?);", line)
        if m and cur:
            ks[cur].append(m.group(1))
    return ks
def stats(ins):
    c = collections.Counter()
    for i in ins:
        op = [t for t in i.split() if not t.startswith("@")][0].split(".")[0]
        c[op] += 1
    return c
new, pattern = kernels(sys.argv[1]), sys.argv[2]
base = kernels(sys.argv[3]) if sys.argv[3] else {}
ops = ["R2UR", "HGMMA", "BAR", "SHFL"]
print(f"{'kernel':72s} {'instr':>6s} " + " ".join(f"{o:>6s}" for o in ops))
for k, ins in new.items():
    if pattern not in k:
        continue
    c = stats(ins)
    row = f"{k[:72]:72s} {len(ins):6d} " + " ".join(f"{c[o]:6d}" for o in ops)
    if k in base:
        b = stats(base[k])
        row += f"   was {len(base[k])} " + " ".join(f"{o} {b[o]}" for o in ops if b[o] != c[o])
        same = [re.sub(r"0x[0-9a-f]+", "X", i) for i in ins] == [re.sub(r"0x[0-9a-f]+", "X", i) for i in base[k]]
        row += "  (identical)" if same else ""
    print(row)
EOF
mv "$out.new" "$out"
echo "sass.sh: disassembly in $out" >&2
