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

With --matrix, the configuration matrix instead of the plain rows (MATRIX; the same timing, check
and floor, each row carrying its call's options): packed sequences with their states (seq_idx,
cu_seqlens, final and varlen states), head dims 128 and 32, fp32 inputs, small problems, and the
Mamba-2 layer's own call (strided views of its projection buffers, z, D per (head, dim), dt_bias
with softplus, chunk 64 and 256). fla runs where chunk_simple_gla can make the call ("n/a (why)"
elsewhere); every loss against a peer is printed as one. do_bench time 150 ms per measurement
unless --rep-ms says otherwise. Writes benchmarks_matrix.md / .json. With --matrix --backward, the
training step on the matrix rows whose call is the plain one in another shape or dtype (head dims,
fp32, small; the packed and layer rows' options are not in the step's call, and are left out, named):
benchmarks_matrix_backward.md / .json.

    python3 bench/bench.py [--quick] [--backward | --matrix] [--out DIR]   # on the GPU machine
    python3 bench/bench.py --dry-run [--backward | --matrix]               # the shape table; no CUDA
"""

import argparse
import collections
import datetime
import functools
import json
import math
import os
import random
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# A row: name, (b, L, H, P, N, G), chunk, and its call's options (None: the plain call, DEFAULT_OPTS).
Row = collections.namedtuple("Row", "name shape chunk opts", defaults=(None,))
DEFAULT_OPTS = dict(
    category="",          # the matrix's group of rows
    dtype="bf16",         # x, B, C (and z)
    D="head",             # D [H]; "dim": D [H, P]
    z=False,              # the output gate z
    dt_bias=False,        # dt_bias [H], with dt_softplus=True
    layout="contiguous",  # "projection": views of the Mamba-2 layer's buffers (projection_views)
    seqlens=None,         # packed sequences in one batch row: seq_idx and cu_seqlens passed
    final=False,          # return_final_states
    varlen=False,         # return_varlen_states (needs seqlens)
)


def opt(row, key):
    return (row.opts or {}).get(key, DEFAULT_OPTS[key])


# The plain rows; QUICK rows run with --quick
SHAPES = [
    Row("4K", (4, 4096, 8, 64, 128, 1), 128),
    Row("16K headline", (4, 16384, 8, 64, 128, 1), 128),
    Row("64K", (4, 65536, 8, 64, 128, 1), 128),
    Row("16K N64", (4, 16384, 8, 64, 64, 1), 128),
    Row("16K N256", (4, 16384, 8, 64, 256, 1), 128),
    Row("2.7B", (8, 2048, 80, 64, 128, 1), 128),
    Row("8K H80", (1, 8192, 80, 64, 128, 1), 128),
    Row("4K H128 G8", (2, 4096, 128, 64, 128, 8), 128),
    Row("16K chunk256", (4, 16384, 8, 64, 128, 1), 256),
]
QUICK = ["16K headline", "4K", "2.7B"]


def packed_lengths(total, lo, hi, seed):
    """Request lengths log-uniform in [lo, hi] from a fixed seed, drawn until they fill `total` tokens
    (the last one cut to fit). Plain Python, so --dry-run shows them without torch."""
    rng = random.Random(seed)
    lens = []
    while sum(lens) < total:
        n = int(math.exp(rng.uniform(math.log(lo), math.log(hi))))
        lens.append(min(n, total - sum(lens)))
    return lens


def matrix_row(category, name, shape, chunk=128, **opts):
    return Row(name, shape, chunk, dict(category=category, **opts))


# The configuration matrix (--matrix): shapes of Mamba-2 models, chosen before any timing. The
# Mamba-2 130M..2.7B models have P 64, N 128, G 1 and 2 d_model / 64 heads (24, 32, 48, 64, 80);
# the 7B-class ones (Codestral Mamba, Nemotron-H 8B) H 128, G 8; the layer's default chunk is 256.
PACKED = dict(final=True, varlen=True)  # a server's prefill: every request's state, for its decode
LAYER = dict(layout="projection", z=True, D="dim", dt_bias=True)
MATRIX = [
    # 1. packed requests of mixed lengths, each with its own state
    matrix_row("packed", "64K chat reqs H80", (1, 65536, 80, 64, 128, 1),
               seqlens=packed_lengths(65536, 32, 2048, seed=1), **PACKED),
    matrix_row("packed", "64K doc reqs H80", (1, 65536, 80, 64, 128, 1),
               seqlens=packed_lengths(65536, 1024, 16384, seed=2), **PACKED),
    matrix_row("packed", "16K reqs H128 G8", (1, 16384, 128, 64, 128, 8),
               seqlens=packed_lengths(16384, 64, 4096, seed=3), **PACKED),
    # 2. head dims other than 64: the 2.7B model's 5120 channels as 40 heads of 128 or 160 of 32
    matrix_row("head dim", "P128 N128", (8, 2048, 40, 128, 128, 1)),
    matrix_row("head dim", "P128 N256", (8, 2048, 40, 128, 256, 1)),
    matrix_row("head dim", "P32 N128", (8, 2048, 160, 32, 128, 1)),
    # Nemotron-H Nano 2 (9B): 128 heads of 80, state 128, 8 groups (added in the sixty-first session)
    matrix_row("head dim", "P80 H128 G8", (2, 4096, 128, 80, 128, 8)),
    # 3. fp32 x, B, C
    matrix_row("fp32", "fp32 4K", (4, 4096, 8, 64, 128, 1), dtype="fp32"),
    matrix_row("fp32", "fp32 2.7B", (8, 2048, 80, 64, 128, 1), dtype="fp32"),
    # 4. small: one request of 1K tokens, its final state kept (a serving prefill)
    matrix_row("small", "1K H24 (130M)", (1, 1024, 24, 64, 128, 1), final=True),
    matrix_row("small", "1K H48 (780M)", (1, 1024, 48, 64, 128, 1), final=True),
    matrix_row("small", "1K H80 (2.7B)", (1, 1024, 80, 64, 128, 1), final=True),
    # 5. the Mamba-2 layer's own call: strided views, z, D [H, P], dt_bias + softplus
    matrix_row("layer", "layer H128 G8 Q256", (2, 4096, 128, 64, 128, 8), 256, **LAYER),
    matrix_row("layer", "layer H128 G8 Q64", (2, 4096, 128, 64, 128, 8), 64, **LAYER),
    matrix_row("layer", "layer 2.7B Q256", (8, 2048, 80, 64, 128, 1), 256, **LAYER),
]
IMPLS = ["ours", "mamba_ssm", "fla"]
PEERS = ["mamba_ssm", "fla"]
ORACLE_TOKENS = 4096
REF_BW, REF_RATE = 4.27e12, 686e12  # the H200 ceilings measured before (docs/contract.md): --dry-run only
ELEMENT_BYTES = {"bf16": 2, "fp16": 2, "fp32": 4}


def category_key(row):
    """A row's category as a command-line word ("head dim" -> "head-dim")."""
    return opt(row, "category").replace(" ", "-")


