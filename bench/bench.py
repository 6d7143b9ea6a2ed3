#!/usr/bin/env python3
"""Forward time of mamba2ssd.mamba_chunk_scan_combined against its peers, on one GPU, in one process.

Per shape: random inputs (bf16 x/B/C, fp32 dt/A/D, D per head, no z, no states), then each
implementation's forward captured in a CUDA graph and its replays timed with triton.testing.do_bench
(median; do_bench also flushes L2 before every replay). When one input set is smaller than 3x the
L2 cache, the graph calls the forward on several input sets in turn and the time is divided by
their number. Implementations (each optional; a column says why one is missing):
  ours       mamba2ssd.mamba_chunk_scan_combined (the installed package)
  mamba_ssm  mamba_ssm 2.3.2.post1's mamba_chunk_scan_combined, from .peers/ (scripts/get_peers.sh)
  fla        fla's chunk_simple_gla: q = C, k = B (expanded to every head), v = dt*x, g = A*dt,
             scale 1; q/k/v/g are prepared and D*x added outside the timed region (in its favour)
Correctness in the same run: each output against a float64 sequential recurrence on a slice (batch
row 0, the first and last heads, the first 4096 tokens), and the outputs against each other.
Floor in the same run: max(bytes / copy bandwidth, flops / bf16 matmul rate), see docs/benchmarking.md.

The CUDA Tile C++ backend (issue 7) is not in the Python package (it needs nvcc 13.3+); with --cli
PATH, a `mamba2ssd` CLI built with it (-DMAMBA2SSD_TILE=ON, docs/tile-cpp.md) times the same shapes
with `bench --path tile` and, for a like-for-like comparison, `bench --path auto` (the hand-written
CUDA): a second table, timed by the CLI (CUDA events, L2 cleared, median of 100) on its own inputs.

With --backward, a training step instead: forward + backward (the gradients of x, dt, A, B, C, D for
a random dout), captured and replayed as above, with the peak memory of one eager step and each
gradient against a float64 recurrence differentiated by torch.autograd (the slice as above, with
dout zero outside it, so that every gradient there, sums over tokens and heads included, is the
slice's alone). fla's chunk_simple_gla runs its own backward on its own inputs q, k, v, g (their
preparation and its gradient's way back to x, dt, A, B, C, D outside the timed region, in its
favour). Writes benchmarks_backward.md / .json.

    python3 bench/bench.py [--quick] [--backward] [--out DIR]   # on the GPU machine
    python3 bench/bench.py --dry-run [--backward]               # the shape table; no CUDA
"""

import argparse
import datetime
import json
import math
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# name, (b, L, H, P, N, G), chunk; QUICK rows run with --quick
SHAPES = [
    ("4K", (4, 4096, 8, 64, 128, 1), 128),
    ("16K headline", (4, 16384, 8, 64, 128, 1), 128),
    ("64K", (4, 65536, 8, 64, 128, 1), 128),
    ("16K N64", (4, 16384, 8, 64, 64, 1), 128),
    ("16K N256", (4, 16384, 8, 64, 256, 1), 128),
    ("2.7B", (8, 2048, 80, 64, 128, 1), 128),
    ("8K H80", (1, 8192, 80, 64, 128, 1), 128),
    ("4K H128 G8", (2, 4096, 128, 64, 128, 8), 128),
    ("16K chunk256", (4, 16384, 8, 64, 128, 1), 256),
]
QUICK = ["16K headline", "4K", "2.7B"]
IMPLS = ["ours", "mamba_ssm", "fla"]
PEERS = ["mamba_ssm", "fla"]
ORACLE_TOKENS = 4096
REF_BW, REF_RATE = 4.27e12, 686e12  # the H200 ceilings measured before (docs/contract.md): --dry-run only


def work(shape, Q):
    """(bytes, flops) that any forward must move and do (docs/contract.md): bf16 x, y, B, C and
    fp32 dt once each (no z, no states here); 4QNP + 2Q^2P flops per (batch, chunk, head) and
    2Q^2N per (batch, chunk, group)."""
    b, L, H, P, N, G = shape
    nbytes = 2 * (2 * b * L * H * P) + 2 * (2 * b * L * G * N) + 4 * b * L * H
    chunks = b * math.ceil(L / Q)
    flops = chunks * H * (4 * Q * N * P + 2 * Q * Q * P) + chunks * G * 2 * Q * Q * N
    return nbytes, flops


def n_sets(nbytes, l2_bytes):
    """Input sets to rotate among so that one replay touches at least 3x the L2 cache (at most 8)."""
    return max(1, min(8, math.ceil(3 * l2_bytes / nbytes)))


def fmt_shape(shape):
    return ", ".join(str(v) for v in shape)


