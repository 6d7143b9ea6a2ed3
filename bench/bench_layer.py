#!/usr/bin/env python3
"""Training-step time of the Mamba-2 layer's call (between the in- and out-projections' inputs and
outputs: convolution, scan, gated norm, out-projection; forward + backward) on one GPU:
  ours        mamba2ssd.mamba_split_conv1d_scan_combined, as configured (python/mamba2ssd/layer.py)
  ours torch ops / ours library ops   the same with its convolution and norm on PyTorch's
              operations (the first version) / on the library's kernels (conv1d_cuda, gated_rmsnorm_cuda)
  ours conv   its causal convolution alone (mamba2ssd.layer.causal_conv1d: the library's kernels on
              CUDA), forward + backward
  ours scan   mamba2ssd.mamba_chunk_scan_combined alone, forward + backward, on the same x, B, C, dt
  mamba_ssm   mamba_ssm 2.3.2.post1's mamba_split_conv1d_scan_combined where causal_conv1d imports;
              else its Mamba2 module's other path, as that module runs without causal_conv1d: a
              PyTorch convolution (float32, autograd), its mamba_chunk_scan_combined and its Triton
              RMSNormGated (rmsnorm_fn), then F.linear ("mamba_ssm unfused")
  mamba_ssm unfused   that other path always (so that a run with causal_conv1d times both)
Inputs as the layer makes them: zxbcdt [b, L, 2 H P + 2 G N + H] bf16 (dt below softplus's knee),
conv weight [H P + 2 G N, 4] and bias, dt_bias, A, D per head, RMSNormGated weight, out-projection
[d_model, H P] (d_model = H P / 2), bf16 parameters; seq_idx on the packed row. Each step timed by
triton.testing.do_bench (median, L2 cleared before each run), eager (no graph: the steps are
milliseconds). Correctness in the same run: ours and the peer's out and input gradient relative to
each other.

    python3 bench/bench_layer.py [--out DIR] [--rows "2.7B,1.3B"]   # on the GPU machine
    python3 bench/bench_layer.py --kernels [--rows ...]              # the convolution and norm alone
    python3 bench/bench_layer.py --dry-run                           # the rows and sizes; no CUDA
"""

import argparse
import datetime
import json
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# name: (b, L, H, P, N, G, packed sequence lengths or None)
ROWS = {
    "370M": (8, 2048, 32, 64, 128, 1, None),
    "1.3B": (8, 2048, 64, 64, 128, 1, None),
    "2.7B": (8, 2048, 80, 64, 128, 1, None),
    "2.7B packed": (1, 16384, 80, 64, 128, 1, [3000, 5000, 1, 4000, 4383]),
}
IMPLS = ["ours", "ours torch ops", "ours library ops", "ours conv", "ours scan", "mamba_ssm", "mamba_ssm unfused"]
# The layer's switches (python/mamba2ssd/layer.py) each "ours ..." row sets: the library's convolution
# and norm kernels off (PyTorch's operations, the old path) or on; "ours" keeps the defaults.
SWITCHES = {"ours torch ops": "never", "ours library ops": "cuda"}
WIDTH, CHUNK = 4, 256


def row_sizes(name):
    b, L, H, P, N, G, seqlens = ROWS[name]
    dim = H * P
    return dict(b=b, L=L, H=H, P=P, N=N, G=G, seqlens=seqlens, dim=dim, d_model=dim // 2,
                features=2 * dim + 2 * G * N + H, channels=dim + 2 * G * N)


def dry_run(rows):
    print("| row | b, L, H, P, N, G | zxbcdt MB (bf16) | packed |")
    print("|---|---|---|---|")
    for name in rows:
        s = row_sizes(name)
        mb = s["b"] * s["L"] * s["features"] * 2 / 1e6
        print(f"| {name} | {s['b']}, {s['L']}, {s['H']}, {s['P']}, {s['N']}, {s['G']} | {mb:.1f} | "
              f"{len(s['seqlens']) if s['seqlens'] else '-'} |")


