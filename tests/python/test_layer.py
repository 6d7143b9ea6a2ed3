"""mamba2ssd.mamba_split_conv1d_scan_combined (python/mamba2ssd/layer.py), the Mamba-2 layer's training
call: its forward against a reference written here from mamba_ssm's definition (the convolution as a
loop over taps, the scan as oracle.py's recurrence, the norm, gate and projection as formulas),
torch.autograd.gradcheck of the whole function in float64 on the CPU (the scan's float64 path is the
oracle, forward and backward), its gradients against autograd through the reference, and its errors."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import mamba2ssd
from mamba2ssd.layer import causal_conv1d
from oracle import ssd_oracle
from problems import DEVICES, HAS_GPU, rel_l2

split_scan = mamba2ssd.mamba_split_conv1d_scan_combined


def reference_conv(x, weight, bias, seq_idx, activation):
    """out[t] = bias + sum_k weight[:, k] x[t - (W - 1) + k], a tap on another sequence (or before 0) read as 0."""
    b, L, D = x.shape
    W = weight.shape[1]
    out = torch.zeros(b, L, D, dtype=x.dtype) + (bias if bias is not None else 0)
    for t in range(L):
        for k in range(W):
            s = t - (W - 1) + k
            if s < 0:
                continue
            tap = x[:, s] * weight[:, k]
            if seq_idx is not None:
                tap = tap * (seq_idx[:, s] == seq_idx[:, t]).to(x.dtype)[:, None]
            out[:, t] = out[:, t] + tap
    return F.silu(out) if activation in ("silu", "swish") else out


def reference(args, o):
    """The layer in float64 on the CPU, from the definition (differentiable through args)."""
    f = {k: (v.to(torch.float64) if isinstance(v, torch.Tensor) and v.is_floating_point() else v)
         for k, v in args.items()}
    H, P, G, N, dn = o["H"], o["P"], o["G"], o["N"], o["dn"]
    dim = H * P
    zx0, z, xBC, dt = torch.split(f["zxbcdt"], [2 * dn, dim, dim + 2 * G * N, H], dim=-1)
    xBC = reference_conv(xBC, f["conv1d_weight"], f.get("conv1d_bias"), f.get("seq_idx"), o["activation"])
    x, B, C = torch.split(xBC, [dim, G * N, G * N], dim=-1)
    b, L = x.shape[:2]
    gated = f.get("rmsnorm_weight") is not None
    y, final_states, _ = ssd_oracle(x.reshape(b, L, H, P), dt, f["A"], B.reshape(b, L, G, N), C.reshape(b, L, G, N),
                                    D=f["D"], z=None if gated else z.reshape(b, L, H, P), dt_bias=f["dt_bias"],
                                    initial_states=f.get("initial_states"), seq_idx=f.get("seq_idx"),
                                    dt_softplus=True, dt_limit=o["dt_limit"], differentiable=True)
    y = y.reshape(b, L, dim)
    if gated:
        if not o["norm_before_gate"]:
            y = y * F.silu(z)
        groups = y.reshape(b, L, G, dim // G)
        y = (groups / torch.sqrt(groups.square().mean(-1, keepdim=True) + o["eps"])).reshape(b, L, dim)
        y = y * f["rmsnorm_weight"]
        if o["norm_before_gate"]:
            y = y * F.silu(z)
    if dn > 0:
        a, g = zx0.chunk(2, dim=-1)
        y = torch.cat([F.silu(a) * g, y], dim=-1)
    if f.get("outproj_weight") is not None:
        y = y @ f["outproj_weight"].T + (f["outproj_bias"] if f.get("outproj_bias") is not None else 0)
    return y, final_states


def make_layer(b=2, L=40, H=4, P=32, G=2, N=16, W=4, dn=0, gated=True, norm_before_gate=True, D_dim=False,
               seqlens=None, initial_states=False, outproj=True, outproj_bias=True, conv_bias=True,
               dt_limit=(0.0, float("inf")), activation="silu", dtype=torch.float32, device="cpu", seed=0):
    """Arguments of mamba_split_conv1d_scan_combined (args: tensors; o: the rest and the sizes)."""
    g = torch.Generator().manual_seed(seed)

    def randn(*shape, scale=1.0):
        return (torch.randn(*shape, generator=g) * scale)

    dim = H * P
    channels = dim + 2 * G * N
    zxbcdt = randn(b, L, 2 * dn + 2 * dim + 2 * G * N + H)
    zxbcdt[..., -H:] = zxbcdt[..., -H:] * 0.5 - 3.0  # dt below softplus's knee, Mamba's range
    args = dict(zxbcdt=zxbcdt.to(dtype), conv1d_weight=randn(channels, W, scale=0.5),
                conv1d_bias=randn(channels, scale=0.1) if conv_bias else None, dt_bias=randn(H, scale=0.5),
                A=-(0.05 + 1.95 * torch.rand(H, generator=g)), D=randn(H, P) if D_dim else randn(H))
    if initial_states:
        args["initial_states"] = randn(b, H, P, N)
    if seqlens is not None:
        ids = torch.repeat_interleave(torch.arange(len(seqlens), dtype=torch.int32), torch.tensor(seqlens))
        args["seq_idx"] = ids.expand(b, L).contiguous()
    if gated:
        args["rmsnorm_weight"] = 1.0 + randn(dim, scale=0.1)
    if outproj:
        args["outproj_weight"] = randn(24, dn + dim, scale=(dn + dim) ** -0.5)
        if outproj_bias:
            args["outproj_bias"] = randn(24, scale=0.1)
    args = {k: v.to(device) for k, v in args.items() if v is not None}
    o = dict(H=H, P=P, G=G, N=N, dn=dn, activation=activation, dt_limit=dt_limit, eps=1e-6,
             norm_before_gate=norm_before_gate)
    return args, o


def call(args, o, **kw):
    return split_scan(args["zxbcdt"], args["conv1d_weight"], args.get("conv1d_bias"), args["dt_bias"], args["A"],
                      args["D"], 16, initial_states=args.get("initial_states"), seq_idx=args.get("seq_idx"),
                      dt_limit=o["dt_limit"], activation=o["activation"], rmsnorm_weight=args.get("rmsnorm_weight"),
                      rmsnorm_eps=o["eps"], outproj_weight=args.get("outproj_weight"),
                      outproj_bias=args.get("outproj_bias"), headdim=o["P"], ngroups=o["G"],
                      norm_before_gate=o["norm_before_gate"], **kw)


CASES = {
    "plain": dict(gated=False, outproj=False),
    "mamba2_layer": dict(),
    "gate_before_norm": dict(norm_before_gate=False, D_dim=True),
    "mlp_part": dict(dn=8, outproj_bias=False),
    "packed": dict(seqlens=[13, 1, 26], initial_states=True, conv_bias=False),
    "dt_limit_no_activation": dict(dt_limit=(0.01, 0.05), activation=None, G=1),
    "width2_one_group": dict(W=2, G=1, N=32, P=64, H=2),
}


@pytest.mark.parametrize("case", list(CASES))
def test_forward_matches_the_definition(case):
    args, o = make_layer(**CASES[case])
    out, final_states = call(args, o, return_final_states=True)
    want, want_final = reference(args, o)
    assert out.dtype == torch.float32 and torch.isfinite(out).all()
    assert rel_l2(out, want) <= mamba2ssd.tolerance(torch.float32)
    assert rel_l2(final_states, want_final) <= mamba2ssd.tolerance(torch.float32)


@pytest.mark.parametrize("case", ["mamba2_layer", "gate_before_norm", "mlp_part", "packed", "plain",
                                  "dt_limit_no_activation"])
def test_gradcheck_float64(case):
    args, o = make_layer(**{**dict(b=1, L=12, H=2, P=32, G=1, N=16, seed=1), **CASES[case], "seqlens": None})
    if case == "packed":
        args["seq_idx"] = torch.tensor([[0] * 5 + [1] * 7], dtype=torch.int32)
    args = {k: (v.double().requires_grad_() if v.is_floating_point() else v) for k, v in args.items()}
    names = [k for k, v in args.items() if v.requires_grad]

    def fn(*leaves):
        out, final_states = call(dict(args, **dict(zip(names, leaves))), o, return_final_states=True)
        return out, final_states

    assert torch.autograd.gradcheck(fn, [args[n] for n in names], eps=1e-6, atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize("case", ["mamba2_layer", "mlp_part", "packed", "width2_one_group", "gate_before_norm"])
def test_gradients_match_the_definition(case):
    args, o = make_layer(**CASES[case])
    leaves = {k: v.detach().clone().requires_grad_() for k, v in args.items() if v.is_floating_point()}
    out, final_states = call(dict(args, **leaves), o, return_final_states=True)
    g = torch.Generator().manual_seed(5)
    d_out, d_final = torch.randn(out.shape, generator=g), torch.randn(final_states.shape, generator=g)
    got = torch.autograd.grad((out * d_out).sum() + (final_states * d_final).sum(), list(leaves.values()))
    ref_leaves = {k: v.detach().double().requires_grad_() for k, v in leaves.items()}
    want_out, want_final = reference(dict(args, **ref_leaves), o)
    want = torch.autograd.grad((want_out * d_out.double()).sum() + (want_final * d_final.double()).sum(),
                               list(ref_leaves.values()))
    for name, a, w in zip(leaves, got, want):
        assert a.dtype == leaves[name].dtype and torch.isfinite(a).all(), name
        assert rel_l2(a, w) <= 2 * mamba2ssd.backward_tolerance(torch.float32, sum=True), name


def test_only_the_final_state_reaches_the_loss():
    args, o = make_layer(initial_states=True)
    leaves = {k: v.detach().clone().requires_grad_() for k, v in args.items() if v.is_floating_point()}
    _, final_states = call(dict(args, **leaves), o, return_final_states=True)
    final_states.sum().backward()
    assert leaves["initial_states"].grad.abs().sum() > 0
    assert leaves["outproj_weight"].grad.abs().sum() == 0  # the projection does not reach the state


def test_autocast_runs_the_projection_in_its_dtype():
    """As mamba_ssm: under autocast the out-projection runs in autocast's dtype, the rest in the inputs'
    (the backward computes the convolution again, outside autocast); the gradients come back in the
    parameters' dtypes."""
    args, o = make_layer(initial_states=True)
    leaves = {k: v.detach().clone().requires_grad_() for k, v in args.items() if v.is_floating_point()}
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = call(dict(args, **leaves), o)
    assert out.dtype == torch.bfloat16
    want, _ = reference(args, o)
    assert rel_l2(out, want) <= mamba2ssd.tolerance(torch.bfloat16)
    out.float().square().sum().backward()
    for name, t in leaves.items():
        assert t.grad is not None and t.grad.dtype == t.dtype and torch.isfinite(t.grad).all(), name


