"""The Mamba-2 layer's training call on mamba2ssd's scan: mamba_ssm 2.3.2.post1's
`mamba_split_conv1d_scan_combined` (what its Mamba2 module runs when training, use_mem_eff_path=True),
the same arguments and results, with the scan and its backward from mamba2ssd.

Between the in-projection and the out-projection it computes, from zxbcdt = [zx0, z, xBC, dt]:

    xBC = silu(causal_conv1d(xBC))            (width W, per channel; seq_idx stops it at sequence starts)
    y = scan(x, dt, A, B, C, D, dt_bias, softplus, dt_limit)  with z = silu gate inside the scan,
        or, with rmsnorm_weight, y = gated RMSNorm(scan(...), z) over groups of dim / ngroups
    out = [swiglu(zx0), y] @ outproj_weight^T + outproj_bias

Memory as mamba_ssm's: the backward keeps zxbcdt, the weights and y, and computes again what it
needs of the rest (the convolution, the norm); the scan's backward takes the scan's inputs (and the
forward's states, with save_states). On CUDA tensors the convolution and the gated norm, and their
gradients, are the library's kernels (conv1d_cuda, gated_rmsnorm_cuda: torch.ops.mamba2ssd.
causal_conv1d_fwd / _bwd and gated_rmsnorm_fwd / _bwd); elsewhere PyTorch's operations in float32
(float64 for float64 inputs), each gradient by its formula so that torch.compile takes the whole
backward: the whole function runs on the CPU too, and in float64 through the oracle
(torch.autograd.gradcheck).
"""

from __future__ import annotations

from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import Tensor

from ._ops import _dt_limit_bounds, _expect_tensors

__all__ = ["mamba_split_conv1d_scan_combined", "causal_conv1d"]

_NAME = "mamba_split_conv1d_scan_combined"


def _compute_dtype(dtype: torch.dtype) -> torch.dtype:
    return torch.float64 if dtype == torch.float64 else torch.float32


def _same_sequence(seq_idx: Tensor, s: int) -> Tensor:
    """[b, L - s, 1]: whether token t (from s on) and token t - s are of one sequence."""
    return (seq_idx[:, s:] == seq_idx[:, :-s]).unsqueeze(-1)


def _conv(xc: Tensor, wc: Tensor, bias: Tensor | None, seq_idx: Tensor | None) -> Tensor:
    """The convolution before its activation, in xc's (the compute) dtype."""
    L, W = xc.shape[1], wc.shape[-1]
    if seq_idx is None:
        out = F.conv1d(xc.transpose(1, 2), wc.unsqueeze(1), None, padding=W - 1, groups=xc.shape[2])
        out = out[..., :L].transpose(1, 2)
    else:
        # Tap W - 1 - s reads token t - s: only where that token is of t's sequence.
        out = xc * wc[:, W - 1]
        for s in range(1, min(W, L)):
            out = out + F.pad(torch.where(_same_sequence(seq_idx, s), xc[:, :-s] * wc[:, W - 1 - s], 0.0), (0, 0, s, 0))
    return out + bias.to(xc.dtype) if bias is not None else out


# Where the library's convolution runs: "cuda" (CUDA tensors), "always" or "never" (tests).
_LIBRARY_CONV = "cuda"


def _library_takes(switch: str, t: Tensor, fits: bool) -> bool:
    """Whether a switch ("cuda", "always" or "never") sends a call on t to the library's kernels:
    fits says they take its shape; float64 stays with PyTorch's operations (the gradcheck path)."""
    return fits and t.dtype != torch.float64 and switch != "never" and (switch == "always" or t.is_cuda)


def _library_conv(x: Tensor, weight: Tensor) -> bool:
    """Whether the library's kernels take this convolution (widths 2 to 4)."""
    return _library_takes(_LIBRARY_CONV, x, 2 <= weight.shape[-1] <= 4)


