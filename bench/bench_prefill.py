#!/usr/bin/env python3
"""Packed prefill of mamba2ssd.prefill against mamba_ssm's varlen call, on one GPU, in one process.

Per row: requests of mixed lengths packed into one row of T tokens (a chat-like mix of short prompts,
or a document-like one of long ones, lengths log-uniform from a fixed seed), each request with its own
slot of a state cache (fp32 or bf16, 2S slots, random distinct slots); bf16 x, B, C; fp32 dt, A, D,
dt_bias with softplus; no z (a serving layer's call: docs/serving.md). Two scenarios:
  new     every request starts from zero (has_initial_state all false)
  cached  every other request continues from the state in its slot (chunked prefill, a prefix hit)
What each implementation times is what an engine needs from it to fill the cache:
  ours       mamba2ssd.prefill: reads each request's slot, stores its final state into it, y into out
  mamba_ssm  mamba_ssm 2.3.2.post1's mamba_chunk_scan_combined (from .peers/, scripts/get_peers.sh)
             on x [1, T, ...] with seq_idx and cu_seqlens, return_varlen_states=True, then the scatter
             of the varlen states into the cache slots (index_copy_); in "cached", also the gather of
             initial_states = cache[slots] (zero where new) passed per request, where its version takes
             them (2.3.2 takes one initial state per batch row: the row says why not)
Each call is captured in a CUDA graph and its replays timed with triton.testing.do_bench (median;
do_bench clears L2 before every replay), and set against the floor max(bytes / copy bandwidth, flops /
bf16 matmul rate), both measured in the same run (bytes: x, y, B, C, dt and the states stored and
read; flops: bench.py's count over each request's chunks). Correctness in the same run, after one replay from the
cache as drawn: y and the stored states of a slice (up to two requests of at most ORACLE_TOKENS
tokens, the first and last heads) against a float64 sequential recurrence, and y of ours against
the peer's on the whole row.

    python3 bench/bench_prefill.py [--out DIR] [--mixes "chat 16K,doc 64K"]   # on the GPU machine
    python3 bench/bench_prefill.py --dry-run                                   # the rows; no CUDA
"""

import argparse
import collections
import datetime
import json
import math
import os
import random
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
# The pieces the other benchmarks already have (stdlib-only at import: --dry-run needs no torch):
# the graph-replayed timing of one call, the rel L2 error, the floor's two rates measured now.
from bench import measure_ceilings, rel  # noqa: E402
from bench_decode import time_graph  # noqa: E402
IMPLS = ["ours", "mamba_ssm"]
STATE_DTYPES = ["fp32", "bf16"]
SCENARIOS = ["new", "cached"]
ORACLE_TOKENS = 4096
REF_BW, REF_RATE = 4.27e12, 686e12  # the H200's ceilings measured before (docs/contract.md): --dry-run only


def packed_lengths(total, lo, hi, seed):
    """Request lengths log-uniform in [lo, hi] from a fixed seed until they fill `total` tokens (the last
    cut to fit); plain Python, as bench.py's, so that --dry-run shows them without torch."""
    rng = random.Random(seed)
    lens = []
    while sum(lens) < total:
        n = int(math.exp(rng.uniform(math.log(lo), math.log(hi))))
        lens.append(min(n, total - sum(lens)))
    return lens


# A mix: its name, (H, P, N, G), chunk and request lengths. H 80 P 64 N 128 is bench.py's headline
# (the Mamba-2 2.7B model's heads); P 128 N 256 the large Falcon-H1 models' (docs/serving.md).
Mix = collections.namedtuple("Mix", "name shape chunk seqlens")
MIXES = [
    Mix("chat 16K", (80, 64, 128, 1), 256, packed_lengths(16384, 32, 2048, seed=1)),
    Mix("chat 64K", (80, 64, 128, 1), 256, packed_lengths(65536, 32, 2048, seed=2)),
    Mix("doc 64K", (80, 64, 128, 1), 256, packed_lengths(65536, 1024, 16384, seed=3)),
    Mix("chat 32K P128 N256", (40, 128, 256, 1), 256, packed_lengths(32768, 32, 2048, seed=4)),
]