def test_torch_compile_fullgraph():
    """torch.compile(fullgraph=True) takes the whole function, forward and backward (every gradient by
    its formula, none by autograd inside the backward), with eager's results."""
    _expect_compiled_as_eager(*make_layer(dn=8, seqlens=[13, 1, 26]))


def _expect_compiled_as_eager(args, o):
    """The layer call's out and every gradient, torch.compile(fullgraph=True) against eager."""
    def step(fn):
        leaves = {k: v.detach().clone().requires_grad_() for k, v in args.items() if v.is_floating_point()}
        out = fn(dict(args, **leaves))
        out.square().sum().backward()
        return [out] + [t.grad for t in leaves.values()]

    eager = step(lambda a: call(a, o))
    compiled = step(torch.compile(lambda a: call(a, o), fullgraph=True))
    for e, c in zip(eager, compiled):  # Inductor's fused sums round in another order (up to 8e-7 seen)
        assert rel_l2(c, e.double()) <= 1e-5


# --- the library's convolution (torch.ops.mamba2ssd.causal_conv1d_fwd / _bwd): CUDA tensors take it;
# on the CPU the ops run the library's fp64 oracle, so these tests check the binding and the wiring ---

def _conv_case(dtype, W, seq, bias, seed=4):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(2, 23, 7, generator=g).to(dtype)
    w, b = torch.randn(7, W, generator=g) * 0.5, torch.randn(7, generator=g) * 0.1 if bias else None
    seq_idx = torch.repeat_interleave(torch.arange(4, dtype=torch.int32), torch.tensor([5, 1, 9, 8])).expand(2, 23)
    return x, w, b, seq_idx.contiguous() if seq else None