class _LibraryConv1d(torch.autograd.Function):
    """causal_conv1d on the library's kernels: the backward computes the convolution again from x."""

    @staticmethod
    def forward(ctx, x, weight, bias, seq_idx, silu):
        ctx.save_for_backward(x, weight, bias, seq_idx)
        ctx.silu = silu
        return torch.ops.mamba2ssd.causal_conv1d_fwd(x, weight, bias, seq_idx, silu)

    @staticmethod
    def backward(ctx, dout):
        x, weight, bias, seq_idx = ctx.saved_tensors
        bias_grad = bias is not None and ctx.needs_input_grad[2]
        dx, dweight, dbias = torch.ops.mamba2ssd.causal_conv1d_bwd(x, weight, bias, seq_idx, dout.to(x.dtype),
                                                                   ctx.silu, bias_grad)
        return dx, dweight.to(weight.dtype), dbias.to(bias.dtype) if bias_grad else None, None, None


def causal_conv1d(x: Tensor, weight: Tensor, bias: Tensor | None = None, seq_idx: Tensor | None = None,
                  activation: str | None = None) -> Tensor:
    """Depthwise causal convolution over the tokens, as causal_conv1d computes it for mamba_ssm:
        out[b, t, d] = bias[d] + sum_k weight[d, k] x[b, t - (W - 1) + k, d]
    where a tap before token 0, or (with seq_idx [b, L]) on a token of another sequence than t's,
    reads 0; then silu when activation is "silu" or "swish". x [b, L, D] (any strides), weight [D, W].
    Float32 arithmetic (float64 for float64 x); the result in x's dtype. On CUDA tensors (widths 2
    to 4) the library's kernels, forward and backward; elsewhere PyTorch's operations."""
    silu = activation in ("silu", "swish")
    if _library_conv(x, weight):
        return _LibraryConv1d.apply(x, weight, bias, seq_idx, silu)
    ct = _compute_dtype(x.dtype)
    out = _conv(x.to(ct), weight.to(ct), bias, seq_idx)
    return (F.silu(out) if silu else out).to(x.dtype)


# Where the library's gated RMSNorm runs: "cuda" (CUDA tensors), "always" or "never" (tests; on the
# CPU the ops run the library's fp64 oracle).
_LIBRARY_NORM = "cuda"


def _library_norm(y: Tensor, group_size: int) -> bool:
    """Whether the library's kernels take this norm (groups up to 8192 features)."""
    return _library_takes(_LIBRARY_NORM, y, group_size <= 8192)


@torch.library.register_fake("mamba2ssd::gated_rmsnorm_fwd")
def _rmsnorm_fwd_fake(y, z, weight, group_size, eps, norm_before_gate):
    return y.new_empty(y.shape)


@torch.library.register_fake("mamba2ssd::gated_rmsnorm_bwd")
def _rmsnorm_bwd_fake(y, z, weight, dout, group_size, eps, norm_before_gate, dz_out=None):
    dz = y.new_empty(y.shape if z is not None and dz_out is None else (0,))
    return y.new_empty(y.shape), y.new_empty(y.shape), dz, weight.new_empty(weight.shape, dtype=torch.float32)


@torch.library.register_fake("mamba2ssd::causal_conv1d_fwd")
def _conv1d_fwd_fake(x, weight, bias, seq_idx, silu):
    return x.new_empty(x.shape)


@torch.library.register_fake("mamba2ssd::causal_conv1d_bwd")
def _conv1d_bwd_fake(x, weight, bias, seq_idx, dout, silu, bias_grad, dx_out=None):
    f32 = dict(dtype=torch.float32)
    dbias = weight.new_empty((x.shape[2] if bias_grad else 0,), **f32)
    return x.new_empty(x.shape if dx_out is None else (0,)), weight.new_empty(weight.shape, **f32), dbias


def _silu_grad(v: Tensor) -> Tensor:
    """d silu(v) / dv = sigmoid(v) (1 + v (1 - sigmoid(v)))."""
    s = torch.sigmoid(v)
    return s * (1 + v * (1 - s))