def dry_run(rows, backward=False):
    if backward:
        return dry_run_backward(rows)
    print(f"{'row':14} {'b, L, H, P, N, G':28} {'Q':>4} {'MB':>8} {'GFLOP':>8} {'sets':>4} {'floor us*':>9}")
    for name, shape, Q in rows:
        nbytes, flops = work(shape, Q)
        floor = max(nbytes / REF_BW, flops / REF_RATE) * 1e6
        print(f"{name:14} {fmt_shape(shape):28} {Q:4} {nbytes / 1e6:8.1f} {flops / 1e9:8.2f} "
              f"{n_sets(nbytes, 60e6):4} {floor:9.1f}")
    print(f"* floor with the reference ceilings {REF_BW / 1e12} TB/s and {REF_RATE / 1e12:.0f} TFLOP/s "
          "(a real run measures its own); sets assume a 60 MB L2")


# --- the GPU part (torch and triton are imported only past this point) -------------------------

def short(e):
    msg = f"{type(e).__name__}: {e}".replace("|", "/").replace("\n", " ")
    return msg[:70] + ("..." if len(msg) > 70 else "")


def make_inputs(shape, seed, device):
    import torch
    import torch.nn.functional as F
    b, L, H, P, N, G = shape
    gen = torch.Generator(device=device).manual_seed(seed)
    rnd = lambda *s: torch.randn(*s, generator=gen, device=device)  # noqa: E731
    return dict(
        x=rnd(b, L, H, P).bfloat16(),
        dt=F.softplus(rnd(b, L, H) - 3.0),  # in (0, ~1), mostly 0.01 to 0.2, never 0
        B=rnd(b, L, G, N).bfloat16(),
        C=rnd(b, L, G, N).bfloat16(),
    )


def make_params(H, seed, device):
    import torch
    gen = torch.Generator(device=device).manual_seed(seed)
    A = -torch.exp(torch.rand(H, generator=gen, device=device) * math.log(16.0))  # in [-16, -1]
    D = torch.randn(H, generator=gen, device=device)
    return A, D


def oracle(x, dt, A, B, C, D):
    """y in float64 by the contract's sequential recurrence, on x's device: x [L, h, P], dt [L, h],
    A [h], B/C [L, h, N] (already per head), D [h]."""
    import torch
    x, dt, A, B, C, D = (t.double() for t in (x, dt, A, B, C, D))
    L, nh, P = x.shape
    state = torch.zeros(nh, P, B.shape[-1], dtype=torch.float64, device=x.device)
    decay = torch.exp(A * dt)  # [L, h]
    xdt = x * dt[..., None]
    y = torch.empty_like(x)
    for t in range(L):
        state.mul_(decay[t, :, None, None]).add_(xdt[t, :, :, None] * B[t, :, None, :])
        y[t] = (state @ C[t, :, :, None])[..., 0]
    return y + D[:, None] * x


def peer_fn(name):
    """The implementation's function, imported (raises if it cannot be)."""
    if name == "ours":
        import mamba2ssd
        if not mamba2ssd.has_cuda_backend():
            raise RuntimeError("mamba2ssd built without CUDA")
        return mamba2ssd.mamba_chunk_scan_combined
    if name == "mamba_ssm":
        from mamba_ssm.ops.triton.ssd_combined import mamba_chunk_scan_combined
        return mamba_chunk_scan_combined
    from fla.ops.simple_gla import chunk_simple_gla
    return chunk_simple_gla