def make_inputs(name, seed=0):
    import torch
    s = row_sizes(name)
    g = torch.Generator(device="cuda").manual_seed(seed)

    def randn(*shape, scale=1.0, dtype=torch.bfloat16):
        return (torch.randn(*shape, generator=g, device="cuda") * scale).to(dtype)

    zxbcdt = randn(s["b"], s["L"], s["features"], dtype=torch.float32)
    zxbcdt[..., -s["H"]:] = zxbcdt[..., -s["H"]:] * 0.5 - 3.0
    kw = dict(zxbcdt=zxbcdt.to(torch.bfloat16), conv1d_weight=randn(s["channels"], WIDTH, scale=0.5),
              conv1d_bias=randn(s["channels"], scale=0.1), dt_bias=randn(s["H"], scale=0.5, dtype=torch.float32),
              A=-(0.5 + 3.5 * torch.rand(s["H"], generator=g, device="cuda")), D=randn(s["H"], dtype=torch.float32),
              rmsnorm_weight=1 + randn(s["dim"], scale=0.1), outproj_weight=randn(s["d_model"], s["dim"],
                                                                                  scale=s["dim"] ** -0.5))
    if s["seqlens"]:
        ids = torch.repeat_interleave(torch.arange(len(s["seqlens"]), dtype=torch.int32),
                                      torch.tensor(s["seqlens"]))
        kw["seq_idx"] = ids[None].to("cuda")
    return s, kw


def split_call(fn, s, kw, leaves):
    a = dict(kw, **leaves)
    return fn(a["zxbcdt"], a["conv1d_weight"], a["conv1d_bias"], a["dt_bias"], a["A"], a["D"], CHUNK,
              seq_idx=kw.get("seq_idx"), rmsnorm_weight=a["rmsnorm_weight"], outproj_weight=a["outproj_weight"],
              headdim=s["P"], ngroups=s["G"], norm_before_gate=False)


def unfused_peer(s, peer_scan, rmsnorm_fn):
    """mamba_ssm's Mamba2 path without causal_conv1d: conv (PyTorch), scan, RMSNormGated, out_proj."""
    import torch
    import torch.nn.functional as F
    from mamba2ssd.layer import _conv  # PyTorch's operations, whatever the layer's switches

    def fn(zxbcdt, conv1d_weight, conv1d_bias, dt_bias, A, D, chunk, seq_idx=None, rmsnorm_weight=None,
           outproj_weight=None, headdim=None, ngroups=1, norm_before_gate=False):
        dim, GN, H = s["dim"], s["G"] * s["N"], s["H"]
        z, xBC, dt = zxbcdt.split([dim, dim + 2 * GN, H], dim=-1)
        f32 = torch.float32
        xBC = F.silu(_conv(xBC.to(f32), conv1d_weight.to(f32), conv1d_bias, seq_idx)).to(xBC.dtype)
        x, B, C = xBC.split([dim, GN, GN], dim=-1)
        y = peer_scan(x.unflatten(-1, (H, headdim)), dt, A, B.unflatten(-1, (ngroups, s["N"])),
                      C.unflatten(-1, (ngroups, s["N"])), chunk, D=D, dt_bias=dt_bias, dt_softplus=True,
                      seq_idx=seq_idx)
        y = rmsnorm_fn(y.flatten(-2), rmsnorm_weight, None, z=z, eps=1e-6, group_size=dim // ngroups,
                       norm_before_gate=norm_before_gate)
        return F.linear(y, outproj_weight)
    return fn


def peer_impl(s, peers, fused=True):
    """mamba_ssm's fused call if asked and causal_conv1d imports, else its unfused path; (fn, label)."""
    if os.path.isdir(os.path.join(peers, "mamba_ssm")) and peers not in sys.path:
        sys.path.insert(0, peers)
        sys.path.append(os.path.join(peers, "_deps"))
    os.environ.setdefault("MAMBA_DETERMINISTIC", "1")
    from mamba_ssm.ops.triton import ssd_combined
    if fused and ssd_combined.causal_conv1d_fwd_function is not None:
        return ssd_combined.mamba_split_conv1d_scan_combined, "mamba_ssm"
    from mamba_ssm.ops.triton.layernorm_gated import rmsnorm_fn
    return unfused_peer(s, ssd_combined.mamba_chunk_scan_combined, rmsnorm_fn), "mamba_ssm unfused"


def short(e):
    t = f"{type(e).__name__}: {e}".splitlines()[0]
    return t if len(t) < 120 else t[:117] + "..."