def _causal_conv1d_backward(x: Tensor, weight: Tensor, seq_idx: Tensor | None, dout: Tensor, pre: Tensor | None):
    """The gradients (dx, dweight, dbias) of causal_conv1d for its output's gradient dout, in the
    compute dtype; pre: the convolution before its silu (_conv), None without the activation. Each
    tap transposed: dx_{t - s} += w_s d_t, dweight[:, W - 1 - s] = sum over tokens of d_t x_{t - s}."""
    ct = _compute_dtype(x.dtype)
    xc, wc = x.to(ct), weight.to(ct)
    L, W = xc.shape[1], wc.shape[-1]
    d = dout.to(ct) if pre is None else dout.to(ct) * _silu_grad(pre)
    dw = torch.zeros_like(wc)
    dx = d * wc[:, W - 1]
    dw[:, W - 1] = (d * xc).sum((0, 1))
    for s in range(1, min(W, L)):
        ds = d[:, s:] if seq_idx is None else torch.where(_same_sequence(seq_idx, s), d[:, s:], 0.0)
        dx = dx + F.pad(ds * wc[:, W - 1 - s], (0, 0, 0, s))
        dw[:, W - 1 - s] = (ds * xc[:, :-s]).sum((0, 1))
    return dx, dw, d.sum((0, 1))


def _rmsnorm_parts(y: Tensor, z: Tensor, eps: float, group_size: int, norm_before_gate: bool):
    """RMSNormGated's pieces in the compute dtype: n = v r (v = y, or y silu(z) when the gate comes
    first), r = rsqrt(mean(v^2) + eps) over each group of group_size features, and g = silu(z)."""
    ct = _compute_dtype(y.dtype)
    v, g = y.to(ct), F.silu(z.to(ct))
    if not norm_before_gate:
        v = v * g
    groups = v.unflatten(-1, (-1, group_size))
    r = torch.rsqrt(groups.square().mean(-1, keepdim=True) + eps)
    return (groups * r).flatten(-2), r, g


def _gated_rmsnorm(y: Tensor, z: Tensor, weight: Tensor, eps: float, group_size: int,
                   norm_before_gate: bool) -> Tensor:
    """mamba_ssm's RMSNormGated: y normalized over each group of group_size features (float32),
    times weight, gated by silu(z) after the norm (norm_before_gate) or before it; y's dtype."""
    n, _, g = _rmsnorm_parts(y, z, eps, group_size, norm_before_gate)
    out = n * weight.to(n.dtype)
    return (out * g if norm_before_gate else out).to(y.dtype)


def _gated_rmsnorm_backward(y: Tensor, z: Tensor, weight: Tensor, eps: float, group_size: int,
                            norm_before_gate: bool, dout: Tensor):
    """_gated_rmsnorm's output (y's dtype, as the forward computed it) and its gradients (dy, dz,
    dweight) in the compute dtype: dv = r (dn - n mean(dn n)) over each group."""
    n, r, g = _rmsnorm_parts(y, z, eps, group_size, norm_before_gate)
    zc, wc, d = z.to(n.dtype), weight.to(n.dtype), dout.to(n.dtype)
    out = n * wc
    if norm_before_gate:  # out = n w silu(z)
        out = out * g
        dz = d * n * wc * _silu_grad(zc)
        d = d * g
    dweight = (d * n).sum(tuple(range(d.dim() - 1)))
    dn = (d * wc).unflatten(-1, (-1, group_size))
    ng = n.unflatten(-1, (-1, group_size))
    dv = (r * (dn - ng * (dn * ng).mean(-1, keepdim=True))).flatten(-2)
    if not norm_before_gate:  # v = y silu(z)
        dz = dv * y.to(n.dtype) * _silu_grad(zc)
        dv = dv * g
    return out.to(y.dtype), dv, dz, dweight


def _swiglu(zx0: Tensor) -> Tensor:
    a, b = zx0.chunk(2, dim=-1)
    ct = _compute_dtype(zx0.dtype)
    return (F.silu(a.to(ct)) * b.to(ct)).to(zx0.dtype)


def _swiglu_backward(zx0: Tensor, dout: Tensor):
    """_swiglu's output (zx0's dtype) and d zx0 in the compute dtype (silu(a) b, zx0 = [a, b])."""
    ct = _compute_dtype(zx0.dtype)
    a, b = (t.to(ct) for t in zx0.chunk(2, dim=-1))
    d = dout.to(ct)
    return (F.silu(a) * b).to(zx0.dtype), torch.cat([d * b * _silu_grad(a), d * F.silu(a)], dim=-1)


class _Options(NamedTuple):
    chunk_size: int
    dt_min: float
    dt_max: float
    return_final_states: bool
    activation: str | None
    rmsnorm_eps: float
    nheads: int
    headdim: int
    ngroups: int
    dstate: int
    d_nonssm: int
    norm_before_gate: bool
    cuda_path: str
    save_states: bool