@pytest.mark.parametrize("W", [2, 3, 4])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_library_conv_ops_match_the_loop(dtype, W):
    """Forward against the loop, backward against autograd through it; strided x (a slice of wider
    rows, as xBC of zxbcdt), int32 and int64 seq_idx. The bars are tolerance.h's (the decode step's)."""
    tol = mamba2ssd.decode_tolerance(dtype, dtype)
    for seq in (False, True):
        for bias in (False, True):
            for silu in (False, True):
                x, w, b, seq_idx = _conv_case(dtype, W, seq, bias)
                xs = torch.cat([x, torch.zeros(2, 23, 3, dtype=dtype)], -1)[..., :7]
                act = "silu" if silu else None
                out = torch.ops.mamba2ssd.causal_conv1d_fwd(xs, w, b, seq_idx.long() if seq else None, silu)
                leaves = [t.double().requires_grad_() for t in (x, w) + ((b,) if bias else ())]
                want = reference_conv(leaves[0], leaves[1], leaves[2] if bias else None, seq_idx, act)
                assert out.dtype == dtype and rel_l2(out, want) <= tol
                d_out = torch.randn(want.shape, generator=torch.Generator().manual_seed(W)).to(dtype)
                want_grads = torch.autograd.grad(want, leaves, d_out.double())
                dx, dw, db = torch.ops.mamba2ssd.causal_conv1d_bwd(xs, w, b, seq_idx, d_out, silu, bias)
                assert dx.dtype == dtype and dw.dtype == torch.float32 and db.shape == ((7,) if bias else (0,))
                assert rel_l2(dx, want_grads[0]) <= tol
                for got, ref in zip([dw] + ([db] if bias else []), want_grads[1:]):
                    assert rel_l2(got, ref) <= 1e-5