def matrix_categories():
    """The matrix's categories, in order, as --category takes them."""
    return list(dict.fromkeys(category_key(r) for r in MATRIX))


def quick_matrix():
    """--matrix --quick: the first row of each category."""
    seen, rows = set(), []
    for row in MATRIX:
        if opt(row, "category") not in seen:
            seen.add(opt(row, "category"))
            rows.append(row)
    return rows


def work(row):
    """(bytes, flops) that any forward must move and do (docs/contract.md): x, y, B, C (and z) in
    the row's dtype and dt (fp32, or the projection's dtype where it is a view of it) once each, the
    fp32 states written; 4QNP + 2Q^2P flops per (batch, chunk, head) and 2Q^2N per (batch, chunk, group)."""
    b, L, H, P, N, G = row.shape
    Q = row.chunk
    e = ELEMENT_BYTES[opt(row, "dtype")]
    dt_bytes = e if opt(row, "layout") == "projection" else 4
    nbytes = e * (2 * b * L * H * P) + e * (2 * b * L * G * N) + dt_bytes * b * L * H
    if opt(row, "z"):
        nbytes += e * b * L * H * P
    states = (b if opt(row, "final") else 0) + (len(opt(row, "seqlens")) if opt(row, "varlen") else 0)
    nbytes += 4 * states * H * P * N
    chunks = b * math.ceil(L / Q)
    flops = chunks * H * (4 * Q * N * P + 2 * Q * Q * P) + chunks * G * 2 * Q * Q * N
    return nbytes, flops


def fla_why_not(row):
    """Why fla's chunk_simple_gla cannot run the row's call as timed here (None: it can)."""
    if opt(row, "seqlens"):
        return "n/a (packed: its cu_seqlens path calls .item(), which a CUDA graph cannot capture)"
    if opt(row, "z") or opt(row, "dt_bias"):
        return "n/a (z gate, dt_bias and softplus are not in its call)"
    return None


def describe(row):
    """The row's call beyond its shape, in a few words."""
    parts = [opt(row, "dtype")]
    if opt(row, "layout") == "projection":
        parts.append(f"views of zxbcdt and xBC (dt {opt(row, 'dtype')})")
    if opt(row, "z"):
        parts.append("z")
    parts.append("D [H, P]" if opt(row, "D") == "dim" else "D [H]")
    if opt(row, "dt_bias"):
        parts.append("dt_bias + softplus")
    lens = opt(row, "seqlens")
    if lens:
        s = sorted(lens)
        parts.append(f"{len(s)} seqs of {s[0]}..{s[len(s) // 2]}..{s[-1]} (min..median..max)")
    states = [k for k in ("final", "varlen") if opt(row, k)]
    if states:
        parts.append(" + ".join(states) + " states")
    return ", ".join(parts)


def n_sets(nbytes, l2_bytes):
    """Input sets to rotate among so that one replay touches at least 3x the L2 cache (at most 8)."""
    return max(1, min(8, math.ceil(3 * l2_bytes / nbytes)))


def fmt_shape(shape):
    return ", ".join(str(v) for v in shape)


def floor_note():
    return (f"* floor with the reference ceilings {REF_BW / 1e12} TB/s and {REF_RATE / 1e12:.0f} TFLOP/s "
            "(a real run measures its own); sets assume a 60 MB L2")


def dry_run(rows, backward=False):
    if backward:
        return dry_run_backward(rows)
    print(f"{'row':14} {'b, L, H, P, N, G':28} {'Q':>4} {'MB':>8} {'GFLOP':>8} {'sets':>4} {'floor us*':>9}")
    for row in rows:
        nbytes, flops = work(row)
        floor = max(nbytes / REF_BW, flops / REF_RATE) * 1e6
        print(f"{row.name:14} {fmt_shape(row.shape):28} {row.chunk:4} {nbytes / 1e6:8.1f} {flops / 1e9:8.2f} "
              f"{n_sets(nbytes, 60e6):4} {floor:9.1f}")
    print(floor_note())