def run_row(name, impls, peers, rep_ms):
    import torch
    import triton.testing
    import mamba2ssd
    from mamba2ssd.layer import causal_conv1d
    s, kw = make_inputs(name)
    grads_of = ["zxbcdt", "conv1d_weight", "conv1d_bias", "dt_bias", "A", "D", "rmsnorm_weight", "outproj_weight"]
    leaves = {k: kw[k].detach().clone().requires_grad_() for k in grads_of}
    dout = torch.randn(s["b"], s["L"], s["d_model"], device="cuda").to(torch.bfloat16)
    dim, GN, H = s["dim"], s["G"] * s["N"], s["H"]
    z, xBC, dt = kw["zxbcdt"].split([dim, dim + 2 * GN, H], dim=-1)
    steps, outputs, label = {}, {}, {}

    def layer_step(fn, who):
        from mamba2ssd import layer

        def step():
            saved = layer._LIBRARY_CONV, layer._LIBRARY_NORM
            if who in SWITCHES:
                layer._LIBRARY_CONV = layer._LIBRARY_NORM = SWITCHES[who]
            try:
                for t in leaves.values():
                    t.grad = None
                out = split_call(fn, s, kw, leaves)
                out.backward(dout)
            finally:
                layer._LIBRARY_CONV, layer._LIBRARY_NORM = saved
            return out
        steps[who] = step

    for impl in impls:
        label[impl] = impl
        try:
            if impl == "ours" or impl in SWITCHES:
                layer_step(mamba2ssd.mamba_split_conv1d_scan_combined, impl)
            elif impl in ("mamba_ssm", "mamba_ssm unfused"):
                fn, label[impl] = peer_impl(s, peers, fused=impl == "mamba_ssm")
                if impl != "mamba_ssm" and label.get("mamba_ssm") == label[impl]:
                    raise RuntimeError("the peer column is this path (causal_conv1d does not import)")
                layer_step(fn, impl)
            elif impl == "ours conv":
                xl, wl = xBC.detach().clone().requires_grad_(), leaves["conv1d_weight"]
                d_conv = torch.randn(xl.shape, device="cuda").to(xl.dtype)
                steps[impl] = lambda: causal_conv1d(xl, wl, leaves["conv1d_bias"], kw.get("seq_idx"),
                                                    "silu").backward(d_conv)
            elif impl == "ours scan":
                x, B, C = xBC.detach().split([dim, GN, GN], dim=-1)
                scan_in = dict(x=x.unflatten(-1, (H, s["P"])), B=B.unflatten(-1, (s["G"], s["N"])),
                               C=C.unflatten(-1, (s["G"], s["N"])))
                scan_in = {k: v.clone().requires_grad_() for k, v in scan_in.items()}
                d_y = torch.randn(s["b"], s["L"], H, s["P"], device="cuda").to(torch.bfloat16)
                steps[impl] = lambda: mamba2ssd.mamba_chunk_scan_combined(
                    scan_in["x"], dt, kw["A"], scan_in["B"], scan_in["C"], CHUNK, D=kw["D"], dt_bias=kw["dt_bias"],
                    dt_softplus=True, seq_idx=kw.get("seq_idx")).backward(d_y)
        except Exception as e:  # noqa: BLE001 (the row says why)
            steps[impl] = e
    result = {}
    for impl, step in steps.items():
        if isinstance(step, Exception):
            result[impl] = dict(label=label[impl], error=short(step))
            continue
        try:
            out = step()
            torch.cuda.synchronize()
            if impl in ("ours", "mamba_ssm"):
                outputs[impl] = (out.detach().float(), leaves["zxbcdt"].grad.detach().float().clone())
            us = triton.testing.do_bench(step, rep=rep_ms) * 1e3
            result[impl] = dict(label=label[impl], us=us)
        except Exception as e:  # noqa: BLE001
            result[impl] = dict(label=label[impl], error=short(e))
    if "ours" in outputs and "mamba_ssm" in outputs:
        (o1, g1), (o2, g2) = outputs["ours"], outputs["mamba_ssm"]
        result["vs_peer"] = dict(out=((o1 - o2).norm() / o2.norm()).item(),
                                 dzxbcdt=((g1 - g2).norm() / g2.norm()).item())
    return s, result


