#!/usr/bin/env python3
"""Decode-step time of mamba2ssd.selective_state_update against mamba_ssm's (Triton), on one GPU, in
one process.

Per row (batch b of requests x H heads, P 64, N 128, G 1, one token; the cache fp32 or bf16, with
2b slots, each request reading a random slot and updating it in place): inputs as mamba_ssm's
Mamba-2 step passes them (bf16 x, B, C; fp32 dt, A, D, dt_bias expanded over P and N with stride 0;
dt_softplus; no z), then each implementation's call captured in a CUDA graph and its replays timed
with triton.testing.do_bench (median; do_bench clears L2 before every replay). Implementations:
  ours       mamba2ssd.selective_state_update (the installed package)
  mamba_ssm  mamba_ssm 2.3.2.post1's selective_state_update, from .peers/ (scripts/get_peers.sh)
GB/s counts the bytes that must move: the state read and written once per request and head, plus x,
B, C, dt and out. The copy ceiling is measured in the same run: torch's device-to-device copy of
2 GiB (4 GiB moved), timed the same way; "of ceiling" is GB/s over it. A second column times a copy
of the row's own bytes (read + write, as the CLI's `decode` does), which shows what launch and tail
costs leave of the ceiling at small batches, and "of that copy" is its time over ours.
Correctness in the same run: both outputs and updated states against a float64 recurrence on the
first requests, and against each other.

    python3 bench/bench_decode.py [--out DIR] [--rows 64,512,4096]   # on the GPU machine
    python3 bench/bench_decode.py --dry-run                          # the rows and bytes; no CUDA
"""

import argparse
import datetime
import json
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
H, P, N, G = 32, 64, 128, 1
BATCH_HEADS = [64, 128, 256, 512, 1024, 2048, 4096, 8192]  # b x H
STATE_DTYPES = ["fp32", "bf16"]
IMPLS = ["ours", "mamba_ssm"]
CHECK_REQUESTS = 2


def row_bytes(b, state_es):
    """Bytes that must move: the state once each way per (request, head); bf16 x, out, B, C; fp32 dt."""
    return 2 * b * H * P * N * state_es + 2 * (2 * b * H * P) + 2 * (2 * b * G * N) + 4 * b * H