@pytest.mark.parametrize("case", ["mamba2_layer", "packed", "dt_limit_no_activation", "gate_before_norm"])
def test_layer_on_the_library_ops(case, monkeypatch):
    """The layer call with its convolution and norm on the library's ops (as CUDA tensors take them),
    against PyTorch's path: forward and every gradient, float32 on the CPU."""
    from mamba2ssd import layer
    args, o = make_layer(**CASES[case])
    results = {}
    for where in ("never", "always"):
        monkeypatch.setattr(layer, "_LIBRARY_CONV", where)
        monkeypatch.setattr(layer, "_LIBRARY_NORM", where)
        leaves = {k: v.detach().clone().requires_grad_() for k, v in args.items() if v.is_floating_point()}
        out = call(dict(args, **leaves), o)
        d_out = torch.randn(out.shape, generator=torch.Generator().manual_seed(2))
        results[where] = [out] + list(torch.autograd.grad(out, list(leaves.values()), d_out))
    for name, a, b in zip(["out"] + [k for k, v in args.items() if v.is_floating_point()], results["always"],
                          results["never"]):
        assert rel_l2(a, b.double()) <= 1e-5, name


def test_library_conv_under_torch_compile(monkeypatch):
    """The ops' fake kernels: torch.compile(fullgraph=True) of causal_conv1d on them, forward and backward."""
    from mamba2ssd import layer
    monkeypatch.setattr(layer, "_LIBRARY_CONV", "always")
    x, w, b, seq_idx = _conv_case(torch.float32, 4, True, True)

    def step(fn):
        leaves = [t.clone().requires_grad_() for t in (x, w, b)]
        out = fn(*leaves)
        out.square().sum().backward()
        return [out] + [t.grad for t in leaves]

    conv = lambda x_, w_, b_: causal_conv1d(x_, w_, b_, seq_idx, "silu")  # noqa: E731
    for e, c in zip(step(conv), step(torch.compile(conv, fullgraph=True))):
        assert torch.equal(e, c)


def test_layer_on_the_library_ops_under_torch_compile(monkeypatch):
    """The ops' fake kernels (convolution and norm) inside the layer call: torch.compile(fullgraph=True)
    of it, forward and backward, against eager."""
    from mamba2ssd import layer
    monkeypatch.setattr(layer, "_LIBRARY_CONV", "always")
    monkeypatch.setattr(layer, "_LIBRARY_NORM", "always")
    _expect_compiled_as_eager(*make_layer())


