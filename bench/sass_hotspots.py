#!/usr/bin/env python3
"""Where a kernel's time goes, from Nsight Compute's source page (SASS), as text.

    ncu -k regex:chunk_scan --launch-count 4 --set full -o prof <program>
    ncu -i prof.ncu-rep --page source --print-source sass --csv > sass.csv
    python3 bench/sass_hotspots.py sass.csv [--kernel SUBSTRING] [--top 30] [--buckets 30] [--phases]

For each kernel in the file (or those whose name contains --kernel): the total warp-stall samples
and instructions executed, the stall reasons summed over the kernel, the opcodes by samples and by
instructions, the top instructions by samples with their two main stall reasons, and the code cut
into equal address buckets (samples per bucket, the bucket's main opcodes) to see which phase of a
kernel the samples fall in. With --phases, also the code cut at its synchronization: each
barrier, mbarrier wait or arrive, wgmma arrive or wait, bulk store, fence and exit in address
order, with how often it ran, and the samples and instructions of the stretch after it up to the
next one (an mbarrier wait's out-of-line retry shows as a landmark that ran more often than its
loop).
"""

import argparse
import collections
import csv
import io
import re


def sections(path):
    """(kernel name, header, rows) for each kernel in an ncu --page source --csv dump."""
    lines = open(path, encoding="utf-8", errors="replace").read().split("\n")
    starts = [i for i, line in enumerate(lines) if line.startswith('"Kernel Name"')]
    for k, i in enumerate(starts):
        j = starts[k + 1] if k + 1 < len(starts) else len(lines)
        name = next(csv.reader([lines[i]]))[1]
        rows = list(csv.reader(io.StringIO("\n".join(lines[i + 1:j]))))
        if rows:
            yield name, rows[0], [r for r in rows[1:] if len(r) == len(rows[0])]


def opcode(source):
    text = re.sub(r"^@!?U?P\w+\s+", "", source.strip())
    return text.split(" ")[0].split(".")[0] if text else "?"


def num(x):
    try:
        return float(x)
    except ValueError:
        return 0.0


def columns(header, rows):
    """The columns read: by name, the samples', the executions', the stall reasons'; the total samples."""
    col = {c: i for i, c in enumerate(header)}
    samples, executed = col["Warp Stall Sampling (All Samples)"], col["Instructions Executed"]
    stalls = [c for c in header if c.startswith("stall_") and "Not Issued" not in c]
    return col, samples, executed, stalls, sum(num(r[samples]) for r in rows) or 1.0


def stall_sums(rows, col, stalls):
    """Each stall reason's samples over rows, by its short name (without "stall_")."""
    return collections.Counter({s[6:]: sum(num(r[col[s]]) for r in rows) for s in stalls})


def report(name, header, rows, top, buckets):
    col, samples, executed, stalls, total = columns(header, rows)
    total_ex = sum(num(r[executed]) for r in rows) or 1.0
    print(f"== {name}\n   {len(rows)} SASS lines, {total:.0f} samples, {total_ex:.0f} warp instructions executed")
    by_stall = stall_sums(rows, col, stalls)
    print("   stalls: " + ", ".join(f"{s} {v / total * 100:.1f}%" for s, v in by_stall.most_common(8)))
    ops_s, ops_x = collections.Counter(), collections.Counter()
    for r in rows:
        ops_s[opcode(r[1])] += num(r[samples])
        ops_x[opcode(r[1])] += num(r[executed])
    print("   opcodes (samples / instructions): " + ", ".join(
        f"{o} {v / total * 100:.1f}/{ops_x[o] / total_ex * 100:.1f}%" for o, v in ops_s.most_common(14)))
    print(f"   top {top} instructions by samples:")
    for r in sorted(rows, key=lambda r: -num(r[samples]))[:top]:
        main = sorted(((s[6:], num(r[col[s]])) for s in stalls), key=lambda x: -x[1])[:2]
        print(f"     {r[0][-6:]} {num(r[samples]) / total * 100:5.1f}%  {r[1].strip()[:64]:64}  "
              + " ".join(f"{s}:{v:.0f}" for s, v in main))
    print(f"   {buckets} address buckets (samples, main opcodes):")
    ordered = sorted(rows, key=lambda r: int(r[0], 16))
    n = len(ordered)
    for b in range(buckets):
        part = ordered[b * n // buckets:(b + 1) * n // buckets]
        if not part:
            continue
        s = sum(num(r[samples]) for r in part)
        kinds = collections.Counter(opcode(r[1]) for r in part)
        print(f"     {part[0][0][-6:]} {s / total * 100:5.1f}%  " + " ".join(f"{k}:{c}" for k, c in kinds.most_common(6)))


# Where a kernel's phases meet: barriers, mbarrier waits and arrivals, wgmma's arrive and waits, bulk
# stores, fences, exits.
LANDMARK = re.compile(r"\bBAR\.|TRYWAIT|SYNCS\.ARRIVE|WARPGROUP\.(ARRIVE|DEPBAR)|UTMASTG|MEMBAR|\bEXIT\b")


def phases(header, rows, min_share=0.005):
    col, samples, executed, stalls, total = columns(header, rows)
    print("   phases (landmark: samples, times run; then the stretch after it: samples, instructions,"
          " main stalls):")
    stretch = []

    def flush():
        s = sum(num(r[samples]) for r in stretch)
        if stretch and s / total >= min_share:
            main = stall_sums(stretch, col, stalls)
            print(f"       {s / total * 100:5.1f}%  {sum(num(r[executed]) for r in stretch):12.0f} instr  "
                  + " ".join(f"{k}:{v / total * 100:.1f}%" for k, v in main.most_common(3)))
        stretch.clear()

    for r in sorted(rows, key=lambda r: int(r[0], 16)):
        if LANDMARK.search(r[1]):
            flush()
            print(f"     {r[0][-6:]} {num(r[samples]) / total * 100:5.1f}%  x{num(r[executed]):<10.0f} {r[1].strip()[:60]}")
        else:
            stretch.append(r)
    flush()


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("csv", help="ncu --page source --print-source sass --csv output")
    ap.add_argument("--kernel", default="", help="only kernels whose name contains this")
    ap.add_argument("--top", type=int, default=30)
    ap.add_argument("--buckets", type=int, default=30)
    ap.add_argument("--phases", action="store_true", help="also the code cut at its synchronization")
    args = ap.parse_args()
    seen = set()
    for name, header, rows in sections(args.csv):
        if args.kernel in name and name not in seen:  # ncu lists a kernel once per launch profiled
            seen.add(name)
            report(name, header, rows, args.top, args.buckets)
            if args.phases:
                phases(header, rows)


if __name__ == "__main__":
    main()
