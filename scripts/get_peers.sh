#!/usr/bin/env bash
# Fetches the peers that bench/bench.py and bench/bench_decode.py compare against into the git-ignored folder .peers/, laid
# out so that they import from a plain folder (no install, no network needed afterwards):
#
#   .peers/mamba_ssm/   mamba_ssm 2.3.2.post1: only the Triton SSD files of ops/triton (the chunked
#                       scan, and selective_state_update for bench/bench_decode.py) and the two
#                       utils modules they import, under a stub __init__.py (the package's own
#                       __init__ imports the model code and its CUDA extensions)
#   .peers/fla/         fla-core 0.6.0 (module `fla`): since 0.5, flash-linear-attention is split
#                       into fla-core (the Triton ops, this folder) and flash-linear-attention (the
#                       layers and models, which need transformers); the ops are all the bench uses
#   .peers/_deps/       pure-python wheels the peers import (einops, packaging), unpacked; bench.py
#                       puts this folder LAST on sys.path, so copies already installed win
#
# The peers' code stays in .peers/ (never committed). Usage: scripts/get_peers.sh [dest]  (default
# .peers). Needs pip and network (PyPI); not torch: the source distributions are fetched as files
# from PyPI's JSON API, so that no setup.py runs (mamba_ssm's imports torch even for its metadata).
set -euo pipefail
cd "$(dirname "$0")/.."
dest=${1:-.peers}
MAMBA=2.3.2.post1
FLA=0.6.0
EINOPS=0.8.1
PACKAGING=24.2

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
py=${PYTHON:-python3}

sdist() {  # sdist NAME VERSION: the source distribution of NAME==VERSION, downloaded into $tmp
  "$py" - "$1" "$2" "$tmp" <<'PY'
import hashlib, json, os, sys, urllib.parse, urllib.request
name, version, dest = sys.argv[1:]
index = f"https://pypi.org/pypi/{name}/json"
with urllib.request.urlopen(index) as r:
    files = [f for f in json.load(r)["releases"].get(version, []) if f["packagetype"] == "sdist"]
if not files:
    sys.exit(f"get_peers: PyPI lists no source distribution of {name}=={version}")
f = files[0]
path = os.path.join(dest, f["filename"])
with urllib.request.urlopen(urllib.parse.urljoin(index, f["url"])) as r, open(path, "wb") as out:  # (mirrors answer relative URLs)
    out.write(r.read())
if hashlib.sha256(open(path, "rb").read()).hexdigest() != f["digests"]["sha256"]:
    sys.exit(f"get_peers: {f['filename']}: sha256 differs from PyPI's")
print(path)
PY
}

rm -rf "$dest"
mkdir -p "$dest/_deps"

# --- mamba_ssm: the SSD Triton files, under a stub package -------------------------------------
tar -xzf "$(sdist mamba_ssm "$MAMBA")" -C "$tmp"
src="$tmp/mamba_ssm-$MAMBA/mamba_ssm"
m="$dest/mamba_ssm"
mkdir -p "$m/ops/triton" "$m/utils"
printf '# Stub written by scripts/get_peers.sh: the SSD Triton ops only, not the model code.\n__version__ = "%s"\n' "$MAMBA" >"$m/__init__.py"
: >"$m/ops/__init__.py"
: >"$m/ops/triton/__init__.py"
: >"$m/utils/__init__.py"
# ssd_combined.py and what it imports (checked by grep in 2.3.2.post1; causal_conv1d is optional there),
# and the decode step's selective_state_update.py (it imports triton, einops and softplus.py, listed)
for f in ssd_combined ssd_bmm ssd_chunk_state ssd_state_passing ssd_chunk_scan layernorm_gated \
         k_activations softplus selective_state_update; do
  cp "$src/ops/triton/$f.py" "$m/ops/triton/"
done
cp "$src/utils/torch.py" "$src/utils/determinism.py" "$m/utils/"
cp "$tmp/mamba_ssm-$MAMBA/LICENSE" "$m/LICENSE"

# --- fla-core: the whole `fla` package, less tests -----------------------------------------------
tar -xzf "$(sdist fla-core "$FLA")" -C "$tmp"
cp -r "$tmp/fla_core-$FLA/fla" "$dest/fla"
cp "$tmp/fla_core-$FLA/LICENSE" "$dest/fla/LICENSE"
find "$dest" -depth \( -name tests -o -name __pycache__ -o -name csrc -o -name docs \) -type d -exec rm -rf {} +

# --- pure-python dependencies (fallbacks: the GPU machine has einops; packaging usually) ------------
"$py" -m pip download --quiet --no-deps --only-binary :all: "einops==$EINOPS" "packaging==$PACKAGING" -d "$tmp/whl" >&2
for w in "$tmp"/whl/*.whl; do
  "$py" -m zipfile -e "$w" "$dest/_deps/"
done

cat >"$dest/VERSIONS" <<EOF
mamba_ssm $MAMBA (sdist, ops/triton SSD files and selective_state_update only)
fla-core $FLA (sdist, module fla)
einops $EINOPS, packaging $PACKAGING (wheels, in _deps/)
EOF
echo "peers in $dest ($(du -sh "$dest" | cut -f1)):"
cat "$dest/VERSIONS"