def kernels_row(name, rep_ms):
    """The layer's convolution and gated norm alone at a row, forward and backward timed apart (the
    tensors as the layer passes them: xBC and z strided slices of zxbcdt, dz into a dzxbcdt slice):
    ours (torch.ops.mamba2ssd) and, where causal_conv1d imports, its channel-last kernels on the same
    tensors, their outputs compared; a rerun of each of our backwards must give the same bits."""
    import torch
    import triton.testing
    import mamba2ssd  # noqa: F401 (registers the ops)
    try:
        import causal_conv1d_cuda
    except ImportError:
        causal_conv1d_cuda = None
    s, kw = make_inputs(name)
    dim, GN, H = s["dim"], s["G"] * s["N"], s["H"]
    z, xBC, _ = kw["zxbcdt"].split([dim, dim + 2 * GN, H], dim=-1)
    w, bias, ops = kw["conv1d_weight"], kw["conv1d_bias"], torch.ops.mamba2ssd
    g = torch.Generator(device="cuda").manual_seed(1)
    dout = torch.randn(xBC.shape, generator=g, device="cuda").to(xBC.dtype)
    y = torch.randn(s["b"] * s["L"], dim, generator=g, device="cuda").to(torch.bfloat16)  # the scan's output
    dnorm = torch.randn(y.shape, generator=g, device="cuda").to(torch.bfloat16)
    zr, nw = z.reshape(-1, dim), kw["rmsnorm_weight"].float()
    dz = torch.empty_like(kw["zxbcdt"])[..., :dim].reshape(-1, dim)
    group = dim // s["G"]
    fns = {
        "ours conv fwd": lambda: ops.causal_conv1d_fwd(xBC, w, bias, kw.get("seq_idx"), True),
        "ours conv bwd": lambda: ops.causal_conv1d_bwd(xBC, w, bias, kw.get("seq_idx"), dout, True, True),
        "ours norm fwd": lambda: ops.gated_rmsnorm_fwd(y, zr, nw, group, 1e-5, False),
        "ours norm bwd": lambda: ops.gated_rmsnorm_bwd(y, zr, nw, dnorm, group, 1e-5, False, dz_out=dz),
    }

    def results(k):  # a backward's outputs, copied (the norm's dz lands in the dzxbcdt slice)
        got = [t for t in fns[k]() if t.numel()] + ([dz] if "norm" in k else [])
        return [t.float().clone() for t in got]

    out = {}
    for k in ("ours conv bwd", "ours norm bwd"):
        first, again = results(k), results(k)
        out[k + " rerun"] = "same bits" if all(torch.equal(u, v) for u, v in zip(first, again)) else "DIFFERS"
    if causal_conv1d_cuda is not None and "seq_idx" not in kw:  # (its seq_idx form wants channel-last ids)
        xt, dout_t = xBC.transpose(1, 2), dout.transpose(1, 2)
        out_t = torch.empty(xBC.shape, device="cuda", dtype=xBC.dtype).transpose(1, 2)
        dx_t = torch.empty(xBC.shape, device="cuda", dtype=xBC.dtype).transpose(1, 2)
        dw, db = torch.zeros_like(w, dtype=torch.float32), torch.zeros_like(bias, dtype=torch.float32)
        fns["causal_conv1d fwd"] = lambda: causal_conv1d_cuda.causal_conv1d_fwd(xt, w, bias, None, None, out_t, None,
                                                                                True)
        fns["causal_conv1d bwd"] = lambda: causal_conv1d_cuda.causal_conv1d_bwd(
            xt, w, bias, dout_t, None, None, None, dx_t, dw.zero_(), db.zero_(), None, True)
        ours_out, (ours_dx, _, _) = fns["ours conv fwd"](), fns["ours conv bwd"]()
        fns["causal_conv1d fwd"]()
        fns["causal_conv1d bwd"]()
        rel = lambda a, b: ((a.float() - b.float()).norm() / b.float().norm()).item()
        out["out, dx vs causal_conv1d"] = (f"{rel(ours_out, out_t.transpose(1, 2)):.1e}, "
                                           f"{rel(ours_dx, dx_t.transpose(1, 2)):.1e}")
    for k, f in fns.items():
        out[k] = triton.testing.do_bench(f, rep=rep_ms) * 1e3
    return s, out


KERNEL_COLUMNS = ["ours conv fwd", "ours conv bwd", "causal_conv1d fwd", "causal_conv1d bwd", "ours norm fwd",
                  "ours norm bwd", "ours conv bwd rerun", "ours norm bwd rerun", "out, dx vs causal_conv1d"]