def make_call(name, fn, sets, A, D, Q):
    """(call(i) -> raw output of set i, finish(raw, s) -> y with D x, comparable to the others)."""
    if name in ("ours", "mamba_ssm"):
        call = lambda i: fn(sets[i]["x"], sets[i]["dt"], A, sets[i]["B"], sets[i]["C"], Q, D=D)  # noqa: E731
        return call, lambda raw, s: raw
    # fla: prepared outside the timed region
    H, G = sets[0]["x"].shape[2], sets[0]["B"].shape[2]
    prep = []
    for s in sets:
        prep.append(dict(q=s["C"].repeat_interleave(H // G, dim=2).contiguous(),
                         k=s["B"].repeat_interleave(H // G, dim=2).contiguous(),
                         v=(s["x"].float() * s["dt"][..., None]).to(s["x"].dtype),
                         g=(A * s["dt"]).contiguous()))
    call = lambda i: fn(prep[i]["q"], prep[i]["k"], prep[i]["v"], g=prep[i]["g"], scale=1.0)[0]  # noqa: E731
    return call, lambda raw, s: (raw.float() + D[:, None] * s["x"].float()).to(s["x"].dtype)


def time_graph(call, nsets, rep_ms, keep_graph=False):
    """Captures call(0) .. call(nsets-1) in one CUDA graph; returns (us per call, measured twice:
    a list of two; outputs), and the graph with keep_graph (to replay it on other values)."""
    import torch
    import triton.testing
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm-up: compile, autotune, allocate, outside the capture
        for i in range(nsets):
            call(i)
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        outs = [call(i) for i in range(nsets)]
    graph.replay()
    torch.cuda.synchronize()
    ms = [triton.testing.do_bench(graph.replay, warmup=100, rep=rep_ms, return_mode="median")
          for _ in range(2)]
    times = [m * 1e3 / nsets for m in ms]
    return (times, outs, graph) if keep_graph else (times, outs)


def rel(a, b):
    """||a - b|| / ||b|| in float64 ("nan" if a has a non-finite value)."""
    import torch
    a, b = a.double(), b.double()
    if not torch.isfinite(a).all():
        return float("nan")
    return ((a - b).norm() / b.norm()).item()


def measure_ceilings(rep_ms):
    import torch
    import triton.testing
    n = 2 << 30  # 2 GiB copied: 4 GiB moved per copy
    src = torch.randint(0, 255, (n,), dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    ms = triton.testing.do_bench(lambda: dst.copy_(src), warmup=100, rep=rep_ms, return_mode="median")
    bw = 2 * n / (ms * 1e-3)
    del src, dst
    a, b = (torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16) for _ in range(2))
    c = torch.empty_like(a)
    ms = triton.testing.do_bench(lambda: torch.matmul(a, b, out=c), warmup=100, rep=rep_ms,
                                 return_mode="median")
    rate = 2 * 8192**3 / (ms * 1e-3)
    del a, b, c
    torch.cuda.empty_cache()
    return bw, rate


def run_row(index, name, shape, Q, impls, fns, bw, rate, l2, rep_ms):
    import torch
    b, L, H, P, N, G = shape
    nbytes, flops = work(shape, Q)
    floor_us = max(nbytes / bw, flops / rate) * 1e6
    ns = n_sets(nbytes, l2)
    sets = [make_inputs(shape, 1000 * index + i, "cuda") for i in range(ns)]
    A, D = make_params(H, 1000 * index + 999, "cuda")
    row = dict(name=name, shape=shape, chunk=Q, bytes=nbytes, flops=flops, floor_us=floor_us, sets=ns,
               time_us={}, spread={}, why={}, err={}, diff={})
    ys = {}
    for impl in impls:
        if impl not in fns or isinstance(fns[impl], str):
            row["why"][impl] = fns.get(impl, "not run")
            continue
        try:
            call, finish = make_call(impl, fns[impl], sets, A, D, Q)
            t, outs = time_graph(call, ns, rep_ms)
            row["time_us"][impl] = (t[0] + t[1]) / 2
            row["spread"][impl] = abs(t[0] - t[1]) / min(t)
            ys[impl] = finish(outs[0], sets[0])
            del call, outs
        except Exception as e:  # a peer that fails must not stop the run (a dead context will, later)
            row["why"][impl] = short(e)
        torch.cuda.synchronize()
        torch.cuda.empty_cache()
    # correctness: batch row 0, first and last head, first ORACLE_TOKENS tokens
    s, heads, Lc = sets[0], [0, H - 1], min(L, ORACLE_TOKENS)
    groups = [h // (H // G) for h in heads]
    ref = oracle(s["x"][0, :Lc, heads], s["dt"][0, :Lc, heads], A[heads],
                 s["B"][0, :Lc, groups], s["C"][0, :Lc, groups], D[heads])
    for impl, y in ys.items():  # NaN if any element of the whole output is not finite
        row["err"][impl] = rel(y[0, :Lc, heads], ref) if torch.isfinite(y).all() else float("nan")
        if impl != "ours" and "ours" in ys:
            row["diff"][impl] = rel(ys["ours"], y)
    del sets, ys
    torch.cuda.empty_cache()
    return row


def fmt_t(row, impl):
    t = row["time_us"].get(impl)
    return f"{t:.1f}" if t is not None else f"({row['why'].get(impl, 'not run')})"


def fmt_e(v):
    return "" if v is None else ("NaN" if v != v else f"{v:.1e}")


def cli_bench(cli, path, quick):
    """{(b, L, H, P, N, G, chunk): (seconds, y rel L2 or None, error or None)} from `cli bench --json`."""
    cmd = [cli, "bench", "--impl", "cuda", "--path", path, "--json"] + (["--quick"] if quick else [])
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
    if not proc.stdout.strip():
        raise RuntimeError(f"{' '.join(cmd)}: exit {proc.returncode}: {proc.stderr.strip()[:300]}")
    out = {}
    for r in json.loads(proc.stdout)["rows"]:
        pr = r["problem"]
        key = (pr["batch"], pr["seqlen"], pr["heads"], pr["headdim"], pr["dstate"], pr["groups"], pr["chunk"])
        err = next((e["rel_l2"] for e in r.get("errors", []) if e["name"] == "y"), None)
        out[key] = (r.get("time_s"), err, r.get("error"))
    return out


def cli_markdown(rows, cli_rows):
    """The tile backend against the hand-written CUDA, both timed by the CLI."""
    out = ["", "## CUDA Tile C++ backend (timed by the CLI)", "",
           "`mamba2ssd bench --path tile` and `--path auto` from one CLI built with the tile backend: CUDA "
           "events, L2 cleared before each launch, median of 100; the CLI's own inputs (same shapes). "
           "y error: rel L2 against the fp64 oracle on batch row 0, heads 0-1.", "",
           "| row | tile us | CUDA (auto) us | tile / CUDA | y err tile | y err CUDA |", "|---|---|---|---|---|---|"]
    for name, shape, Q in rows:
        key = (*shape, Q)
        t, c = cli_rows["tile"].get(key), cli_rows["auto"].get(key)
        def cell(v):
            return "(not run)" if v is None else (f"({v[2][:60]})" if v[2] else f"{v[0] * 1e6:.1f}")
        ratio = f"{t[0] / c[0]:.2f}" if t and c and t[0] and c[0] else ""
        out.append(f"| {name} | {cell(t)} | {cell(c)} | {ratio} | {fmt_e(t and t[1])} | {fmt_e(c and c[1])} |")
    return "\n".join(out) + "\n"


def markdown(rows, header, impls):
    peers = [p for p in PEERS if p in impls]
    out = ["# mamba2ssd forward benchmark", "", *header, "",
           "Times in us per forward call: the forward on `sets` input sets in turn, captured in one CUDA "
           "graph, replays timed by triton.testing.do_bench (median, L2 flushed before each replay), "
           "divided by `sets`. Speedup = peer time / our time; floor / ours: 1.0 is the floor.", "",
           "| row | b, L, H, P, N, G | Q | sets | " + " | ".join(f"{i} us" for i in impls) + " | "
           + " | ".join(f"x vs {p}" for p in peers) + " | floor us | floor / ours |",
           "|---|---|---|---|" + "---|" * (len(impls) + len(peers) + 2)]
    for r in rows:
        ours = r["time_us"].get("ours")
        sp = [f"{r['time_us'][p] / ours:.2f}x" if ours and p in r["time_us"] else "" for p in peers]
        frac = f"{r['floor_us'] / ours:.2f}" if ours else ""
        out.append(f"| {r['name']} | {fmt_shape(r['shape'])} | {r['chunk']} | {r['sets']} | "
                   + " | ".join(fmt_t(r, i) for i in impls) + " | " + " | ".join(sp)
                   + f" | {r['floor_us']:.1f} | {frac} |")
    spreads = [v for r in rows for v in r.get("spread", {}).values()]
    if spreads:
        out += ["", f"Noise: each time is the mean of two back-to-back do_bench medians of the same graph; "
                f"they differed by at most {100 * max(spreads):.1f}% in this run (median "
                f"{100 * sorted(spreads)[len(spreads) // 2]:.1f}%): smaller speedup differences are noise."]
    out += ["", f"Correctness: ||y - oracle|| / ||oracle|| on batch row 0, the first and last heads, the "
            f"first {ORACLE_TOKENS} tokens (float64 sequential recurrence); and ||y_ours - y_peer|| / "
            "||y_peer|| on the whole output.", "",
            "| row | " + " | ".join(f"err {i}" for i in impls) + " | "
            + " | ".join(f"ours vs {p}" for p in peers) + " |",
            "|---|" + "---|" * (len(impls) + len(peers))]
    for r in rows:
        out.append(f"| {r['name']} | " + " | ".join(fmt_e(r["err"].get(i)) for i in impls) + " | "
                   + " | ".join(fmt_e(r["diff"].get(p)) for p in peers) + " |")
    return "\n".join(out) + "\n"


def plot(rows, path):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    by = {r["name"]: r for r in rows}
    panels = [("sequence length L (b 4, H 8, P 64, N 128)", [("4K", 4096), ("16K headline", 16384), ("64K", 65536)]),
              ("state size N (b 4, L 16384, H 8, P 64)", [("16K N64", 64), ("16K headline", 128), ("16K N256", 256)])]
    fig, axes = plt.subplots(1, 2, figsize=(10, 4))
    for ax, (label, pts) in zip(axes, panels):
        for peer, style in (("mamba_ssm", "o-"), ("fla", "s--")):
            xs, ys = [], []
            for name, xv in pts:
                r = by.get(name)
                if r and "ours" in r["time_us"] and peer in r["time_us"]:
                    xs.append(xv)
                    ys.append(r["time_us"][peer] / r["time_us"]["ours"])
            if xs:
                ax.plot(xs, ys, style, label=f"over {peer}")
                for xv, yv in zip(xs, ys):
                    ax.annotate(f"{yv:.2f}x", (xv, yv), textcoords="offset points", xytext=(0, 6),
                                ha="center", fontsize=8)
        top = max([1.0] + [ln.get_ydata().max() for ln in ax.get_lines()])
        ax.set_ylim(0, top * 1.2)
        ax.set_xscale("log", base=2)
        ax.set_xticks([xv for _, xv in pts], [str(xv) for _, xv in pts])
        ax.axhline(1.0, color="gray", lw=0.8)
        ax.set_xlabel(label)
        ax.set_ylabel("speedup of mamba2ssd (forward)")
        ax.legend()
    fig.suptitle("mamba2ssd forward speedup (bf16, chunk 128)")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


# --- forward + backward (--backward) --------------------------------------------------------------

GRADS = ["x", "dt", "A", "B", "C", "D"]


def backward_bytes(shape):
    """Bytes of one training step's tensors that any implementation holds: the inputs (bf16 x/B/C,
    fp32 dt), dout, and the gradients of the same shapes (what the peak memory is measured against)."""
    b, L, H, P, N, G = shape
    tensors = 2 * b * L * H * P + 2 * b * L * G * N + 4 * b * L * H  # x, B, C, dt
    return 2 * tensors + 2 * b * L * H * P  # and their gradients, and dout


def dry_run_backward(rows):
    print(f"{'row':14} {'b, L, H, P, N, G':28} {'Q':>4} {'tensors MB':>10} {'sets':>4}")
    for name, shape, Q in rows:
        nbytes = backward_bytes(shape)
        print(f"{name:14} {fmt_shape(shape):28} {Q:4} {nbytes / 1e6:10.1f} {n_sets(nbytes, 60e6):4}")
    print("tensors: inputs, dout and gradients (bf16 x/B/C, fp32 dt) that every implementation holds; "
          "sets assume a 60 MB L2")


def make_step(name, fn, sets, A, D, Q):
    """(leaves(i) -> set i's tensors that get gradients, step(i) -> the gradients of set i, as a tuple
    in the order of leaves(i)). ours and mamba_ssm: x, dt, A, B, C, D; fla: q, k, v, g, prepared from
    the set (outside the timed region) as in make_call."""
    import torch
    H, G = sets[0]["x"].shape[2], sets[0]["B"].shape[2]
    if name in ("ours", "mamba_ssm"):
        leaves = [dict(x=s["x"], dt=s["dt"], A=A, B=s["B"], C=s["C"], D=D) for s in sets]

        def step(i):
            t = leaves[i]
            y = fn(t["x"], t["dt"], t["A"], t["B"], t["C"], Q, D=t["D"])
            return torch.autograd.grad(y, list(t.values()), sets[i]["dout"])
    else:
        leaves = [dict(q=s["C"].repeat_interleave(H // G, dim=2).contiguous(),
                       k=s["B"].repeat_interleave(H // G, dim=2).contiguous(),
                       v=(s["x"].float() * s["dt"][..., None]).to(s["x"].dtype),
                       g=(A * s["dt"]).contiguous()) for s in sets]

        def step(i):
            t = leaves[i]
            o = fn(t["q"], t["k"], t["v"], g=t["g"], scale=1.0)[0]
            return torch.autograd.grad(o, list(t.values()), sets[i]["dout"])
    # Fresh leaves that want gradients (the sets' tensors are shared between implementations).
    leaves = [{k: v.detach().clone().requires_grad_(True) for k, v in t.items()} for t in leaves]
    return leaves, step


def fla_to_ssd_grads(grads, s, A, D):
    """fla's (dq, dk, dv, dg) taken back to (dx, ddt, dA, dB, dC, dD) of the SSD (q = C, k = B per
    head; v = dt x; g = A dt; y = o + D x): the chain rule, in float32, outside the timed region."""
    dq, dk, dv, dg = (g.float() for g in grads)
    b, L, H, P = s["x"].shape
    G = s["B"].shape[2]
    x, dt, dout = s["x"].float(), s["dt"].float(), s["dout"].float()
    per_group = lambda t: t.view(b, L, G, H // G, -1).sum(3)  # noqa: E731
    dx = dv * dt[..., None] + D[:, None] * dout
    ddt = (dv * x).sum(-1) + dg * A
    return dict(x=dx, dt=ddt, A=(dg * dt).sum((0, 1)), B=per_group(dk), C=per_group(dq),
                D=(dout * x).sum((0, 1, 3)))


def oracle_grads(x, dt, A, B, C, D, dout, head_group):
    """The gradients of sum(dout * y) in float64, y by the sequential recurrence differentiated by
    torch.autograd, on x's device: x, dout [L, h, P], dt [L, h], A, D [h], B, C [L, g, N] (the
    groups the h heads read: head j reads group head_group[j])."""
    import torch
    leaves = [t.detach().double().requires_grad_(True) for t in (x, dt, A, B, C, D)]
    x, dt, A, B, C, D = leaves
    Bh, Ch = B[:, head_group], C[:, head_group]
    decay = torch.exp(A * dt)  # [L, h]
    xdt = x * dt[..., None]
    state = torch.zeros(x.shape[1], x.shape[2], B.shape[-1], dtype=torch.float64, device=x.device)
    ys = []
    for t in range(x.shape[0]):
        state = state * decay[t, :, None, None] + xdt[t, :, :, None] * Bh[t, :, None, :]
        ys.append((state @ Ch[t, :, :, None])[..., 0])
    y = torch.stack(ys) + D[:, None] * x
    return dict(zip(GRADS, torch.autograd.grad((y * dout.double()).sum(), leaves)))


def peak_memory(step):
    """Bytes allocated at the peak of one eager step above what was allocated before it (the inputs):
    the step's own memory, the gradients it returns included."""
    import torch
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats()
    before = torch.cuda.memory_allocated()
    grads = step(0)
    torch.cuda.synchronize()
    peak = torch.cuda.max_memory_allocated() - before
    del grads
    return peak


def run_backward_row(index, name, shape, Q, impls, fns, l2, rep_ms):
    import torch
    b, L, H, P, N, G = shape
    ns = n_sets(backward_bytes(shape), l2)
    sets = [make_inputs(shape, 1000 * index + i, "cuda") for i in range(ns)]
    A, D = make_params(H, 1000 * index + 999, "cuda")
    for i, s in enumerate(sets):
        gen = torch.Generator(device="cuda").manual_seed(1000 * index + 500 + i)
        s["dout"] = torch.randn(b, L, H, P, generator=gen, device="cuda").bfloat16()
    # The check's dout: set 0's, zero outside batch row 0, the first and last heads, the first tokens.
    heads, Lc = [0, H - 1] if H > 1 else [0], min(L, ORACLE_TOKENS)
    groups = sorted({h // (H // G) for h in heads})
    check_dout = torch.zeros_like(sets[0]["dout"])
    check_dout[0, :Lc, heads] = sets[0]["dout"][0, :Lc, heads]
    row = dict(name=name, shape=shape, chunk=Q, sets=ns, tensor_bytes=backward_bytes(shape), time_us={},
               spread={}, peak_bytes={}, why={}, err={})
    grads = {}
    for impl in impls:
        if impl not in fns or isinstance(fns[impl], str):
            row["why"][impl] = fns.get(impl, "not run")
            continue
        try:
            leaves, step = make_step(impl, fns[impl], sets, A, D, Q)
            t, outs, graph = time_graph(step, ns, rep_ms, keep_graph=True)
            row["time_us"][impl] = (t[0] + t[1]) / 2
            row["spread"][impl] = abs(t[0] - t[1]) / min(t)
            row["peak_bytes"][impl] = peak_memory(step)  # warm: after compiling and autotuning
            # The graph replayed once more with the check's dout in set 0's captured buffer.
            full_dout = sets[0]["dout"].clone()
            sets[0]["dout"].copy_(check_dout)
            graph.replay()
            torch.cuda.synchronize()
            sets[0]["dout"].copy_(full_dout)
            if impl == "fla":
                grads[impl] = fla_to_ssd_grads(outs[0], dict(sets[0], dout=check_dout), A, D)
            else:
                grads[impl] = {k: g.clone() for k, g in zip(GRADS, outs[0])}
            del graph
            del leaves, outs
        except Exception as e:  # a peer that fails must not stop the run
            row["why"][impl] = short(e)
        torch.cuda.synchronize()
        torch.cuda.empty_cache()
    if grads:
        s = sets[0]
        head_group = [groups.index(h // (H // G)) for h in heads]
        ref = oracle_grads(s["x"][0, :Lc, heads], s["dt"][0, :Lc, heads], A[heads], s["B"][0, :Lc, groups],
                           s["C"][0, :Lc, groups], D[heads], check_dout[0, :Lc, heads], head_group)
        for impl, g in grads.items():
            got = dict(x=g["x"][0, :Lc, heads], dt=g["dt"][0, :Lc, heads], A=g["A"][heads],
                       B=g["B"][0, :Lc, groups], C=g["C"][0, :Lc, groups], D=g["D"][heads])
            # Outside the slice every gradient must be zero (dout is): NaN marks one that is not.
            outside = sum(float(t.float().abs().sum()) for t in (g["x"][1:], g["x"][0, Lc:], g["B"][0, Lc:]))
            row["err"][impl] = {k: (rel(got[k], ref[k]) if outside == 0 else float("nan")) for k in GRADS}
    del sets, grads
    torch.cuda.empty_cache()
    return row


def markdown_backward(rows, header, impls):
    peers = [p for p in PEERS if p in impls]
    out = ["# mamba2ssd forward + backward benchmark", "", *header, "",
           "Times in us per training step (forward, then the gradients of x, dt, A, B, C, D for a random "
           "bf16 dout): the step on `sets` input sets in turn, captured in one CUDA graph, replays timed "
           "by triton.testing.do_bench (median, L2 flushed before each replay), divided by `sets`. "
           "Speedup = peer time / our time. Peak: torch.cuda.max_memory_allocated during one eager step, "
           "above what was allocated before it (the inputs and dout; for fla also its prepared q, k, v, g); "
           "the returned gradients included.", "",
           "| row | b, L, H, P, N, G | Q | sets | " + " | ".join(f"{i} us" for i in impls) + " | "
           + " | ".join(f"x vs {p}" for p in peers) + " | " + " | ".join(f"peak MB {i}" for i in impls) + " |",
           "|---|---|---|---|" + "---|" * (2 * len(impls) + len(peers))]
    for r in rows:
        ours = r["time_us"].get("ours")
        sp = [f"{r['time_us'][p] / ours:.2f}x" if ours and p in r["time_us"] else "" for p in peers]
        peak = [f"{r['peak_bytes'][i] / 1e6:.0f}" if i in r["peak_bytes"] else "" for i in impls]
        out.append(f"| {r['name']} | {fmt_shape(r['shape'])} | {r['chunk']} | {r['sets']} | "
                   + " | ".join(fmt_t(r, i) for i in impls) + " | " + " | ".join(sp) + " | " + " | ".join(peak) + " |")
    spreads = [v for r in rows for v in r.get("spread", {}).values()]
    if spreads:
        out += ["", f"Noise: two back-to-back do_bench medians of the same graph differed by at most "
                f"{100 * max(spreads):.1f}% (median {100 * sorted(spreads)[len(spreads) // 2]:.1f}%)."]
    out += ["", f"Gradient errors: ||g - oracle|| / ||oracle|| on batch row 0, the first and last heads (and "
            f"their groups for dB, dC), the first {ORACLE_TOKENS} tokens, from a step whose dout is zero "
            "outside that slice; the oracle is torch.autograd through the float64 sequential recurrence. "
            "NaN: a non-finite gradient, or one not zero outside the slice.", "",
            "| row | impl | " + " | ".join(f"d{g}" for g in GRADS) + " |", "|---|---|" + "---|" * len(GRADS)]
    for r in rows:
        for impl in impls:
            if impl in r["err"]:
                out.append(f"| {r['name']} | {impl} | " + " | ".join(fmt_e(r["err"][impl][g]) for g in GRADS) + " |")
    return "\n".join(out) + "\n"


def versions_header(fns, bw, rate):
    import torch
    import triton
    try:
        driver = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                                capture_output=True, text=True, timeout=30).stdout.split("\n")[0].strip()
    except (OSError, subprocess.SubprocessError):
        driver = "?"
    ver = {}
    for name, mod in (("ours", "mamba2ssd"), ("mamba_ssm", "mamba_ssm"), ("fla", "fla")):
        ver[name] = sys.modules[mod].__version__ if mod in sys.modules else f"({fns.get(name, 'not run')})"
    return [f"- date: {datetime.datetime.now().isoformat(timespec='minutes')}",
            f"- GPU: {torch.cuda.get_device_name()}, driver {driver or '?'}, CUDA {torch.version.cuda}",
            f"- torch {torch.__version__}, triton {triton.__version__}",
            f"- mamba2ssd {ver['ours']}, mamba_ssm {ver['mamba_ssm']}, fla {ver['fla']}",
            f"- ceilings measured in this run: copy {bw / 1e12:.2f} TB/s (read + write), bf16 8192^3 "
            f"matmul {rate / 1e12:.0f} TFLOP/s; floor = max(bytes / copy, flops / matmul)",
            "- inputs: bf16 x/B/C, fp32 dt (softplus(N(-3, 1))), A in [-16, -1], D per head; "
            "no z, no states"]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help=f"only the rows {', '.join(QUICK)}")
    ap.add_argument("--out", default=os.environ.get("OUT") or os.path.join(ROOT, "bench", "out"),
                    help="folder for benchmarks.md, benchmarks.png, benchmarks.json (default $OUT, "
                    "else bench/out)")
    ap.add_argument("--dry-run", action="store_true", help="print the shape table, bytes and flops; no CUDA")
    ap.add_argument("--impls", default=",".join(IMPLS), help="comma list among " + ",".join(IMPLS))
    ap.add_argument("--peers", default=os.path.join(ROOT, ".peers"), help="the peers' folder (get_peers.sh)")
    ap.add_argument("--rep-ms", type=int, default=500, help="do_bench time per measurement, ms (500)")
    ap.add_argument("--cli", help="a mamba2ssd CLI built with the tile backend: adds the tile table")
    ap.add_argument("--backward", action="store_true",
                    help="time forward + backward (training step), gradient errors, peak memory")
    args = ap.parse_args()
    impls = [i for i in args.impls.split(",") if i]
    bad = [i for i in impls if i not in IMPLS]
    if bad:
        ap.error(f"unknown implementation(s) {bad}; choose among {IMPLS}")
    rows = [r for r in SHAPES if not args.quick or r[0] in QUICK]
    if args.dry_run:
        return dry_run(rows, args.backward)
    if args.backward and args.cli:
        ap.error("--cli times the forward only; leave it out with --backward")

    cli_rows = {}
    if args.cli:  # before this process touches the GPU
        for path in ("tile", "auto"):
            try:
                cli_rows[path] = cli_bench(args.cli, path, args.quick)
            except Exception as e:
                cli_rows[path] = {}
                print(f"cli --path {path}: {short(e)}", flush=True)

    sys.path.insert(0, args.peers)  # mamba_ssm/, fla/
    sys.path.append(os.path.join(args.peers, "_deps"))  # einops, packaging: installed copies win
    import torch
    if not torch.cuda.is_available():
        sys.exit("bench.py: no CUDA device (use --dry-run to see the shape table)")
    fns = {}
    for impl in impls:
        try:
            fns[impl] = peer_fn(impl)
        except Exception as e:
            fns[impl] = short(e)
            print(f"{impl}: not available: {fns[impl]}", flush=True)
    os.makedirs(args.out, exist_ok=True)
    l2 = getattr(torch.cuda.get_device_properties(0), "L2_cache_size", 60 << 20) or (60 << 20)
    bw, rate = measure_ceilings(args.rep_ms)
    header = versions_header(fns, bw, rate)
    print("\n".join(header), flush=True)
    done = []
    if args.backward:
        return main_backward(rows, impls, fns, l2, args, header)
    with torch.no_grad():
        for name, shape, Q in rows:
            r = run_row(SHAPES.index((name, shape, Q)), name, shape, Q, impls, fns, bw, rate, l2, args.rep_ms)
            done.append(r)
            t = r["time_us"]
            print(f"{name:14} " + "  ".join(f"{i} {fmt_t(r, i)}" + (" us" if i in t else "") for i in impls)
                  + "".join(f"  {t[p] / t['ours']:.2f}x vs {p}" for p in PEERS if p in t and "ours" in t)
                  + f"  floor {r['floor_us']:.1f} us" + (f" ({r['floor_us'] / t['ours']:.2f} of ours)" if "ours" in t else "")
                  + "  err " + " ".join(f"{i} {fmt_e(v)}" for i, v in r["err"].items()), flush=True)
            md = markdown(done, header, impls)  # rewritten after every row: a cut-short run keeps its rows
            if cli_rows:
                md += cli_markdown(rows, cli_rows)
            with open(os.path.join(args.out, "benchmarks.md"), "w") as f:
                f.write(md)
            with open(os.path.join(args.out, "benchmarks.json"), "w") as f:
                json.dump(dict(header=header, copy_Bps=bw, matmul_flops=rate, rows=done,
                               cli={p: {",".join(map(str, k)): v for k, v in r.items()} for p, r in cli_rows.items()}),
                          f, indent=1)
            try:
                plot(done, os.path.join(args.out, "benchmarks.png"))
            except Exception as e:
                print(f"plot: {short(e)}")
    print("\n" + md)


def plot_backward(rows, path):
    """The training step's speedup over each peer, one group of bars per row (the forward's plot has
    the scaling panels; docs/benchmarks.md shows this one beside them)."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(10, 4))
    width = 0.38
    for j, peer in enumerate(PEERS):
        xs, ys = [], []
        for i, r in enumerate(rows):
            if "ours" in r["time_us"] and peer in r["time_us"]:
                xs.append(i + (j - 0.5) * width)
                ys.append(r["time_us"][peer] / r["time_us"]["ours"])
        bars = ax.bar(xs, ys, width, label=f"over {peer}")
        ax.bar_label(bars, [f"{y:.2f}x" for y in ys], fontsize=7)
    ax.axhline(1.0, color="gray", lw=0.8)
    ax.set_xticks(range(len(rows)), [r["name"] for r in rows], rotation=20, fontsize=8)
    ax.set_ylabel("speedup of mamba2ssd (forward + backward)")
    ax.legend()
    fig.suptitle("mamba2ssd training step (forward + backward) speedup (bf16)")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main_backward(rows, impls, fns, l2, args, header):
    done = []
    md = ""
    for name, shape, Q in rows:
        r = run_backward_row(SHAPES.index((name, shape, Q)), name, shape, Q, impls, fns, l2, args.rep_ms)
        done.append(r)
        t = r["time_us"]
        print(f"{name:14} " + "  ".join(f"{i} {fmt_t(r, i)}" + (" us" if i in t else "") for i in impls)
              + "".join(f"  {t[p] / t['ours']:.2f}x vs {p}" for p in PEERS if p in t and "ours" in t)
              + "  peak MB " + " ".join(f"{i} {v / 1e6:.0f}" for i, v in r["peak_bytes"].items())
              + "  worst grad err " + " ".join(f"{i} {fmt_e(max(e.values()))}" for i, e in r["err"].items()),
              flush=True)
        md = markdown_backward(done, header, impls)  # rewritten after every row, as the forward's
        with open(os.path.join(args.out, "benchmarks_backward.md"), "w") as f:
            f.write(md)
        with open(os.path.join(args.out, "benchmarks_backward.json"), "w") as f:
            json.dump(dict(header=header, rows=done), f, indent=1)
        try:
            plot_backward(done, os.path.join(args.out, "benchmarks_backward.png"))
        except Exception as e:
            print(f"plot: {short(e)}")
    print("\n" + md)


if __name__ == "__main__":
    main()