def dry_run(rows):
    print(f"{'b x H':>6} {'b':>5} {'state':>5} {'MB':>8}  {'us at 4.27 TB/s':>15}")
    for bh, sd in rows:
        nbytes = row_bytes(bh // H, 4 if sd == "fp32" else 2)
        print(f"{bh:6} {bh // H:5} {sd:>5} {nbytes / 1e6:8.2f}  {nbytes / 4.27e12 * 1e6:15.2f}")


def short(e):
    s = f"{type(e).__name__}: {e}".splitlines()[0]
    return s if len(s) < 160 else s[:157] + "..."


def peer_fn(name):
    if name == "ours":
        import mamba2ssd
        if not mamba2ssd.has_cuda_backend():
            raise RuntimeError("mamba2ssd built without CUDA")
        return mamba2ssd.selective_state_update
    from mamba_ssm.ops.triton.selective_state_update import selective_state_update
    return selective_state_update


def make_inputs(b, state_dtype, seed):
    import torch
    g = torch.Generator(device="cuda").manual_seed(seed)
    S = 2 * b
    dev = "cuda"
    kw = dict(
        state=torch.randn(S, H, P, N, device=dev, generator=g).to(state_dtype),
        x=torch.randn(b, H, P, device=dev, generator=g).to(torch.bfloat16),
        dt=(torch.randn(b, H, device=dev, generator=g) * 0.5 - 3.0),
        A=-torch.rand(H, device=dev, generator=g) * 2 - 0.1,
        B=torch.randn(b, G, N, device=dev, generator=g).to(torch.bfloat16),
        C=torch.randn(b, G, N, device=dev, generator=g).to(torch.bfloat16),
        D=torch.randn(H, device=dev, generator=g),
        dt_bias=torch.randn(H, device=dev, generator=g) * 0.5,
        idx=torch.randperm(S, device=dev, generator=g)[:b].to(torch.int32),
    )
    return kw


def call_of(fn, kw, state):
    """The Mamba-2 step as mamba_ssm's layer makes it: per-head values expanded over P (and N)."""
    b = kw["x"].shape[0]
    dt = kw["dt"][:, :, None].expand(b, H, P)
    A = kw["A"][:, None, None].expand(H, P, N)
    D = kw["D"][:, None].expand(H, P)
    dt_bias = kw["dt_bias"][:, None].expand(H, P)

    def call():
        return fn(state, kw["x"], dt, A, kw["B"], kw["C"], D=D, dt_bias=dt_bias, dt_softplus=True,
                  state_batch_indices=kw["idx"])
    return call


def time_graph(call, rep_ms):
    import torch
    import triton.testing
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm-up (Triton compiles) outside the capture
        call()
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = call()
    graph.replay()
    torch.cuda.synchronize()
    ms = triton.testing.do_bench(graph.replay, warmup=50, rep=rep_ms, return_mode="median")
    return ms * 1e3, graph, out


def oracle(kw, state0, requests):
    """fp64 out [r, H, P] and updated states [r, H, P, N] of the first `requests` requests."""
    import torch
    f = lambda t: t.detach().double().cpu()  # noqa: E731
    outs, states = [], []
    for i in range(requests):
        d = f(kw["dt"][i]) + f(kw["dt_bias"])
        d = torch.where(d <= 20, torch.log1p(torch.exp(d)), d)
        s = f(state0[kw["idx"][i]])
        x = f(kw["x"][i])
        s = torch.exp(f(kw["A"]) * d)[:, None, None] * s + (d[:, None] * x)[:, :, None] * f(kw["B"][i, 0])[None, None, :]
        y = (s * f(kw["C"][i, 0])[None, None, :]).sum(-1) + f(kw["D"])[:, None] * x
        outs.append(y)
        states.append(s)
    return torch.stack(outs), torch.stack(states)


def rel(a, b):
    import torch
    a, b = a.double().cpu(), b.double().cpu()
    if not torch.isfinite(a).all():
        return float("nan")
    return ((a - b).norm() / b.norm()).item()


def measure_copy(nbytes, rep_ms):
    """us of a device-to-device copy moving nbytes (read + written), do_bench as above."""
    import torch
    import triton.testing
    n = max(nbytes // 2, 1)
    src = torch.randint(0, 255, (n,), dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    ms = triton.testing.do_bench(lambda: dst.copy_(src), warmup=50, rep=rep_ms, return_mode="median")
    return ms * 1e3


def run_row(bh, sd, fns, ceiling_bps, rep_ms):
    import torch
    b = bh // H
    state_dtype = torch.float32 if sd == "fp32" else torch.bfloat16
    nbytes = row_bytes(b, 4 if sd == "fp32" else 2)
    kw = make_inputs(b, state_dtype, seed=bh)
    state0 = kw["state"].clone()
    r = dict(batch=b, heads=H, batch_x_heads=bh, state_dtype=sd, bytes=nbytes, time_us={}, GBps={},
             of_ceiling={}, err={}, error={})
    r["copy_same_bytes_us"] = measure_copy(nbytes, rep_ms)
    ref = oracle(kw, state0, CHECK_REQUESTS)
    results = {}
    for impl, fn in fns.items():
        if isinstance(fn, str):
            r["error"][impl] = fn
            continue
        try:
            state = state0.clone()
            us, graph, out = time_graph(call_of(fn, kw, state), rep_ms)
            # Correctness: one replay from the cache as drawn.
            state.copy_(state0)
            graph.replay()
            torch.cuda.synchronize()
            idx = kw["idx"][:CHECK_REQUESTS].long()
            r["err"][impl] = dict(out=rel(out[:CHECK_REQUESTS], ref[0]), state=rel(state[idx], ref[1]))
            results[impl] = (out.clone(), state.clone())
            r["time_us"][impl] = us
            r["GBps"][impl] = nbytes / (us * 1e-6) * 1e-9
            r["of_ceiling"][impl] = nbytes / (us * 1e-6) / ceiling_bps
            r.setdefault("of_same_bytes_copy", {})[impl] = r["copy_same_bytes_us"] / us
            del graph
        except Exception as e:
            r["error"][impl] = short(e)
    if len(results) == 2:
        (o1, s1), (o2, s2) = results["ours"], results["mamba_ssm"]
        r["err"]["ours_vs_mamba_ssm"] = dict(out=rel(o1, o2), state=rel(s1, s2))
    del kw, state0, results
    torch.cuda.empty_cache()
    return r


def fmt_row(r):
    t = r["time_us"]
    cells = [f"{r['batch_x_heads']:6} {r['batch']:4} {r['state_dtype']:>4}"]
    for impl in IMPLS:
        if impl in t:
            cells.append(f"{impl} {t[impl]:8.2f} us {r['GBps'][impl]:7.0f} GB/s {r['of_ceiling'][impl]:5.3f}")
        else:
            cells.append(f"{impl} {r['error'].get(impl, '-')}")
    if "ours" in t and "mamba_ssm" in t:
        cells.append(f"{t['mamba_ssm'] / t['ours']:.2f}x")
    cells.append(f"copy {r['copy_same_bytes_us']:.2f} us")
    cells.append("err " + " ".join(f"{k} {v['out']:.1e}/{v['state']:.1e}" for k, v in r["err"].items()))
    return "  ".join(cells)


def markdown(rows, header):
    lines = header + ["", "| b x H | b | state | ours us | ours GB/s | of ceiling | mamba_ssm us | mamba_ssm GB/s | "
                      "of ceiling | speedup | copy of same bytes us | ours of that copy | err out/state (ours, peer, ours vs peer) |",
                      "|---:|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|"]
    for r in rows:
        t, g, c = r["time_us"], r["GBps"], r["of_ceiling"]
        cell = lambda d, k, f: f.format(d[k]) if k in d else "-"  # noqa: E731
        sp = f"{t['mamba_ssm'] / t['ours']:.2f}x" if "ours" in t and "mamba_ssm" in t else "-"
        errs = ", ".join(f"{v['out']:.1e}/{v['state']:.1e}" for v in r["err"].values())
        lines.append(f"| {r['batch_x_heads']} | {r['batch']} | {r['state_dtype']} | {cell(t, 'ours', '{:.2f}')} | "
                     f"{cell(g, 'ours', '{:.0f}')} | {cell(c, 'ours', '{:.3f}')} | {cell(t, 'mamba_ssm', '{:.2f}')} | "
                     f"{cell(g, 'mamba_ssm', '{:.0f}')} | {cell(c, 'mamba_ssm', '{:.3f}')} | {sp} | "
                     f"{r['copy_same_bytes_us']:.2f} | {cell(r.get('of_same_bytes_copy', {}), 'ours', '{:.3f}')} | {errs} |")
    return "\n".join(lines) + "\n"


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=os.environ.get("OUT") or os.path.join(ROOT, "bench", "out"),
                    help="folder for decode.md and decode.json (default $OUT, else bench/out)")
    ap.add_argument("--rows", default=",".join(map(str, BATCH_HEADS)), help="batch x heads values (multiples of 32)")
    ap.add_argument("--state-dtypes", default=",".join(STATE_DTYPES), help="fp32,bf16")
    ap.add_argument("--impls", default=",".join(IMPLS), help="comma list among " + ",".join(IMPLS))
    ap.add_argument("--peers", default=os.path.join(ROOT, ".peers"), help="the peers' folder (get_peers.sh)")
    ap.add_argument("--rep-ms", type=int, default=200, help="do_bench time per measurement, ms (200)")
    ap.add_argument("--dry-run", action="store_true", help="print the rows and bytes; no CUDA")
    args = ap.parse_args()
    rows = [(int(v), sd) for sd in args.state_dtypes.split(",") for v in args.rows.split(",")]
    for bh, sd in rows:
        if bh % H or sd not in STATE_DTYPES:
            ap.error(f"row {bh} {sd}: batch x heads must be a multiple of {H}, state fp32 or bf16")
    if args.dry_run:
        return dry_run(rows)
    sys.path.insert(0, args.peers)
    sys.path.append(os.path.join(args.peers, "_deps"))
    import torch
    if not torch.cuda.is_available():
        sys.exit("bench_decode.py: no CUDA device (use --dry-run to see the rows)")
    fns = {}
    for impl in [i for i in args.impls.split(",") if i]:
        try:
            fns[impl] = peer_fn(impl)
        except Exception as e:
            fns[impl] = short(e)
            print(f"{impl}: not available: {fns[impl]}", flush=True)
    ceiling_bps = 2 * (2 << 30) / (measure_copy(2 * (2 << 30), args.rep_ms) * 1e-6)
    import mamba2ssd
    header = [f"# Decode step, {datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC",
              f"{torch.cuda.get_device_name(0)}; torch {torch.__version__}; mamba2ssd {mamba2ssd.__version__}; "
              f"H {H}, P {P}, N {N}, G {G}, one token, bf16 x/B/C, softplus, D, dt_bias",
              f"copy ceiling {ceiling_bps * 1e-9:.0f} GB/s (device-to-device copy of 2 GiB, this run)"]
    print("\n".join(header), flush=True)
    os.makedirs(args.out, exist_ok=True)
    done = []
    with torch.no_grad():
        for bh, sd in rows:
            r = run_row(bh, sd, fns, ceiling_bps, args.rep_ms)
            done.append(r)
            print(fmt_row(r), flush=True)
            with open(os.path.join(args.out, "decode.md"), "w") as f:
                f.write(markdown(done, header))
            with open(os.path.join(args.out, "decode.json"), "w") as f:
                json.dump(dict(header=header, copy_Bps=ceiling_bps, rows=done), f, indent=1)
    print("\n" + markdown(done, header))


if __name__ == "__main__":
    main()