def kernels_markdown(rows_out):
    heads = [c + " us" if c.endswith(("fwd", "bwd")) else c for c in KERNEL_COLUMNS]
    lines = ["| row | channels, norm group | " + " | ".join(heads) + " |",
             "|" + "---|" * (len(KERNEL_COLUMNS) + 2)]
    for name, (s, r) in rows_out.items():
        cells = [f"{r[c]:.1f}" if isinstance(r.get(c), float) else r.get(c, "-") for c in KERNEL_COLUMNS]
        lines.append(f"| {name} | {s['channels']}, {s['dim'] // s['G']} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def agreement(vs):
    return f"{vs['out']:.1e}, {vs['dzxbcdt']:.1e}" if vs else "-"


def markdown(rows_out):
    lines = ["| row | b, L, H, P, N, G | ours us | ours torch ops us | ours library ops us | ours conv us | "
             "ours scan us | peer | peer us | speedup | mamba_ssm unfused us | speedup vs unfused | conv share | "
             "out, dzxbcdt vs peer |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for name, (s, r) in rows_out.items():
        def cell(impl):
            v = r.get(impl, {})
            return f"{v['us']:.1f}" if "us" in v else f"({v.get('error', 'not run')})"
        ours, peer = r.get("ours", {}).get("us"), r.get("mamba_ssm", {}).get("us")
        unfused = r.get("mamba_ssm unfused", {}).get("us")
        conv = r.get("ours conv", {}).get("us")
        vs = r.get("vs_peer")
        lines.append(f"| {name} | {s['b']}, {s['L']}, {s['H']}, {s['P']}, {s['N']}, {s['G']} | {cell('ours')} | "
                     f"{cell('ours torch ops')} | {cell('ours library ops')} | {cell('ours conv')} | "
                     f"{cell('ours scan')} | {r.get('mamba_ssm', {}).get('label', '-')} | "
                     f"{cell('mamba_ssm')} | {f'{peer / ours:.2f}x' if ours and peer else '-'} | "
                     f"{cell('mamba_ssm unfused')} | {f'{unfused / ours:.2f}x' if ours and unfused else '-'} | "
                     f"{f'{conv / ours:.2f}' if ours and conv else '-'} | "
                     f"{agreement(vs)} |")
    return "\n".join(lines)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=os.environ.get("OUT") or os.path.join(ROOT, "bench", "out"))
    ap.add_argument("--rows", default=",".join(ROWS), help="comma list among " + ",".join(ROWS))
    ap.add_argument("--impls", default=",".join(IMPLS), help="comma list among " + ",".join(IMPLS))
    ap.add_argument("--peers", default=os.path.join(ROOT, ".peers"), help="the peers' folder (get_peers.sh)")
    ap.add_argument("--rep-ms", type=int, default=200, help="do_bench time per measurement, ms (200)")
    ap.add_argument("--dry-run", action="store_true", help="print the rows and sizes; no CUDA")
    ap.add_argument("--kernels", action="store_true",
                    help="the convolution's and the norm's kernels alone instead of the layer step")
    args = ap.parse_args()
    rows = [r.strip() for r in args.rows.split(",") if r.strip()]
    impls = [i.strip() for i in args.impls.split(",") if i.strip()]
    for r in rows:
        if r not in ROWS:
            ap.error(f"--rows: unknown row {r!r}; the rows are {', '.join(ROWS)}")
    for i in impls:
        if i not in IMPLS:
            ap.error(f"--impls: unknown implementation {i!r}; they are {', '.join(IMPLS)}")
    if args.dry_run:
        dry_run(rows)
        return
    import torch
    header = (f"Mamba-2 layer step, {datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC; "
              f"{torch.cuda.get_device_name()}; torch {torch.__version__}; bf16, W {WIDTH}, chunk {CHUNK}")
    print(header)
    if args.kernels:
        table = kernels_markdown({name: kernels_row(name, args.rep_ms) for name in rows})
        print(table)
        return
    rows_out = {name: run_row(name, impls, args.peers, args.rep_ms) for name in rows}
    table = markdown(rows_out)
    print(table)
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "bench_layer.json"), "w") as f:
        json.dump(dict(header=header, rows={n: dict(sizes=s, result=r) for n, (s, r) in rows_out.items()}), f,
                  indent=1, default=str)


if __name__ == "__main__":
    main()
