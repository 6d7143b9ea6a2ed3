#!/usr/bin/env bash
# Where the forward's time goes, on a machine with an NVIDIA GPU and Nsight Compute: builds (if
# needed), profiles one `mamba2ssd run` of the headline shape (or the CLI flags given) with ncu's full
# set, and prints each kernel's duration, instruction count and tensor-pipe use, then the SASS hot
# spots of every kernel (bench/sass_hotspots.py). The report and the SASS table go to $OUT (or
# build-gpu/profile): open prof.ncu-rep in Nsight Compute for the rest.
# Usage: scripts/gpu_profile.sh [mamba2ssd run flags, e.g. --path fused --dstate 64]
# Environment (optional): CLI, a mamba2ssd binary to profile instead of building one; KERNELS, the
# kernel-name regex (default: the forward's kernels); LAUNCHES, how many launches to profile (8).
# The backward's Hopper kernels, for example:
#   KERNELS='chunk_grads_sm90|chunk_dbc_sm90|chunk_walks_sm90' LAUNCHES=4 scripts/gpu_profile.sh --backward
set -euo pipefail
cd "$(dirname "$0")/.."
build=build-gpu
out=${OUT:-$build/profile}
mkdir -p "$out"
cli=${CLI:-$build/cli/mamba2ssd}
[ -n "${CLI:-}" ] || [ -x "$cli" ] || { cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=Release >/dev/null &&
                                        cmake --build "$build" -j "$(nproc)" --target mamba2ssd_cli >/dev/null; }
ncu -k regex:"${KERNELS:-chunk_|segment_|varlen}" --launch-count "${LAUNCHES:-8}" --set full -f -o "$out/prof" \
  "$cli" run --repeats 1 "$@" > "$out/ncu.log" 2>&1
ncu -i "$out/prof.ncu-rep" --page raw --csv \
  --metrics gpu__time_duration.sum,smsp__inst_executed.sum,sm__pipe_tensor_op_gmma_cycles_active.avg.pct_of_peak_sustained_active,sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active,sm__throughput.avg.pct_of_peak_sustained_elapsed,dram__throughput.avg.pct_of_peak_sustained_elapsed \
  > "$out/metrics.csv"
python3 - "$out/metrics.csv" <<'PY'
import csv, sys
rows = list(csv.reader(open(sys.argv[1])))
head, data = rows[0], rows[2:]  # the second row holds the units
col = {c: i for i, c in enumerate(head)}
short = {"gpu__time_duration.sum": "time", "smsp__inst_executed.sum": "warp instr",
         "sm__pipe_tensor_op_gmma_cycles_active.avg.pct_of_peak_sustained_active": "wgmma %",
         "sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active": "mma.sync %",
         "sm__throughput.avg.pct_of_peak_sustained_elapsed": "SM %",
         "dram__throughput.avg.pct_of_peak_sustained_elapsed": "DRAM %"}
print("kernel | " + " | ".join(short.values()) + " (time in " + rows[1][col["gpu__time_duration.sum"]] + ")")
for r in data:
    print(r[col["Kernel Name"]][:70] + " | " + " | ".join(r[col[m]] if m in col else "-" for m in short))
PY
ncu -i "$out/prof.ncu-rep" --page source --print-source sass --csv > "$out/sass.csv" 2>/dev/null
python3 bench/sass_hotspots.py "$out/sass.csv" --top 20 --buckets 20 --phases