def row_bytes(mix, state_es, scenario):
    """Bytes that must move at least once: bf16 x, y, B, C; fp32 dt; each request's state stored once
    and, in "cached", read once for the half that continue."""
    H, P, N, G = mix.shape
    T, S = sum(mix.seqlens), len(mix.seqlens)
    reads = (S + 1) // 2 if scenario == "cached" else 0
    return 2 * (2 * T * H * P) + 2 * (2 * T * G * N) + 4 * T * H + (S + reads) * H * P * N * state_es


def row_flops(mix):
    """Flops any chunked prefill does (bench.py's count): 4QNP + 2Q^2P per (chunk, head) and 2Q^2N per
    (chunk, group), each request starting a chunk of its own."""
    H, P, N, G = mix.shape
    Q = mix.chunk
    chunks = sum(math.ceil(n / Q) for n in mix.seqlens)
    return chunks * H * (4 * Q * N * P + 2 * Q * Q * P) + chunks * G * 2 * Q * Q * N


def floor_us(nbytes, flops, bw, rate):
    return max(nbytes / bw, flops / rate) * 1e6


def lengths_note(lens):
    s = sorted(lens)
    return f"{s[0]}..{s[len(s) // 2]}..{s[-1]}"


def dry_run(rows):
    print("| mix | H, P, N, G | Q | requests | tokens | lengths (min..median..max) | state | scenario | MB | GFLOP | "
          "floor us* |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for mix, sd, scenario in rows:
        nbytes, flops = row_bytes(mix, 4 if sd == "fp32" else 2, scenario), row_flops(mix)
        print(f"| {mix.name} | {', '.join(map(str, mix.shape))} | {mix.chunk} | {len(mix.seqlens)} | "
              f"{sum(mix.seqlens)} | {lengths_note(mix.seqlens)} | {sd} | {scenario} | {nbytes / 1e6:.1f} | "
              f"{flops / 1e9:.1f} | {floor_us(nbytes, flops, REF_BW, REF_RATE):.1f} |")
    print(f"* max(bytes / {REF_BW / 1e12} TB/s, flops / {REF_RATE / 1e12:.0f} TFLOP/s), the ceilings measured "
          "before; a real run measures its own")


# --- the GPU part (torch and triton are imported only past this point) -------------------------

def short(e):
    msg = f"{type(e).__name__}: {e}".replace("|", "/").replace("\n", " ")
    return msg[:90] + ("..." if len(msg) > 90 else "")


def peer_fn(name):
    if name == "ours":
        import mamba2ssd
        if not mamba2ssd.has_cuda_backend():
            raise RuntimeError("mamba2ssd built without CUDA")
        return mamba2ssd.prefill
    from mamba_ssm.ops.triton.ssd_combined import mamba_chunk_scan_combined
    return mamba_chunk_scan_combined


def make_inputs(mix, state_dtype, scenario, seed):
    import torch
    import torch.nn.functional as F
    H, P, N, G = mix.shape
    T, S = sum(mix.seqlens), len(mix.seqlens)
    dev = "cuda"
    g = torch.Generator(device=dev).manual_seed(seed)
    rnd = lambda *s: torch.randn(*s, generator=g, device=dev)  # noqa: E731
    step = 0.001 * torch.exp(torch.rand(H, generator=g, device=dev) * math.log(100.0))  # Mamba-2's dt init
    n = torch.tensor(mix.seqlens, device=dev)
    return dict(
        x=rnd(T, H, P).to(torch.bfloat16),
        dt=rnd(T, H) * 0.5,  # raw: the step is about softplus(dt_bias)
        A=-torch.exp(torch.rand(H, generator=g, device=dev) * math.log(16.0)),  # in [-16, -1]
        B=rnd(T, G, N).to(torch.bfloat16),
        C=rnd(T, G, N).to(torch.bfloat16),
        D=rnd(H),
        dt_bias=step + torch.log(-torch.expm1(-step)),  # softplus's inverse
        cu_seqlens=F.pad(n.cumsum(0), (1, 0)).int(),
        seq_idx=torch.repeat_interleave(torch.arange(S, device=dev), n).int(),
        state=rnd(2 * S, H, P, N).to(state_dtype),
        slots=torch.randperm(2 * S, generator=g, device=dev)[:S].int(),
        has_init=(torch.arange(S, device=dev) % 2 == 0) if scenario == "cached" else torch.zeros(S, dtype=torch.bool,
                                                                                                 device=dev),
    )


def make_call(impl, fn, kw, state, chunk):
    """call() -> y [T, H, P], updating `state` (the cache) as an engine needs."""
    import torch
    if impl == "ours":
        out = torch.empty_like(kw["x"])
        return lambda: fn(kw["x"], kw["dt"], kw["A"], kw["B"], kw["C"], chunk, kw["cu_seqlens"], state, kw["slots"],
                          kw["has_init"], D=kw["D"], dt_bias=kw["dt_bias"], dt_softplus=True, out=out)
    slots = kw["slots"].long()
    cached = bool(kw["has_init"].any())

    def call():
        extra = {}
        if cached:  # per request: its slot's state, zero where new
            extra["initial_states"] = state[slots] * kw["has_init"][:, None, None, None].to(state.dtype)
        y, varlen = fn(kw["x"][None], kw["dt"][None], kw["A"], kw["B"][None], kw["C"][None], chunk, D=kw["D"],
                       dt_bias=kw["dt_bias"], dt_softplus=True, seq_idx=kw["seq_idx"][None],
                       cu_seqlens=kw["cu_seqlens"], return_varlen_states=True, **extra)
        state.index_copy_(0, slots, varlen.to(state.dtype))
        return y[0]
    return call


def checked_requests(lens):
    """Up to two requests the oracle runs whole (at most ORACLE_TOKENS tokens each, the first and the
    last such), else the first request's first ORACLE_TOKENS tokens (y only)."""
    fit = [i for i, n in enumerate(lens) if 0 < n <= ORACLE_TOKENS]
    return sorted({fit[0], fit[-1]}) if fit else [0]


def oracle(kw, state0, lens, heads):
    """fp64, token after token, for each checked request on `heads`: {request: (tokens, y [L, h, P],
    final state [h, P, N] or None when the request was cut)}."""
    import torch
    f = lambda t: t.double()  # noqa: E731
    H = kw["x"].shape[1]
    G = kw["B"].shape[1]
    hs = torch.tensor(heads, device=kw["x"].device)
    cu = kw["cu_seqlens"].tolist()
    refs = {}
    for r in checked_requests(lens):
        start = cu[r]
        L = min(cu[r + 1] - start, ORACLE_TOKENS)
        tok = slice(start, start + L)
        d = f(kw["dt"][tok][:, hs]) + f(kw["dt_bias"][hs])
        d = torch.where(d <= 20.0, torch.log1p(torch.exp(d)), d)
        decay = torch.exp(f(kw["A"][hs]) * d)  # [L, h]
        x = f(kw["x"][tok][:, hs])
        grp = hs // (H // G)
        B, C = f(kw["B"][tok][:, grp]), f(kw["C"][tok][:, grp])  # [L, h, N]
        slot = int(kw["slots"][r])
        s = f(state0[slot][hs]) if bool(kw["has_init"][r]) else torch.zeros(len(heads), *state0.shape[2:],
                                                                            dtype=torch.float64, device=x.device)
        y = torch.empty_like(x)
        for t in range(L):
            s = decay[t, :, None, None] * s + (d[t, :, None] * x[t])[:, :, None] * B[t, :, None, :]
            y[t] = (s @ C[t, :, :, None])[..., 0]
        y = y + f(kw["D"][hs])[:, None] * x
        refs[r] = (tok, y, s if L == cu[r + 1] - start else None)
    return refs


def errors(y, state, kw, refs, heads):
    """Worst rel L2 over the checked requests: y, and the stored final states."""
    import torch
    hs = torch.tensor(heads, device=y.device)
    ey = max(rel(y[tok][:, hs], ref_y) for tok, ref_y, _ in refs.values())
    es = [rel(state[int(kw["slots"][r])][hs], s) for r, (_, _, s) in refs.items() if s is not None]
    return dict(y=ey, state=max(es) if es else float("nan"))


def run_row(mix, sd, scenario, fns, rep_ms, bw, rate):
    import torch
    state_dtype = torch.float32 if sd == "fp32" else torch.bfloat16
    H, P, N, G = mix.shape
    kw = make_inputs(mix, state_dtype, scenario, seed=len(mix.seqlens) + (scenario == "cached"))
    state0 = kw["state"].clone()
    heads = [0, H - 1]
    refs = oracle(kw, state0, mix.seqlens, heads)
    r = dict(mix=mix.name, shape=mix.shape, chunk=mix.chunk, requests=len(mix.seqlens), tokens=sum(mix.seqlens),
             state_dtype=sd, scenario=scenario, bytes=row_bytes(mix, 4 if sd == "fp32" else 2, scenario),
             flops=row_flops(mix), time_us={}, err={}, error={})
    r["floor_us"] = floor_us(r["bytes"], r["flops"], bw, rate)
    ys = {}
    for impl, fn in fns.items():
        if isinstance(fn, str):
            r["error"][impl] = fn
            continue
        try:
            state = state0.clone()
            us, graph, y = time_graph(make_call(impl, fn, kw, state, mix.chunk), rep_ms)
            state.copy_(state0)  # the replays advanced the cache: check one from the cache as drawn
            graph.replay()
            torch.cuda.synchronize()
            r["err"][impl] = errors(y, state, kw, refs, heads)
            r["time_us"][impl] = us
            ys[impl] = y.clone()
            del graph
        except Exception as e:
            r["error"][impl] = short(e)
            if impl == "mamba_ssm" and scenario == "cached":  # its assertion has no message of its own
                r["error"][impl] = f"n/a (initial_states per request not taken: {r['error'][impl]})"
    if len(ys) == 2:
        r["err"]["ours_vs_mamba_ssm"] = dict(y=rel(ys["ours"], ys["mamba_ssm"]), state=float("nan"))
    del kw, state0, ys
    torch.cuda.empty_cache()
    return r


def ratio(r):
    t = r["time_us"]
    return f"{t['mamba_ssm'] / t['ours']:.2f}x" if "ours" in t and "mamba_ssm" in t else "-"


def fmt_err(e):
    return "-" if e is None else f"{e['y']:.1e}/{e['state']:.1e}"


def fmt_row(r):
    t = r["time_us"]
    cells = [f"{r['mix']:20} {r['state_dtype']:>4} {r['scenario']:6}"]
    for impl in IMPLS:
        cells.append(f"{impl} {t[impl]:9.1f} us {r['bytes'] / t[impl] * 1e-3:6.0f} GB/s "
                     f"{r['floor_us'] / t[impl]:5.3f} of floor" if impl in t else f"{impl} {r['error'].get(impl, '-')}")
    cells.append(ratio(r))
    cells.append("err " + " ".join(f"{k} {fmt_err(v)}" for k, v in r["err"].items()))
    return "  ".join(cells)


def markdown(rows, header):
    lines = header + ["", "| mix | H, P, N, G | requests | tokens | state | scenario | floor us | ours us | "
                      "ours GB/s | ours of floor | mamba_ssm us | mamba_ssm of floor | mamba_ssm / ours | "
                      "err ours y/state | err mamba_ssm y/state | y ours vs mamba_ssm |",
                      "|---|---|---:|---:|---|---|---:|---:|---:|---:|---:|---:|---:|---|---|---|"]
    for r in rows:
        t, e = r["time_us"], r["err"]
        cell = lambda impl: f"{t[impl]:.1f}" if impl in t else r["error"].get(impl, "-")  # noqa: E731
        vs = f"{e['ours_vs_mamba_ssm']['y']:.1e}" if "ours_vs_mamba_ssm" in e else "-"
        of = lambda impl: f"{r['floor_us'] / t[impl]:.3f}" if impl in t else "-"  # noqa: E731
        gbps = f"{r['bytes'] / t['ours'] * 1e-3:.0f}" if "ours" in t else "-"
        lines.append(f"| {r['mix']} | {', '.join(map(str, r['shape']))} | {r['requests']} | {r['tokens']} | "
                     f"{r['state_dtype']} | {r['scenario']} | {r['floor_us']:.1f} | {cell('ours')} | {gbps} | "
                     f"{of('ours')} | {cell('mamba_ssm')} | {of('mamba_ssm')} | {ratio(r)} | "
                     f"{fmt_err(e.get('ours'))} | {fmt_err(e.get('mamba_ssm'))} | {vs} |")
    return "\n".join(lines) + "\n"


def pick(ap, wanted, known, what):
    names = [w for w in wanted.split(",") if w]
    unknown = [w for w in names if w not in known]
    if unknown:
        ap.error(f"unknown {what} {unknown}; known: {', '.join(known)}")
    return names


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=os.environ.get("OUT") or os.path.join(ROOT, "bench", "out"),
                    help="folder for prefill.md and prefill.json (default $OUT, else bench/out)")
    ap.add_argument("--mixes", default=",".join(m.name for m in MIXES), help="comma list of the mixes' names")
    ap.add_argument("--state-dtypes", default=",".join(STATE_DTYPES), help="fp32,bf16")
    ap.add_argument("--scenarios", default=",".join(SCENARIOS), help="new,cached")
    ap.add_argument("--impls", default=",".join(IMPLS), help="comma list among " + ",".join(IMPLS))
    ap.add_argument("--peers", default=os.path.join(ROOT, ".peers"), help="the peers' folder (get_peers.sh)")
    ap.add_argument("--rep-ms", type=int, default=200, help="do_bench time per measurement, ms (200)")
    ap.add_argument("--dry-run", action="store_true", help="print the rows; no CUDA")
    args = ap.parse_args()
    by_name = {m.name: m for m in MIXES}
    mixes = pick(ap, args.mixes, list(by_name), "mixes")
    dtypes = pick(ap, args.state_dtypes, STATE_DTYPES, "state dtypes")
    scenarios = pick(ap, args.scenarios, SCENARIOS, "scenarios")
    impls = pick(ap, args.impls, IMPLS, "impls")
    rows = [(by_name[m], sd, sc) for m in mixes for sd in dtypes for sc in scenarios]
    if args.dry_run:
        return dry_run(rows)
    sys.path.insert(0, args.peers)  # mamba_ssm/
    sys.path.append(os.path.join(args.peers, "_deps"))  # einops, packaging: installed copies win
    import torch
    if not torch.cuda.is_available():
        sys.exit("bench_prefill.py: no CUDA device (use --dry-run to see the rows)")
    fns = {}
    for impl in impls:
        try:
            fns[impl] = peer_fn(impl)
        except Exception as e:
            fns[impl] = short(e)
            print(f"{impl}: not available: {fns[impl]}", flush=True)
    bw, rate = measure_ceilings(args.rep_ms)
    import mamba2ssd
    header = [f"# Packed prefill, {datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC",
              f"{torch.cuda.get_device_name(0)}; torch {torch.__version__}; mamba2ssd {mamba2ssd.__version__}; "
              "bf16 x/B/C, fp32 dt/A/D, dt_bias + softplus, D [H], no z; cache of 2S slots",
              "time: the call an engine makes to fill the cache, in a CUDA graph, do_bench median (L2 cleared); "
              f"err: rel L2 against a float64 recurrence on up to two requests of <= {ORACLE_TOKENS} tokens, "
              "heads 0 and H-1 (y / stored state)",
              f"floor: max(bytes / {bw * 1e-12:.2f} TB/s, flops / {rate * 1e-12:.0f} TFLOP/s), both measured in "
              "this run (2 GiB device copy, bf16 8192^3 matmul)"]
    print("\n".join(header), flush=True)
    os.makedirs(args.out, exist_ok=True)
    done = []
    with torch.no_grad():
        for mix, sd, scenario in rows:
            r = run_row(mix, sd, scenario, fns, args.rep_ms, bw, rate)
            done.append(r)
            print(fmt_row(r), flush=True)
            with open(os.path.join(args.out, "prefill.md"), "w") as f:
                f.write(markdown(done, header))
            with open(os.path.join(args.out, "prefill.json"), "w") as f:
                json.dump(dict(header=header, rows=done), f, indent=1)
    print("\n" + markdown(done, header))


if __name__ == "__main__":
    main()