def _split(zxbcdt: Tensor, o: _Options):
    """zxbcdt's four parts: zx0 [b, L, 2 d_nonssm], z [b, L, dim], xBC [b, L, dim + 2 G N], dt [b, L, H]."""
    dim = o.nheads * o.headdim
    return torch.split(zxbcdt, [2 * o.d_nonssm, dim, dim + 2 * o.ngroups * o.dstate, o.nheads], dim=-1)


def _scan_inputs(xBC: Tensor, o: _Options):
    """x [b, L, H, P], B and C [b, L, G, N]: views of the convolution's output."""
    x, B, C = torch.split(xBC, [o.nheads * o.headdim, o.ngroups * o.dstate, o.ngroups * o.dstate], dim=-1)
    return (x.unflatten(-1, (o.nheads, o.headdim)), B.unflatten(-1, (o.ngroups, o.dstate)),
            C.unflatten(-1, (o.ngroups, o.dstate)))


class _SplitConv1dScan(torch.autograd.Function):
    @staticmethod
    def forward(ctx, zxbcdt, conv1d_weight, conv1d_bias, dt_bias, A, D, initial_states, seq_idx, rmsnorm_weight,
                outproj_weight, outproj_bias, o: _Options):
        zx0, z, xBC, dt = _split(zxbcdt, o)
        device = zxbcdt.device.type
        # Autocast would run the convolution in its own dtype here but not in the backward, which
        # computes it again: the inputs' dtypes rule, as in mamba_ssm's kernels, but for the projection.
        with torch.autocast(device, enabled=False):
            x, B, C = _scan_inputs(causal_conv1d(xBC, conv1d_weight, conv1d_bias, seq_idx, o.activation), o)
            gated = rmsnorm_weight is not None
            z4 = z.unflatten(-1, (o.nheads, o.headdim))
            y, final_states, _, saved_states = torch.ops.mamba2ssd.chunk_scan_fwd(
                x, dt, A, B, C, o.chunk_size, D, None if gated else z4, dt_bias, initial_states, seq_idx, None, True,
                o.dt_min, o.dt_max, o.return_final_states, False, o.cuda_path, False, "tf32",
                o.save_states and x.is_cuda)
            out = _linear_input(zx0, y, z, rmsnorm_weight, o)
        ctx.linear_dtype = out.dtype
        if outproj_weight is not None:
            if torch.is_autocast_enabled(device):  # as mamba_ssm: the projection in autocast's dtype
                ctx.linear_dtype = torch.get_autocast_dtype(device)
            dtype = ctx.linear_dtype
            out = F.linear(out.to(dtype), outproj_weight.to(dtype),
                           outproj_bias.to(dtype) if outproj_bias is not None else None)
        ctx.save_for_backward(zxbcdt, conv1d_weight, conv1d_bias, dt_bias, A, D, initial_states, seq_idx,
                              rmsnorm_weight, outproj_weight, y, saved_states)
        ctx.options = o
        ctx.outproj_bias_dtype = outproj_bias.dtype if outproj_bias is not None else None
        ctx.set_materialize_grads(False)
        return out, final_states

    @staticmethod
    def backward(ctx, dout, dfinal_states):
        (zxbcdt, conv1d_weight, conv1d_bias, dt_bias, A, D, initial_states, seq_idx, rmsnorm_weight, outproj_weight, y,
         saved_states) = ctx.saved_tensors
        o: _Options = ctx.options
        zx0, z, xBC, dt = _split(zxbcdt, o)
        gated = rmsnorm_weight is not None
        dim = o.nheads * o.headdim
        if dout is None:  # only the final states reach the loss
            features = outproj_weight.shape[0] if outproj_weight is not None else o.d_nonssm + dim
            dout = zxbcdt.new_zeros(zxbcdt.shape[:-1] + (features,), dtype=ctx.linear_dtype)
        grads = {}
        # zxbcdt's gradient is written part by part into its slices (d_zx0, d_z, d_xBC, d_dt): the
        # library's ops take them as output buffers, so that nothing is concatenated.
        grads["zxbcdt"] = torch.empty(zxbcdt.shape, dtype=zxbcdt.dtype, device=zxbcdt.device)
        d_zx0, d_z, d_xBC, d_dt = _split(grads["zxbcdt"], o)

        # The out-projection by hand, then the MLP part's swiglu and the norm, each by its formula;
        # their outputs, computed again on the way, are what the projection read (its weight's gradient).
        d_lin = dout @ outproj_weight.to(ctx.linear_dtype) if outproj_weight is not None else dout
        d_mlp, dy = d_lin.split([o.d_nonssm, dim], dim=-1)
        lin_in = [y.flatten(-2)]
        if o.d_nonssm > 0:
            mlp_out, g_zx0 = _swiglu_backward(zx0, d_mlp)
            d_zx0.copy_(g_zx0)
            lin_in.insert(0, mlp_out)
        if gated and _library_norm(lin_in[-1], dim // o.ngroups):  # its backward writes its output again
            y_flat, args = lin_in[-1], (dim // o.ngroups, o.rmsnorm_eps, o.norm_before_gate)
            lin_in[-1], dy, _, grads["rmsnorm_weight"] = torch.ops.mamba2ssd.gated_rmsnorm_bwd(
                y_flat, z, rmsnorm_weight, dy.to(y_flat.dtype), *args, dz_out=d_z)
        elif gated:
            lin_in[-1], dy, g_z, grads["rmsnorm_weight"] = _gated_rmsnorm_backward(
                lin_in[-1], z, rmsnorm_weight, o.rmsnorm_eps, dim // o.ngroups, o.norm_before_gate, dy)
            d_z.copy_(g_z)
        if outproj_weight is not None:
            # (a single part as it is: torch.cat would copy it)
            lin = torch.cat(lin_in, -1) if len(lin_in) > 1 else lin_in[0]
            grads["outproj_weight"] = torch.einsum("...o,...d->od", dout, lin.to(ctx.linear_dtype))
            if ctx.outproj_bias_dtype is not None:
                grads["outproj_bias"] = dout.sum(dim=tuple(range(dout.dim() - 1)))

        # The scan's backward, on the convolution's output computed again, then the convolution's.
        activated = o.activation in ("silu", "swish")
        library = _library_conv(xBC, conv1d_weight)
        if library:
            x, B, C = _scan_inputs(torch.ops.mamba2ssd.causal_conv1d_fwd(xBC, conv1d_weight, conv1d_bias, seq_idx,
                                                                         activated), o)
        else:
            ct = _compute_dtype(xBC.dtype)
            pre = _conv(xBC.to(ct), conv1d_weight.to(ct), conv1d_bias, seq_idx)
            x, B, C = _scan_inputs((F.silu(pre) if activated else pre).to(xBC.dtype), o)
        # dx, dB and dC into one buffer laid out as xBC (what the convolution's backward reads), ddt
        # and (ungated) dz into zxbcdt's gradient.
        d_conv = torch.empty(xBC.shape, dtype=xBC.dtype, device=xBC.device)
        d_x, d_B, d_C = _scan_inputs(d_conv, o)
        heads = (o.nheads, o.headdim)
        dA, dD, ddt_bias, dinitial = torch.ops.mamba2ssd.chunk_scan_bwd_into(
            dy.to(y.dtype).unflatten(-1, heads), dfinal_states if o.return_final_states else None,
            None, x, dt, A, B, C, o.chunk_size, D, None if gated else z.unflatten(-1, heads),
            dt_bias, initial_states, seq_idx, None, True, o.dt_min, o.dt_max, o.cuda_path, False,
            saved_states if saved_states.numel() > 0 else None, d_x, d_dt, d_B, d_C,
            None if gated else d_z.unflatten(-1, heads))
        if library:
            _, grads["conv1d_weight"], grads["conv1d_bias"] = torch.ops.mamba2ssd.causal_conv1d_bwd(
                xBC, conv1d_weight, conv1d_bias, seq_idx, d_conv, activated, conv1d_bias is not None, dx_out=d_xBC)
        else:
            g_xBC, grads["conv1d_weight"], grads["conv1d_bias"] = _causal_conv1d_backward(
                xBC, conv1d_weight, seq_idx, d_conv, pre if activated else None)
            d_xBC.copy_(g_xBC)
        grads.update(dt_bias=ddt_bias, A=dA, D=dD, initial_states=dinitial)
        inputs = (("zxbcdt", zxbcdt), ("conv1d_weight", conv1d_weight), ("conv1d_bias", conv1d_bias),
                  ("dt_bias", dt_bias), ("A", A), ("D", D), ("initial_states", initial_states), ("seq_idx", None),
                  ("rmsnorm_weight", rmsnorm_weight), ("outproj_weight", outproj_weight),
                  ("outproj_bias", ctx.outproj_bias_dtype), ("options", None))
        # Each gradient in its input's dtype (the scan's small ones are float32).
        return tuple(grads[name].to(t if isinstance(t, torch.dtype) else t.dtype)
                     if ctx.needs_input_grad[i] and name in grads else None for i, (name, t) in enumerate(inputs))


def _linear_input(zx0: Tensor, y: Tensor, z: Tensor, rmsnorm_weight: Tensor | None, o: _Options) -> Tensor:
    """What the out-projection reads: [swiglu(zx0), y] with y [b, L, H, P] flattened, normed and gated
    by z when rmsnorm_weight is given (else the scan gated it)."""
    y = y.flatten(-2)
    if rmsnorm_weight is not None:
        group_size = y.shape[-1] // o.ngroups
        if _library_norm(y, group_size):
            y = torch.ops.mamba2ssd.gated_rmsnorm_fwd(y, z, rmsnorm_weight, group_size, o.rmsnorm_eps,
                                                      o.norm_before_gate)
        else:
            y = _gated_rmsnorm(y, z, rmsnorm_weight, o.rmsnorm_eps, group_size, o.norm_before_gate)
    return torch.cat([_swiglu(zx0), y], dim=-1) if o.d_nonssm > 0 else y


def mamba_split_conv1d_scan_combined(
    zxbcdt: Tensor,
    conv1d_weight: Tensor,
    conv1d_bias: Tensor | None,
    dt_bias: Tensor,
    A: Tensor,
    D: Tensor,
    chunk_size: int,
    initial_states: Tensor | None = None,
    seq_idx: Tensor | None = None,
    dt_limit: tuple[float, float] = (0.0, float("inf")),
    return_final_states: bool = False,
    activation: str | None = "silu",
    rmsnorm_weight: Tensor | None = None,
    rmsnorm_eps: float = 1e-6,
    outproj_weight: Tensor | None = None,
    outproj_bias: Tensor | None = None,
    headdim: int | None = None,
    ngroups: int = 1,
    norm_before_gate: bool = True,
    *,
    cuda_path: str = "auto",
    save_states: bool = False,
):
    """mamba_ssm 2.3.2.post1's mamba_split_conv1d_scan_combined (the Mamba2 module's training call),
    differentiable, on mamba2ssd's scan. Arguments as mamba_ssm's:

        zxbcdt          [b, L, 2 d_nonssm + 2 dim + 2 G N + H], dim = H P: [zx0, z, xBC, dt]
        conv1d_weight   [dim + 2 G N, W]; conv1d_bias [dim + 2 G N] or None
        dt_bias, A      [H];  D [H] (then headdim is required) or [H, P]
        initial_states  [b, H, P, N];  seq_idx [b, L] int32 (the convolution and the scan restart)
        rmsnorm_weight  [dim] or None: y = RMSNormGated(y, z) over groups of dim / ngroups, else z
                        gates inside the scan; outproj_weight [out, dim + d_nonssm], outproj_bias [out]

    Returns out [b, L, out] (or [b, L, d_nonssm + dim] without outproj_weight), and with
    return_final_states also final_states [b, H, P, N] (float32). dt always goes through softplus.
    Keywords beyond mamba_ssm: cuda_path and save_states, as in mamba_chunk_scan_combined.
    Under autocast the out-projection runs in autocast's dtype (as mamba_ssm's), the rest in the
    inputs' dtypes. torch.compile(fullgraph=True) takes it whole, forward and backward.

    To have mamba_ssm's Mamba2 module train on it (both of its paths):

        import mamba_ssm.modules.mamba2 as m
        m.mamba_split_conv1d_scan_combined = mamba2ssd.mamba_split_conv1d_scan_combined
        m.mamba_chunk_scan_combined = mamba2ssd.mamba_chunk_scan_combined
    """
    _expect_tensors(_NAME, (("zxbcdt", zxbcdt), ("conv1d_weight", conv1d_weight), ("dt_bias", dt_bias), ("A", A),
                            ("D", D)),
                    (("conv1d_bias", conv1d_bias), ("initial_states", initial_states), ("seq_idx", seq_idx),
                     ("rmsnorm_weight", rmsnorm_weight), ("outproj_weight", outproj_weight),
                     ("outproj_bias", outproj_bias)))
    if activation not in (None, "silu", "swish"):
        raise ValueError(f"{_NAME}: activation must be None, 'silu' or 'swish', got {activation!r}")
    if D.dim() == 1:
        if headdim is None:
            raise ValueError(f"{_NAME}: D of shape {list(D.shape)} is per head, so headdim must be given")
        nheads, headdim = D.shape[0], int(headdim)
    elif D.dim() == 2:
        nheads, headdim = D.shape
    else:
        raise ValueError(f"{_NAME}: D must be [nheads] or [nheads, headdim], got shape {list(D.shape)}")
    if zxbcdt.dim() != 3:
        raise ValueError(f"{_NAME}: zxbcdt must be [batch, seqlen, features], got shape {list(zxbcdt.shape)}")
    if ngroups < 1 or nheads % ngroups != 0:
        raise ValueError(f"{_NAME}: ngroups must divide nheads = {nheads}, got {ngroups}")
    if conv1d_weight.dim() != 2:
        raise ValueError(f"{_NAME}: conv1d_weight must be [channels, width], got shape {list(conv1d_weight.shape)}")
    dim = nheads * headdim
    dstate = (conv1d_weight.shape[0] - dim) // ngroups // 2
    d_nonssm = (zxbcdt.shape[-1] - 2 * dim - 2 * ngroups * dstate - nheads) // 2
    if dstate < 1 or conv1d_weight.shape[0] != dim + 2 * ngroups * dstate:
        raise ValueError(f"{_NAME}: conv1d_weight has {conv1d_weight.shape[0]} channels; with nheads {nheads}, "
                         f"headdim {headdim} and ngroups {ngroups} it must be {dim} + 2 x {ngroups} x dstate")
    if d_nonssm < 0 or zxbcdt.shape[-1] != 2 * d_nonssm + 2 * dim + 2 * ngroups * dstate + nheads:
        raise ValueError(f"{_NAME}: zxbcdt's last dim is {zxbcdt.shape[-1]}; with dim {dim}, ngroups {ngroups}, "
                         f"dstate {dstate} and nheads {nheads} it must be 2 x d_nonssm + "
                         f"{2 * dim + 2 * ngroups * dstate + nheads}")
    for name, t, shape in (("dt_bias", dt_bias, (nheads,)), ("A", A, (nheads,)),
                           ("conv1d_bias", conv1d_bias, (conv1d_weight.shape[0],)),
                           ("rmsnorm_weight", rmsnorm_weight, (dim,))):
        if t is not None and tuple(t.shape) != shape:
            raise ValueError(f"{_NAME}: {name} must have shape {list(shape)}, got {list(t.shape)}")
    if outproj_weight is None and outproj_bias is not None:
        raise ValueError(f"{_NAME}: outproj_bias needs outproj_weight")
    if outproj_weight is not None and (outproj_weight.dim() != 2 or outproj_weight.shape[1] != d_nonssm + dim):
        raise ValueError(f"{_NAME}: outproj_weight must be [out, {d_nonssm + dim}], got {list(outproj_weight.shape)}")
    lo, hi = _dt_limit_bounds(_NAME, dt_limit)
    o = _Options(int(chunk_size), lo, hi, bool(return_final_states), activation, float(rmsnorm_eps), nheads,
                 headdim, ngroups, dstate, d_nonssm, bool(norm_before_gate), cuda_path, bool(save_states))
    out, final_states = _SplitConv1dScan.apply(zxbcdt, conv1d_weight, conv1d_bias, dt_bias, A, D, initial_states,
                                               seq_idx, rmsnorm_weight, outproj_weight, outproj_bias, o)
    return (out, final_states) if return_final_states else out