def dry_run_matrix(rows):
    """The matrix as a markdown table: each row's shape, call, work, floor and which peers run it."""
    print("| category | row | b, L, H, P, N, G | Q | call | MB | GFLOP | sets | floor us* | mamba_ssm | fla |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for row in rows:
        nbytes, flops = work(row)
        floor = max(nbytes / REF_BW, flops / REF_RATE) * 1e6
        print(f"| {opt(row, 'category')} | {row.name} | {fmt_shape(row.shape)} | {row.chunk} | {describe(row)} | "
              f"{nbytes / 1e6:.1f} | {flops / 1e9:.2f} | {n_sets(nbytes, 60e6)} | {floor:.1f} | yes | "
              f"{fla_why_not(row) or 'yes'} |")
    print(floor_note() + "; the floor counts flops at the bf16 matmul rate, for the fp32 rows too")


# --- the GPU part (torch and triton are imported only past this point) -------------------------

def short(e):
    msg = f"{type(e).__name__}: {e}".replace("|", "/").replace("\n", " ")
    return msg[:70] + ("..." if len(msg) > 70 else "")


TORCH_DTYPES = {"bf16": "bfloat16", "fp16": "float16", "fp32": "float32"}


def make_inputs(row, seed, device):
    """One input set {x, dt, B, C (, z)} as the row's call passes them."""
    import torch
    import torch.nn.functional as F
    b, L, H, P, N, G = row.shape
    dtype = getattr(torch, TORCH_DTYPES[opt(row, "dtype")])
    gen = torch.Generator(device=device).manual_seed(seed)
    rnd = lambda *s: torch.randn(*s, generator=gen, device=device)  # noqa: E731
    if opt(row, "layout") == "projection":
        return projection_views(row, rnd, dtype)
    s = dict(
        x=rnd(b, L, H, P).to(dtype),
        dt=F.softplus(rnd(b, L, H) - 3.0),  # in (0, ~1), mostly 0.01 to 0.2, never 0
        B=rnd(b, L, G, N).to(dtype),
        C=rnd(b, L, G, N).to(dtype),
    )
    if opt(row, "z"):
        s["z"] = rnd(b, L, H, P).to(dtype)
    return s


def projection_views(row, rnd, dtype):
    """x, B, C, z, dt as the Mamba-2 layer passes them: its input projection zxbcdt [b, L, 2HP + 2GN + H]
    holds z, xBC and dt side by side; the causal conv writes xBC to a buffer of its own [b, L, HP + 2GN],
    split into x, B, C. So each is a view: last dim contiguous, token stride its buffer's width. dt is
    raw (the op adds dt_bias and applies softplus) and in the projection's dtype."""
    b, L, H, P, N, G = row.shape
    hp, gn = H * P, G * N
    zxbcdt = rnd(b, L, 2 * hp + 2 * gn + H).to(dtype)
    zxbcdt[..., -H:] *= 0.5  # raw dt near 0: the step is about softplus(dt_bias)
    xBC = rnd(b, L, hp + 2 * gn).to(dtype)
    return dict(x=xBC[..., :hp].unflatten(-1, (H, P)),
                B=xBC[..., hp:hp + gn].unflatten(-1, (G, N)),
                C=xBC[..., hp + gn:].unflatten(-1, (G, N)),
                z=zxbcdt[..., :hp].unflatten(-1, (H, P)),
                dt=zxbcdt[..., -H:])


def make_params(row, seed, device):
    """{A, D} and, where the row has them, dt_bias and the packed sequences' seq_idx and cu_seqlens."""
    import torch
    import torch.nn.functional as F
    b, L, H, P, N, G = row.shape
    gen = torch.Generator(device=device).manual_seed(seed)
    p = dict(A=-torch.exp(torch.rand(H, generator=gen, device=device) * math.log(16.0)))  # in [-16, -1]
    p["D"] = torch.randn(*((H, P) if opt(row, "D") == "dim" else (H,)), generator=gen, device=device)
    if opt(row, "dt_bias"):
        # Mamba-2's initialization: softplus(dt_bias) log-uniform in [0.001, 0.1]
        step = 0.001 * torch.exp(torch.rand(H, generator=gen, device=device) * math.log(100.0))
        p["dt_bias"] = step + torch.log(-torch.expm1(-step))  # softplus's inverse
    lens = opt(row, "seqlens")
    if lens:
        n = torch.tensor(lens, device=device)
        p["cu_seqlens"] = F.pad(n.cumsum(0), (1, 0)).int()
        p["seq_idx"] = torch.repeat_interleave(torch.arange(len(lens), device=device), n).int()[None]
    return p


def call_kwargs(row, p, s):
    """Keyword arguments of the row's call to ours or mamba_ssm (the same for both) on set s."""
    kw = dict(D=p["D"])
    if "z" in s:
        kw["z"] = s["z"]
    if "dt_bias" in p:
        kw.update(dt_bias=p["dt_bias"], dt_softplus=True)
    if "cu_seqlens" in p:  # mamba_ssm restarts sequences at seq_idx only; cu_seqlens places the varlen states
        kw.update(seq_idx=p["seq_idx"], cu_seqlens=p["cu_seqlens"])
    if opt(row, "final"):
        kw["return_final_states"] = True
    if opt(row, "varlen"):
        kw["return_varlen_states"] = True
    return kw


def effective_dt(dt, dt_bias, softplus):
    """The step the recurrence uses, in float64: dt + dt_bias, then softplus (identity above 20)."""
    import torch
    d = dt.double() + (0.0 if dt_bias is None else dt_bias.double())
    return torch.where(d <= 20.0, torch.log1p(torch.exp(d)), d) if softplus else d


def oracle(x, dt, A, B, C, D, z=None, restart=(), keep=()):
    """y in float64 by the contract's sequential recurrence, on x's device: x [L, h, P], dt [L, h]
    (the step itself: dt_bias and softplus applied), A [h], B/C [L, h, N] (already per head), D [h] or
    [h, P], z [L, h, P] or None. The state restarts from zero at each token in restart (a packed
    sequence's first). Returns (y, {t: state [h, P, N] after token t, for t in keep})."""
    import torch
    x, dt, A, B, C, D = (t.double() for t in (x, dt, A, B, C, D))
    L, nh, P = x.shape
    state = torch.zeros(nh, P, B.shape[-1], dtype=torch.float64, device=x.device)
    decay = torch.exp(A * dt)  # [L, h]
    xdt = x * dt[..., None]
    y = torch.empty_like(x)
    restart, keep, kept = set(restart), set(keep), {}
    for t in range(L):
        if t in restart:
            state.zero_()
        state.mul_(decay[t, :, None, None]).add_(xdt[t, :, :, None] * B[t, :, None, :])
        y[t] = (state @ C[t, :, :, None])[..., 0]
        if t in keep:
            kept[t] = state.clone()
    y = y + (D[:, None] if D.dim() == 1 else D) * x
    if z is not None:
        z = z.double()
        y = y * z * torch.sigmoid(z)  # silu(z)
    return y, kept


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


def split_outputs(raw, row):
    """{y, final, varlen} from the op's result: y, or a tuple in mamba_ssm's order."""
    raw = raw if isinstance(raw, tuple) else (raw,)
    names = ["y"] + (["final"] if opt(row, "final") else []) + (["varlen"] if opt(row, "varlen") else [])
    return dict(zip(names, raw))


def make_call(name, fn, sets, p, row):
    """(call(i) -> raw output of set i, finish(raw, s) -> {y (with D x), final, varlen} comparable to the others)."""
    A, Q = p["A"], row.chunk
    if name in ("ours", "mamba_ssm"):
        kws = [call_kwargs(row, p, s) for s in sets]
        call = lambda i: fn(sets[i]["x"], sets[i]["dt"], A, sets[i]["B"], sets[i]["C"], Q, **kws[i])  # noqa: E731
        return call, lambda raw, s: split_outputs(raw, row)
    # fla: prepared outside the timed region
    H, G = sets[0]["x"].shape[2], sets[0]["B"].shape[2]
    final = opt(row, "final")
    prep = []
    for s in sets:
        prep.append(dict(q=s["C"].repeat_interleave(H // G, dim=2).contiguous(),
                         k=s["B"].repeat_interleave(H // G, dim=2).contiguous(),
                         v=(s["x"].float() * s["dt"][..., None]).to(s["x"].dtype),
                         g=(A * s["dt"]).contiguous()))
    call = lambda i: fn(prep[i]["q"], prep[i]["k"], prep[i]["v"], g=prep[i]["g"], scale=1.0,  # noqa: E731
                        output_final_state=final)

    def finish(raw, s):
        o, ht = raw
        D = p["D"][:, None] if p["D"].dim() == 1 else p["D"]
        out = dict(y=(o.float() + D * s["x"].float()).to(s["x"].dtype))
        if final:
            out["final"] = ht.transpose(-1, -2)  # its state is [b, H, N, P]
        return out
    return call, finish


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


def check_slice(row, s, p):
    """The oracle on the checked slice: batch row 0, the first and last heads, the first ORACLE_TOKENS
    tokens, the state restarting where a packed sequence starts. Returns (heads, Lc, y_ref, state_refs):
    state_refs lists (output, index, reference [2, P, N]) for each varlen state of a sequence that ends
    inside the slice and for the final state when the slice reaches the last token."""
    b, L, H, P, N, G = row.shape
    heads, Lc = [0, H - 1], min(L, ORACLE_TOKENS)
    groups = [h // (H // G) for h in heads]
    starts, wanted, end = [], [], 0
    for j, n in enumerate(opt(row, "seqlens") or []):
        starts.append(end)
        end += n
        if opt(row, "varlen") and n > 0 and end <= Lc:
            wanted.append(("varlen", j, end - 1))
    if opt(row, "final") and L <= Lc:
        wanted.append(("final", 0, L - 1))
    dt = effective_dt(s["dt"][0, :Lc, heads], p["dt_bias"][heads] if "dt_bias" in p else None, opt(row, "dt_bias"))
    z = s["z"][0, :Lc, heads] if "z" in s else None
    y, kept = oracle(s["x"][0, :Lc, heads], dt, p["A"][heads], s["B"][0, :Lc, groups], s["C"][0, :Lc, groups],
                     p["D"][heads], z=z, restart=[t for t in starts if t < Lc], keep=[t for *_, t in wanted])
    return heads, Lc, y, [(name, j, kept[t]) for name, j, t in wanted]


def unavailable(impl, fns, row):
    """Why impl does not run the row (None: it does): it did not import, or fla cannot express the call."""
    if impl not in fns or isinstance(fns[impl], str):
        return fns.get(impl, "not run")
    return fla_why_not(row) if impl == "fla" else None


def run_row(index, row, impls, fns, bw, rate, l2, rep_ms):
    """Times the row's forward for each implementation and checks each output on the slice."""
    import torch
    nbytes, flops = work(row)
    floor_us = max(nbytes / bw, flops / rate) * 1e6
    ns = n_sets(nbytes, l2)
    sets = [make_inputs(row, 1000 * index + i, "cuda") for i in range(ns)]
    p = make_params(row, 1000 * index + 999, "cuda")
    r = dict(name=row.name, shape=row.shape, chunk=row.chunk, opts=row.opts or {}, call=describe(row), bytes=nbytes, flops=flops,
             floor_us=floor_us, sets=ns, time_us={}, spread={}, why={}, err={}, state_err={}, diff={})
    heads, Lc, y_ref, state_refs = check_slice(row, sets[0], p)
    ys, states = {}, {}
    for impl in impls:
        why = unavailable(impl, fns, row)
        if why:
            r["why"][impl] = why
            continue
        try:
            call, finish = make_call(impl, fns[impl], sets, p, row)
            t, outs = time_graph(call, ns, rep_ms)
            r["time_us"][impl] = (t[0] + t[1]) / 2
            r["spread"][impl] = abs(t[0] - t[1]) / min(t)
            out = finish(outs[0], sets[0])
            ys[impl] = out["y"]
            states[impl] = [out[name][j, heads] for name, j, _ in state_refs]  # the slice's heads only
            del call, outs, out
        except Exception as e:  # a peer that fails must not stop the run (a dead context will, later)
            r["why"][impl] = short(e)
        torch.cuda.synchronize()
        torch.cuda.empty_cache()
    for impl, y in ys.items():  # NaN if any element of the whole output is not finite
        r["err"][impl] = rel(y[0, :Lc, heads], y_ref) if torch.isfinite(y).all() else float("nan")
        if state_refs:
            r["state_err"][impl] = rel(torch.stack(states[impl]), torch.stack([ref for *_, ref in state_refs]))
        if impl != "ours" and "ours" in ys:
            r["diff"][impl] = rel(ys["ours"], y)
    del sets, ys, states
    torch.cuda.empty_cache()
    return r


def speedup(r, peer):
    """peer time / our time, or None when either did not run."""
    t = r["time_us"]
    return t[peer] / t["ours"] if "ours" in t and peer in t else None


def fmt_speedup(r, peer):
    """The speedup cell; a loss (below 1) says so, in bold; n/a where the peer cannot make the call."""
    x = speedup(r, peer)
    if x is None:
        return "n/a" if r["why"].get(peer, "").startswith("n/a") else ""
    return f"{x:.2f}x" if x >= 1 else f"**{x:.2f}x (loss)**"


def fmt_t(row, impl):
    t = row["time_us"].get(impl)
    if t is not None:
        return f"{t:.1f}"
    why = row["why"].get(impl, "not run")
    return why if why.startswith("n/a") else f"({why})"


def fmt_e(v):
    return "" if v is None else ("NaN" if v != v else f"{v:.1e}")


def row_line(r, impls, width):
    """The row's console line: times, speedups (a loss marked), floor, errors."""
    t = r["time_us"]
    line = f"{r['name']:{width}} " + "  ".join(f"{i} {fmt_t(r, i)}" + (" us" if i in t else "") for i in impls)
    for p in PEERS:
        x = speedup(r, p)
        if x is not None:
            line += f"  {x:.2f}x vs {p}" + (" LOSS" if x < 1 else "")
    line += f"  floor {r['floor_us']:.1f} us" + (f" ({r['floor_us'] / t['ours']:.2f} of ours)" if "ours" in t else "")
    line += "  err " + " ".join(f"{i} {fmt_e(v)}" for i, v in r["err"].items())
    if r.get("state_err"):
        line += "  state err " + " ".join(f"{i} {fmt_e(v)}" for i, v in r["state_err"].items())
    return line


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
    for row in rows:
        key = (*row.shape, row.chunk)
        t, c = cli_rows["tile"].get(key), cli_rows["auto"].get(key)
        def cell(v):
            return "(not run)" if v is None else (f"({v[2][:60]})" if v[2] else f"{v[0] * 1e6:.1f}")
        ratio = f"{t[0] / c[0]:.2f}" if t and c and t[0] and c[0] else ""
        out.append(f"| {row.name} | {cell(t)} | {cell(c)} | {ratio} | {fmt_e(t and t[1])} | {fmt_e(c and c[1])} |")
    return "\n".join(out) + "\n"


def noise_lines(rows):
    spreads = [v for r in rows for v in r.get("spread", {}).values()]
    if not spreads:
        return []
    return ["", f"Noise: each time is the mean of two back-to-back do_bench medians of the same graph; "
            f"they differed by at most {100 * max(spreads):.1f}% in this run (median "
            f"{100 * sorted(spreads)[len(spreads) // 2]:.1f}%): smaller speedup differences are noise."]


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
        sp = [fmt_speedup(r, p) for p in peers]
        frac = f"{r['floor_us'] / ours:.2f}" if ours else ""
        out.append(f"| {r['name']} | {fmt_shape(r['shape'])} | {r['chunk']} | {r['sets']} | "
                   + " | ".join(fmt_t(r, i) for i in impls) + " | " + " | ".join(sp)
                   + f" | {r['floor_us']:.1f} | {frac} |")
    out += noise_lines(rows)
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


def matrix_markdown(rows, header, impls):
    """The matrix: times and speedups by category (every loss listed), then errors against the oracle."""
    peers = [p for p in PEERS if p in impls]
    out = ["# mamba2ssd forward: configuration matrix", "", *header, "",
           "Times in us per forward call, measured as the plain rows (docs/benchmarking.md): the forward on "
           "`sets` input sets in turn, captured in one CUDA graph, replays timed by triton.testing.do_bench "
           "(median, L2 flushed before each replay), divided by `sets`. x vs peer = peer time / our time; "
           "below 1 is a loss, printed as one. n/a: the peer's function cannot make that call (why in the "
           "cell). Floor: as the plain rows (bf16 matmul rate for the flops, fp32 rows too).", "",
           "| category | row | b, L, H, P, N, G | Q | call | sets | " + " | ".join(f"{i} us" for i in impls)
           + " | " + " | ".join(f"x vs {p}" for p in peers) + " | floor us | floor / ours |",
           "|---|---|---|---|---|---|" + "---|" * (len(impls) + len(peers) + 2)]
    for r in rows:
        ours = r["time_us"].get("ours")
        frac = f"{r['floor_us'] / ours:.2f}" if ours else ""
        out.append(f"| {r['opts'].get('category', '')} | {r['name']} | {fmt_shape(r['shape'])} | {r['chunk']} | "
                   f"{r['call']} | {r['sets']} | " + " | ".join(fmt_t(r, i) for i in impls) + " | "
                   + " | ".join(fmt_speedup(r, p) for p in peers) + f" | {r['floor_us']:.1f} | {frac} |")
    pairs = [(r, p) for r in rows for p in peers if speedup(r, p) is not None]
    losses = [f"{r['name']} vs {p} ({speedup(r, p):.2f}x)" for r, p in pairs if speedup(r, p) < 1]
    out += ["", f"Losses: {len(losses)} of {len(pairs)} comparisons" + (": " + "; ".join(losses) if losses else ".")]
    out += noise_lines(rows)
    out += ["", f"Correctness: ||out - oracle|| / ||oracle|| on batch row 0, the first and last heads, the first "
            f"{ORACLE_TOKENS} tokens (float64 sequential recurrence, restarted at each packed sequence's "
            "start): y, and the states (varlen states of the sequences that end in that slice, and the final "
            "state where the slice is the whole row); ||y_ours - y_peer|| / ||y_peer|| on the whole output.", "",
            "| row | " + " | ".join(f"err {i}" for i in impls) + " | " + " | ".join(f"state err {i}" for i in impls)
            + " | " + " | ".join(f"ours vs {p}" for p in peers) + " |",
            "|---|" + "---|" * (2 * len(impls) + len(peers))]
    for r in rows:
        out.append(f"| {r['name']} | " + " | ".join(fmt_e(r["err"].get(i)) for i in impls) + " | "
                   + " | ".join(fmt_e(r["state_err"].get(i)) for i in impls) + " | "
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


def backward_bytes(shape, e=2):
    """Bytes of one training step's tensors that any implementation holds: the inputs (x/B/C of e
    bytes an element, fp32 dt), dout, and the gradients of the same shapes (what the peak memory is
    measured against)."""
    b, L, H, P, N, G = shape
    tensors = e * b * L * H * P + 2 * e * b * L * G * N + 4 * b * L * H  # x, B, C, dt
    return 2 * tensors + e * b * L * H * P  # and their gradients, and dout


def step_rows(rows):
    """The rows a training step can time (make_step calls the plain op with D per head): those whose
    call differs from the plain one only in shape, dtype and final states; and the names of the
    others (options the step's call does not pass: seq_idx, cu_seqlens, z, dt_bias, views)."""
    plain = {"category", "dtype", "final"}
    keep = [r for r in rows if set(k for k, v in (r.opts or {}).items() if v != DEFAULT_OPTS[k]) <= plain]
    return keep, [r.name for r in rows if r not in keep]


def dry_run_backward(rows):
    print(f"{'row':14} {'b, L, H, P, N, G':28} {'Q':>4} {'tensors MB':>10} {'sets':>4}")
    for row in rows:
        nbytes = backward_bytes(row.shape, ELEMENT_BYTES[opt(row, "dtype")])
        print(f"{row.name:14} {fmt_shape(row.shape):28} {row.chunk:4} {nbytes / 1e6:10.1f} {n_sets(nbytes, 60e6):4}")
    print("tensors: inputs, dout and gradients (x/B/C in the row's dtype, bf16 unless named; fp32 dt) that "
          "every implementation holds; sets assume a 60 MB L2")


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


def backward_slice(shape):
    """The backward's check slice: batch row 0, the first and last heads (and their groups), the first
    ORACLE_TOKENS tokens, as (heads, tokens, groups)."""
    b, L, H, P, N, G = shape
    heads, Lc = [0, H - 1] if H > 1 else [0], min(L, ORACLE_TOKENS)
    return heads, Lc, sorted({h // (H // G) for h in heads})


def slice_dout(shape, dout):
    """dout zero outside the backward's check slice."""
    import torch
    heads, Lc, _ = backward_slice(shape)
    check_dout = torch.zeros_like(dout)
    check_dout[0, :Lc, heads] = dout[0, :Lc, heads]
    return check_dout


def slice_grad_errors(shape, s, A, D, check_dout, grads_by_impl):
    """Each implementation's gradients (dicts keyed by GRADS) against the float64 oracle on the
    backward's check slice, from one step on set s with check_dout (slice_dout): {impl: {grad: rel error}}, NaN for
    every gradient of an implementation that is not zero outside the slice."""
    heads, Lc, groups = backward_slice(shape)
    H, G = shape[2], shape[5]
    head_group = [groups.index(h // (H // G)) for h in heads]
    ref = oracle_grads(s["x"][0, :Lc, heads], s["dt"][0, :Lc, heads], A[heads], s["B"][0, :Lc, groups],
                       s["C"][0, :Lc, groups], D[heads], check_dout[0, :Lc, heads], head_group)
    errs = {}
    for impl, g in grads_by_impl.items():
        got = dict(x=g["x"][0, :Lc, heads], dt=g["dt"][0, :Lc, heads], A=g["A"][heads],
                   B=g["B"][0, :Lc, groups], C=g["C"][0, :Lc, groups], D=g["D"][heads])
        # Outside the slice every gradient must be zero (dout is): NaN marks one that is not.
        outside = sum(float(t.float().abs().sum()) for t in (g["x"][1:], g["x"][0, Lc:], g["B"][0, Lc:]))
        errs[impl] = {k: (rel(got[k], ref[k]) if outside == 0 else float("nan")) for k in GRADS}
    return errs


def run_backward_row(index, row, impls, fns, l2, rep_ms):
    import torch
    name, shape, Q = row.name, row.shape, row.chunk
    b, L, H, P, N, G = shape
    nbytes = backward_bytes(shape, ELEMENT_BYTES[opt(row, "dtype")])
    ns = n_sets(nbytes, l2)
    sets = [make_inputs(row, 1000 * index + i, "cuda") for i in range(ns)]
    p = make_params(row, 1000 * index + 999, "cuda")
    A, D = p["A"], p["D"]
    for i, s in enumerate(sets):  # dout in y's dtype
        gen = torch.Generator(device="cuda").manual_seed(1000 * index + 500 + i)
        s["dout"] = torch.randn(b, L, H, P, generator=gen, device="cuda").to(s["x"].dtype)
    # The check's dout: set 0's, zero outside batch row 0, the first and last heads, the first tokens.
    check_dout = slice_dout(shape, sets[0]["dout"])
    row = dict(name=name, shape=shape, chunk=Q, sets=ns, tensor_bytes=nbytes, time_us={},
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
        row["err"] = slice_grad_errors(shape, sets[0], A, D, check_dout, grads)
    del sets, grads
    torch.cuda.empty_cache()
    return row


def markdown_backward(rows, header, impls):
    peers = [p for p in PEERS if p in impls]
    out = ["# mamba2ssd forward + backward benchmark", "", *header, "",
           "Times in us per training step (forward, then the gradients of x, dt, A, B, C, D for a random "
           "dout in y's dtype): the step on `sets` input sets in turn, captured in one CUDA graph, replays timed "
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


def versions_header(fns, bw, rate, inputs):
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
            inputs]


def run_forward(rows, seed_index, impls, fns, bw, rate, l2, rep_ms, write):
    """Times the rows in turn (plain or matrix alike), printing each row's line and calling
    write(rows so far) after each, so that a run cut short keeps its rows. Returns write's last result."""
    import torch
    done, md = [], ""
    width = max([14] + [len(row.name) for row in rows])
    with torch.no_grad():
        for row in rows:
            r = run_row(seed_index(row), row, impls, fns, bw, rate, l2, rep_ms)
            done.append(r)
            print(row_line(r, impls, width), flush=True)
            md = write(done)
    return md


def write_file(folder, name, text):
    with open(os.path.join(folder, name), "w") as f:
        f.write(text)


PLAIN_INPUTS = "- inputs: bf16 x/B/C, fp32 dt (softplus(N(-3, 1))), A in [-16, -1], D per head; no z, no states"
MATRIX_INPUTS = ("- inputs: x/B/C (and z) N(0, 1) in the row's dtype; dt fp32 softplus(N(-3, 1)), except in the "
                 "layer rows: raw 0.5 N(0, 1) in the projection's dtype, with dt_bias = softplus^-1 of "
                 "log-uniform [0.001, 0.1] and softplus; A in [-16, -1]; D N(0, 1); packed rows: seq_idx and "
                 "cu_seqlens of lengths log-uniform in a range, from a fixed seed")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true",
                    help=f"only the rows {', '.join(QUICK)} (with --matrix: the first row of each category)")
    ap.add_argument("--out", default=os.environ.get("OUT") or os.path.join(ROOT, "bench", "out"),
                    help="folder for benchmarks.md, benchmarks.png, benchmarks.json (default $OUT, "
                    "else bench/out)")
    ap.add_argument("--dry-run", action="store_true", help="print the shape table, bytes and flops; no CUDA")
    ap.add_argument("--impls", default=",".join(IMPLS), help="comma list among " + ",".join(IMPLS))
    ap.add_argument("--peers", default=os.path.join(ROOT, ".peers"), help="the peers' folder (get_peers.sh)")
    ap.add_argument("--rep-ms", type=int, help="do_bench time per measurement, ms (500; 150 with --matrix)")
    ap.add_argument("--cli", help="a mamba2ssd CLI built with the tile backend: adds the tile table")
    ap.add_argument("--backward", action="store_true",
                    help="time forward + backward (training step), gradient errors, peak memory")
    ap.add_argument("--save-states", action="store_true",
                    help="with --backward: ours with save_states=True (the forward keeps the states its backward reads)")
    ap.add_argument("--matrix", action="store_true",
                    help="the configuration matrix instead of the plain rows (forward): benchmarks_matrix.md/.json")
    ap.add_argument("--category", help="with --matrix: only these categories, a comma list among "
                    + ", ".join(matrix_categories()) + " (so that the matrix can run in parts)")
    ap.add_argument("--rows", help="only these rows, in this order, a comma list of row names as the tables "
                    "print them (e.g. \"P128 N128,P32 N128\"), so that a run can be split across calls")
    args = ap.parse_args()
    impls = [i for i in args.impls.split(",") if i]
    bad = [i for i in impls if i not in IMPLS]
    if bad:
        ap.error(f"unknown implementation(s) {bad}; choose among {IMPLS}")
    if args.matrix and args.cli:
        ap.error("--matrix times through the Python package; leave out --cli")
    if args.category and not args.matrix:
        ap.error("--category selects rows of --matrix")
    if args.save_states and not args.backward:
        ap.error("--save-states keeps the forward's states for the backward; add --backward")
    if args.matrix:
        rows = quick_matrix() if args.quick else MATRIX
        if args.category:
            wanted = [c.strip().replace(" ", "-") for c in args.category.split(",") if c.strip()]
            unknown = [c for c in wanted if c not in matrix_categories()]
            if unknown:
                ap.error(f"unknown categories {unknown}; choose among {matrix_categories()}")
            rows = [r for r in rows if category_key(r) in wanted]
    else:
        rows = [r for r in SHAPES if not args.quick or r.name in QUICK]
    if args.rows:
        wanted = [n.strip() for n in args.rows.split(",") if n.strip()]
        names = [r.name for r in (MATRIX if args.matrix else SHAPES)]
        unknown = [n for n in wanted if n not in names]
        if unknown:
            ap.error(f"unknown rows {unknown}; choose among {names}")
        # In the order named (each row's inputs stay its own: seeds follow its place in the table), so
        # that a call cut short by its time limit has run the rows named first.
        rows = [r for name in dict.fromkeys(wanted) for r in rows if r.name == name]
    if args.matrix and args.backward:
        rows, left_out = step_rows(rows)
        if left_out:
            print(f"left out of --backward (options the training step's call does not pass): {', '.join(left_out)}",
                  flush=True)
        if not rows:
            ap.error("--matrix --backward: none of the chosen rows is a plain call (see the line above)")
    # The matrix at 150 ms a measurement, and still long: the peers compile and autotune per row (its
    # --quick form reached its time limit in the fifth row, docs/gpu-runs.md run 3), hence --category.
    rep_ms = args.rep_ms or (150 if args.matrix else 500)
    if args.dry_run:
        return dry_run_matrix(rows) if args.matrix and not args.backward else dry_run(rows, args.backward)
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
    bw, rate = measure_ceilings(rep_ms)
    header = versions_header(fns, bw, rate, MATRIX_INPUTS if args.matrix else PLAIN_INPUTS)
    if args.save_states and callable(fns.get("ours")):
        fns["ours"] = functools.partial(fns["ours"], save_states=True)
        header.append("ours with save_states=True: the forward keeps the states its backward reads "
                      "(held from forward to backward, counted in its peak memory)")
    print("\n".join(header), flush=True)
    if args.backward:  # the matrix's seeds apart from the plain rows', as its forward's
        seed_index = (lambda row: 100 + MATRIX.index(row)) if args.matrix else SHAPES.index
        stem = "benchmarks_matrix_backward" if args.matrix else "benchmarks_backward"
        return main_backward(rows, impls, fns, l2, rep_ms, args.out, header, seed_index, stem)

    def write_plain(done):
        md = markdown(done, header, impls) + (cli_markdown(rows, cli_rows) if cli_rows else "")
        write_file(args.out, "benchmarks.md", md)
        write_file(args.out, "benchmarks.json", json.dumps(dict(
            header=header, copy_Bps=bw, matmul_flops=rate, rows=done,
            cli={p: {",".join(map(str, k)): v for k, v in r.items()} for p, r in cli_rows.items()}), indent=1))
        try:
            plot(done, os.path.join(args.out, "benchmarks.png"))
        except Exception as e:
            print(f"plot: {short(e)}")
        return md

    def write_matrix(done):
        md = matrix_markdown(done, header, impls)
        write_file(args.out, "benchmarks_matrix.md", md)
        write_file(args.out, "benchmarks_matrix.json",
                   json.dumps(dict(header=header, copy_Bps=bw, matmul_flops=rate, rows=done), indent=1))
        return md

    if args.matrix:  # seeds apart from the plain rows'
        md = run_forward(rows, lambda row: 100 + MATRIX.index(row), impls, fns, bw, rate, l2, rep_ms, write_matrix)
    else:
        md = run_forward(rows, SHAPES.index, impls, fns, bw, rate, l2, rep_ms, write_plain)
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
        if not xs:  # the peer ran no row: no bars, and no legend entry that would claim some
            continue
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


def main_backward(rows, impls, fns, l2, rep_ms, out_dir, header, seed_index, stem):
    done = []
    md = ""
    for row in rows:
        r = run_backward_row(seed_index(row), row, impls, fns, l2, rep_ms)
        done.append(r)
        t = r["time_us"]
        print(f"{row.name:14} " + "  ".join(f"{i} {fmt_t(r, i)}" + (" us" if i in t else "") for i in impls)
              + "".join(f"  {t[p] / t['ours']:.2f}x vs {p}" for p in PEERS if p in t and "ours" in t)
              + "  peak MB " + " ".join(f"{i} {v / 1e6:.0f}" for i, v in r["peak_bytes"].items())
              + "  worst grad err " + " ".join(f"{i} {fmt_e(max(e.values()))}" for i, e in r["err"].items()),
              flush=True)
        md = markdown_backward(done, header, impls)  # rewritten after every row, as the forward's
        write_file(out_dir, stem + ".md", md)
        write_file(out_dir, stem + ".json", json.dumps(dict(header=header, rows=done), indent=1))
        try:
            plot_backward(done, os.path.join(out_dir, stem + ".png"))
        except Exception as e:
            print(f"plot: {short(e)}")
    print("\n" + md)


if __name__ == "__main__":
    main()