def reference_norm(y, z, w, group_size, norm_before_gate, eps=1e-6):
    """RMSNormGated from its formula, in y's dtype (float64 here)."""
    v = y * F.silu(z) if z is not None and not norm_before_gate else y
    groups = v.unflatten(-1, (-1, group_size))
    n = (groups / torch.sqrt(groups.square().mean(-1, keepdim=True) + eps)).flatten(-2) * w
    return n * F.silu(z) if z is not None and norm_before_gate else n


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_library_norm_ops_match_the_formula(dtype):
    """Forward against the formula, backward against autograd through it (and its copy of the forward's
    output against the formula): no gate and both gate orders, one and three groups, z a slice of
    wider rows (as of zxbcdt). Bars as the convolution's."""
    tol = mamba2ssd.decode_tolerance(dtype, dtype)
    g = torch.Generator().manual_seed(6)
    y = torch.randn(2, 5, 48, generator=g).to(dtype)
    z = torch.randn(2, 5, 60, generator=g).to(dtype)[..., 4:52]
    w = 1 + 0.2 * torch.randn(48, generator=g)
    d_out = torch.randn(2, 5, 48, generator=g).to(dtype)
    for groups in (1, 3):
        for gate in (None, True, False):
            zz = z if gate is not None else None
            out = torch.ops.mamba2ssd.gated_rmsnorm_fwd(y, zz, w, 48 // groups, 1e-6, gate is not False)
            leaves = [t.double().requires_grad_() for t in (y, w) + ((z,) if gate is not None else ())]
            want = reference_norm(leaves[0], leaves[2] if gate is not None else None, leaves[1], 48 // groups,
                                  gate is not False)
            assert out.dtype == dtype and rel_l2(out, want) <= tol, (groups, gate)
            wants = torch.autograd.grad(want, leaves, d_out.double())
            out2, dy, dz, dw = torch.ops.mamba2ssd.gated_rmsnorm_bwd(y, zz, w, d_out, 48 // groups, 1e-6,
                                                                     gate is not False)
            assert out2.dtype == dtype and rel_l2(out2, want) <= tol, (groups, gate)  # the forward's out again
            assert rel_l2(dy, wants[0]) <= tol and rel_l2(dw, wants[1]) <= 1e-5, (groups, gate)
            if gate is None:
                assert dz.shape == (0,)
            else:
                assert rel_l2(dz, wants[2]) <= tol, (groups, gate)


def _poisoned_columns(shape, dtype, device, left, right):
    """A NaN buffer [*shape[:-1], left + shape[-1] + right] and its middle columns (the view an op writes)."""
    wide = torch.full(shape[:-1] + (left + shape[-1] + right,), float("nan"), dtype=dtype, device=device)
    return wide, wide[..., left:left + shape[-1]]


@pytest.mark.parametrize("device", DEVICES)
def test_library_ops_write_into_given_buffers(device):
    """causal_conv1d_bwd's dx_out and gated_rmsnorm_bwd's dz_out (the layer passes slices of zxbcdt's
    gradient): the same bits as the returned gradient, written into the slice only (the columns
    around it keep their NaN), and the output comes back empty."""
    x, w, b, seq_idx = (t.to(device) if t is not None else None for t in _conv_case(torch.bfloat16, 4, True, True))
    d_out = torch.randn(x.shape, generator=torch.Generator().manual_seed(3)).to(x.dtype).to(device)
    dx, dw, db = torch.ops.mamba2ssd.causal_conv1d_bwd(x, w, b, seq_idx, d_out, True, True)
    wide, view = _poisoned_columns(x.shape, x.dtype, device, 5, 3)
    empty, dw2, db2 = torch.ops.mamba2ssd.causal_conv1d_bwd(x, w, b, seq_idx, d_out, True, True, dx_out=view)
    assert empty.shape == (0,) and torch.equal(view, dx) and torch.equal(dw2, dw) and torch.equal(db2, db)
    assert wide[..., :5].isnan().all() and wide[..., -3:].isnan().all()

    g = torch.Generator().manual_seed(8)
    y, z = (torch.randn(2, 5, 48, generator=g).to(torch.bfloat16).to(device) for _ in range(2))
    wn, dn = (1 + 0.2 * torch.randn(48, generator=g)).to(device), torch.randn(2, 5, 48, generator=g).to(y).to(device)
    tol = mamba2ssd.decode_tolerance(y.dtype, y.dtype)
    for before in (True, False):
        want = torch.ops.mamba2ssd.gated_rmsnorm_bwd(y, z, wn, dn, 16, 1e-6, before)
        # Rows 16-byte aligned as y's: the same plan, the same bits; 7 columns in, the kernel's
        # one-element plan (its sums in another order): within the bars.
        for left, right in ((8, 8), (7, 1)):
            wide, view = _poisoned_columns(y.shape, y.dtype, device, left, right)
            got = torch.ops.mamba2ssd.gated_rmsnorm_bwd(y, z, wn, dn, 16, 1e-6, before, dz_out=view)
            assert got[2].shape == (0,) and wide[..., :left].isnan().all() and wide[..., -right:].isnan().all()
            for a, b in zip(got[:2] + (view, got[3]), want):
                assert torch.equal(a, b) if left == 8 or device == "cpu" else rel_l2(a, b.cpu().double()) <= tol


@pytest.mark.parametrize("device", DEVICES)
def test_library_ops_buffers_errors_are_named(device):
    x, w, b, seq_idx = (t.to(device) if t is not None else None for t in _conv_case(torch.float32, 4, True, True))
    bwd = torch.ops.mamba2ssd.causal_conv1d_bwd
    with pytest.raises(ValueError, match=r"causal_conv1d: dx_out must have shape \[2, 23, 7\], got \[2, 22, 7\]"):
        bwd(x, w, b, seq_idx, x, True, True, dx_out=torch.empty_like(x)[:, 1:])
    with pytest.raises(ValueError, match=r"causal_conv1d: dx_out must be Float, got BFloat16"):
        bwd(x, w, b, seq_idx, x, True, True, dx_out=torch.empty_like(x, dtype=torch.bfloat16))
    with pytest.raises(ValueError, match=r"causal_conv1d: dx_out must have a contiguous last dimension"):
        bwd(x, w, b, seq_idx, x, True, True, dx_out=torch.empty(2, 7, 23, device=device).transpose(1, 2))
    with pytest.raises(ValueError, match=r"causal_conv1d: output dx overlaps input x"):
        bwd(x, w, b, seq_idx, x.clone(), True, True, dx_out=x)
    y, wn = torch.randn(3, 48, device=device), torch.randn(48, device=device)
    nbwd = torch.ops.mamba2ssd.gated_rmsnorm_bwd
    with pytest.raises(ValueError, match=r"gated_rmsnorm: dz_out is given but z is not"):
        nbwd(y, None, wn, y, 48, 1e-6, True, dz_out=torch.empty_like(y))
    z3 = torch.randn(2, 3, 48, device=device)
    with pytest.raises(ValueError, match=r"gated_rmsnorm: dz_out must be viewable as \[rows, dim\]"):
        nbwd(z3, z3, wn, z3, 48, 1e-6, True, dz_out=torch.empty(3, 2, 48, device=device).transpose(0, 1))


def test_library_norm_errors_are_named():
    y, w = torch.randn(3, 48), torch.randn(48)
    with pytest.raises(ValueError, match=r"gated_rmsnorm: group_size must divide dim = 48, got 20"):
        torch.ops.mamba2ssd.gated_rmsnorm_fwd(y, None, w, 20, 1e-6, True)
    with pytest.raises(ValueError, match=r"gated_rmsnorm: weight must have shape \[dim\] = \[48\]"):
        torch.ops.mamba2ssd.gated_rmsnorm_fwd(y, None, w[1:], 48, 1e-6, True)
    with pytest.raises(ValueError, match=r"gated_rmsnorm: z must have y's shape"):
        torch.ops.mamba2ssd.gated_rmsnorm_fwd(y, y[1:], w, 48, 1e-6, True)
    with pytest.raises(ValueError, match=r"gated_rmsnorm: dout must have y's dtype"):
        torch.ops.mamba2ssd.gated_rmsnorm_bwd(y, None, w, y.bfloat16(), 48, 1e-6, True)


def test_library_conv_errors_are_named():
    x, w, b, seq_idx = _conv_case(torch.float32, 4, True, True)
    with pytest.raises(ValueError, match=r"causal_conv1d: width must be 2, 3 or 4, got 5"):
        torch.ops.mamba2ssd.causal_conv1d_fwd(x, torch.randn(7, 5), b, seq_idx, True)
    with pytest.raises(ValueError, match=r"causal_conv1d: weight must have shape \[channels, width\] = \[7, width\]"):
        torch.ops.mamba2ssd.causal_conv1d_fwd(x, torch.randn(6, 4), b, seq_idx, True)
    with pytest.raises(ValueError, match=r"causal_conv1d: seq_idx must have shape \[batch, seqlen\]"):
        torch.ops.mamba2ssd.causal_conv1d_fwd(x, w, b, seq_idx[:, 1:], True)
    with pytest.raises(ValueError, match=r"causal_conv1d: x must be float32, float16 or bfloat16, got Double"):
        torch.ops.mamba2ssd.causal_conv1d_fwd(x.double(), w, b, None, True)
    with pytest.raises(ValueError, match=r"causal_conv1d: dout must have x's dtype"):
        torch.ops.mamba2ssd.causal_conv1d_bwd(x, w, b, None, x.bfloat16(), True, True)


def test_causal_conv1d_matches_the_loop():
    g = torch.Generator().manual_seed(3)
    x, w, bias = torch.randn(2, 9, 5, generator=g), torch.randn(5, 4, generator=g), torch.randn(5, generator=g)
    seq = torch.tensor([[0, 0, 0, 1, 1, 2, 2, 2, 2], [0, 1, 1, 1, 1, 1, 1, 1, 3]], dtype=torch.int32)
    for seq_idx in (None, seq):
        for act in (None, "silu"):
            got = causal_conv1d(x.transpose(0, 1).contiguous().transpose(0, 1), w, bias, seq_idx, act)  # strided x
            assert torch.allclose(got, reference_conv(x, w, bias, seq_idx, act), atol=1e-6)


@pytest.mark.parametrize("change, message", [
    (lambda a: a.update(zxbcdt=a["zxbcdt"][..., 1:]), "zxbcdt's last dim is"),
    (lambda a: a.update(conv1d_weight=a["conv1d_weight"][1:]), "conv1d_weight has"),
    (lambda a: a.update(A=a["A"][:1]), "A must have shape"),
    (lambda a: a.update(rmsnorm_weight=a["rmsnorm_weight"][:3]), "rmsnorm_weight must have shape"),
    (lambda a: a.update(outproj_weight=a["outproj_weight"][:, 1:]), "outproj_weight must be"),
])
def test_bad_shapes_are_named(change, message):
    args, o = make_layer()
    change(args)
    with pytest.raises(ValueError, match=message):
        call(args, o)


def test_bad_arguments_are_named():
    args, o = make_layer()
    with pytest.raises(ValueError, match="activation must be"):
        call(args, dict(o, activation="relu"))
    with pytest.raises(ValueError, match="headdim must be given"):
        split_scan(args["zxbcdt"], args["conv1d_weight"], None, args["dt_bias"], args["A"], args["D"], 16)
    with pytest.raises(ValueError, match="ngroups must divide"):
        call(args, dict(o, G=3))
    with pytest.raises(TypeError, match="zxbcdt must be a torch.Tensor"):
        split_scan(None, args["conv1d_weight"], None, args["dt_bias"], args["A"], args["D"], 16, headdim=32)


@pytest.mark.skipif(not HAS_GPU, reason="needs a CUDA device")
@pytest.mark.parametrize("norm", ["never", "cuda"], ids=["torch_norm", "library_norm"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=str)
@pytest.mark.parametrize("case", ["mamba2_layer", "mlp_part", "packed", "gate_before_norm"])
def test_cuda_against_the_definition(case, dtype, norm, monkeypatch):
    """On CUDA (the convolution on the library's kernels), the norm on PyTorch's operations or on the
    library's kernels (layer._LIBRARY_NORM)."""
    from mamba2ssd import layer
    monkeypatch.setattr(layer, "_LIBRARY_NORM", norm)
    args, o = make_layer(L=300, H=4, P=64, G=2, N=64, dtype=dtype, device="cuda", **dict(CASES[case], seqlens=None))
    if case == "packed":
        args["seq_idx"] = torch.repeat_interleave(torch.arange(3, dtype=torch.int32), torch.tensor([100, 1, 199])) \
            .expand(2, 300).contiguous().cuda()
    leaves = {k: v.detach().clone().requires_grad_() for k, v in args.items() if v.is_floating_point()}
    out, final_states = call(dict(args, **leaves), o, return_final_states=True)
    d_out = torch.randn(out.shape, device="cuda").to(out.dtype)
    got = torch.autograd.grad((out * d_out).float().sum() + final_states.sum(), list(leaves.values()))
    cpu = {k: v.detach().cpu() for k, v in args.items()}
    ref_leaves = {k: v.double().requires_grad_() for k, v in cpu.items() if v.is_floating_point()}
    want_out, want_final = reference(dict(cpu, **ref_leaves), o)
    want = torch.autograd.grad((want_out * d_out.double().cpu()).sum() + want_final.sum(), list(ref_leaves.values()))
    assert rel_l2(out, want_out) <= 2 * mamba2ssd.tolerance(dtype)
    for name, a, w in zip(leaves, got, want):
        assert torch.isfinite(a).all(), name
        assert rel_l2(a, w) <= 2 * mamba2ssd.backward_tolerance(dtype, sum=True), name


# --- against mamba_ssm's own function (from PYTHONPATH or the git-ignored .peers/, as test_peer.py) ---

def _peer_ssd_combined():
    import os
    import sys
    from pathlib import Path
    peers = Path(__file__).resolve().parents[2] / ".peers"
    if (peers / "mamba_ssm").is_dir() and str(peers) not in sys.path:
        sys.path.insert(0, str(peers))
        sys.path.append(str(peers / "_deps"))
    os.environ.setdefault("MAMBA_DETERMINISTIC", "1")
    return pytest.importorskip("mamba_ssm.ops.triton.ssd_combined")


def test_signature_is_mamba_ssms():
    """Every parameter of mamba_ssm's function, in its order, with its default; ours adds keywords only."""
    import inspect
    theirs = inspect.signature(_peer_ssd_combined().mamba_split_conv1d_scan_combined).parameters
    ours = inspect.signature(split_scan).parameters
    assert list(ours)[:len(theirs)] == list(theirs)
    for name, p in theirs.items():
        assert ours[name].default == p.default, name
    assert all(p.kind == inspect.Parameter.KEYWORD_ONLY for p in list(ours.values())[len(theirs):])


@pytest.mark.skipif(not HAS_GPU, reason="mamba_ssm's kernels (Triton) need a CUDA device")
@pytest.mark.parametrize("peer_conv", ["ours", "causal_conv1d"])
@pytest.mark.parametrize("norm", ["never", "cuda"], ids=["torch_norm", "library_norm"])
@pytest.mark.parametrize("case", ["mamba2_layer", "gate_before_norm", "mlp_part", "packed", "plain"])
def test_against_mamba_ssms_function(case, norm, peer_conv, monkeypatch):
    """mamba_ssm's mamba_split_conv1d_scan_combined itself, its causal_conv1d calls answered by this
    library's convolution (peer_conv "ours": a CUDA extension the test machine may lack) or by
    causal_conv1d itself where it imports: the rest (splits, scan, norm, swiglu, projection, and how
    its backward assembles dzxbcdt) is its code. Ours within twice the bars of theirs, on the same
    inputs, forward and every gradient."""
    from mamba2ssd import layer
    from mamba2ssd.layer import _causal_conv1d_backward, _conv
    monkeypatch.setattr(layer, "_LIBRARY_NORM", norm)
    ssd = _peer_ssd_combined()
    if peer_conv == "causal_conv1d" and ssd.causal_conv1d_fwd_function is None:
        pytest.skip("causal_conv1d does not import here (scripts/peer_causal_conv1d.sh builds it)")

    def fwd(x, weight, bias, seq_idx, initial_states, final_states_out, silu):  # x [b, d, s]
        return causal_conv1d(x.transpose(1, 2), weight, bias, seq_idx, "silu" if silu else None).transpose(1, 2)

    def bwd(x, weight, bias, dout, seq_idx, initial_states, dfinal_states, dx, return_dinitial_states, silu):
        xt = x.transpose(1, 2)
        ct = torch.float32
        pre = _conv(xt.to(ct), weight.to(ct), bias, seq_idx) if silu else None
        gx, gw, gb = _causal_conv1d_backward(xt, weight, seq_idx, dout.transpose(1, 2), pre)
        dx.copy_(gx.transpose(1, 2))  # mamba_ssm's backward reads dzxbcdt's slice back, written here
        return dx, gw.to(weight.dtype), gb.to(bias.dtype) if bias is not None else None, None

    if peer_conv == "ours":
        monkeypatch.setattr(ssd, "causal_conv1d_fwd_function", fwd)
        monkeypatch.setattr(ssd, "causal_conv1d_bwd_function", bwd)
    dtype = torch.bfloat16
    args, o = make_layer(L=300, H=4, P=64, G=2, N=64, dtype=dtype, device="cuda", **{"D_dim": True, **CASES[case],
                                                                                    "seqlens": None})
    if case == "packed":
        args["seq_idx"] = torch.repeat_interleave(torch.arange(3, dtype=torch.int32), torch.tensor([100, 1, 199])) \
            .expand(2, 300).contiguous().cuda()
    g = torch.Generator().manual_seed(9)

    def grads(fn):
        leaves = {k: v.detach().clone().requires_grad_() for k, v in args.items() if v.is_floating_point()}
        # Under autocast, as mixed-precision training calls it: mamba_ssm's projection wants its weight
        # in the activations' dtype otherwise (the weights here are float32).
        with torch.autocast("cuda", dtype=dtype):
            out = fn(dict(args, **leaves))
        d_out = torch.randn(out.shape, generator=g).to(out.dtype).cuda()
        return [out] + list(torch.autograd.grad(out, list(leaves.values()), d_out)), list(leaves)

    peer_call = lambda a: ssd.mamba_split_conv1d_scan_combined(  # noqa: E731
        a["zxbcdt"], a["conv1d_weight"], a.get("conv1d_bias"), a["dt_bias"], a["A"], a["D"], 64,
        initial_states=a.get("initial_states"), seq_idx=a.get("seq_idx"), activation=o["activation"],
        rmsnorm_weight=a.get("rmsnorm_weight"), outproj_weight=a.get("outproj_weight"),
        outproj_bias=a.get("outproj_bias"), ngroups=o["G"], norm_before_gate=o["norm_before_gate"])
    g.manual_seed(9)
    theirs, names = grads(peer_call)
    g.manual_seed(9)
    ours, _ = grads(lambda a: call(a, o))
    cpu = {k: v.detach().cpu() for k, v in args.items()}
    ref_leaves = {k: v.double().requires_grad_() for k, v in cpu.items() if v.is_floating_point()}
    want_out, _ = reference(dict(cpu, **ref_leaves), o)
    g.manual_seed(9)
    d_out = torch.randn(want_out.shape, generator=g).to(dtype).double()
    want = [want_out] + list(torch.autograd.grad(want_out, list(ref_leaves.values()), d_out))
    for name, a, b, w in zip(["out"] + names, ours, theirs, want):
        bar = 2 * mamba2ssd.backward_tolerance(dtype, sum=True)
        assert rel_l2(a, w) <= max(2 * rel_l2(b, w), bar), \
            f"{name}: ours {rel_l2(a, w):.3g}, mamba_ssm {rel_l2(b, w):.3g}"
