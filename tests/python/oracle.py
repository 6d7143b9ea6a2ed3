"""The fp64 oracle in Python: the contract's sequential recurrence (docs: ssd-math.md), token by
token, vectorized over batch and heads. It is the Python face of the C++ oracle
(src/reference/reference.cpp) and computes the same function, step for step:

    d = dt + dt_bias;  d = softplus(d) if d <= 20 (when dt_softplus);  d = clamp(d, lo, hi)
    h = initial_states (zeros if none)
    for t: if the sequence id changes at t (from 0 before token 0): h = 0
           h = exp(A d_t) h + d_t outer(x_t, B_t);   y_t = h C_t + D x_t;   y_t *= silu(z_t)
    final_states = h;  varlen_states[s] = h at the last token of sequence s (zeros if empty)

Sequence ids come from seq_idx, else from cu_seqlens, else are all 0.

With differentiable=True the inputs are not detached, so torch.autograd differentiates the same
recurrence: the gradient tests' reference (float64 inputs give float64 gradients).
"""

from __future__ import annotations

import torch


def _f64(t, differentiable=False):
    if t is None:
        return None
    return (t if differentiable else t.detach()).to("cpu", torch.float64)


def sequence_ids(batch: int, seqlen: int, seq_idx=None, cu_seqlens=None) -> torch.Tensor:
    """[batch, seqlen] int64 sequence id of every token."""
    if seq_idx is not None:
        return seq_idx.detach().to("cpu", torch.int64)
    if cu_seqlens is not None:
        ends = cu_seqlens.detach().to("cpu", torch.int64)[1:]
        ids = torch.searchsorted(ends, torch.arange(seqlen), right=True)
        return ids.expand(batch, seqlen)
    return torch.zeros(batch, seqlen, dtype=torch.int64)


def ssd_oracle(x, dt, A, B, C, D=None, z=None, dt_bias=None, initial_states=None, seq_idx=None,
               cu_seqlens=None, dt_softplus=False, dt_limit=(0.0, float("inf")), differentiable=False):
    """Returns (y [b, L, H, P], final_states [b, H, P, N], varlen_states [S, H, P, N] or None),
    all float64 on the CPU. chunk_size does not enter: the recurrence has no chunks."""
    x, dt, A, B, C, D, z, dt_bias, h0 = (_f64(t, differentiable) for t in (x, dt, A, B, C, D, z, dt_bias,
                                                                            initial_states))
    b, L, H, P = x.shape
    G, N = B.shape[2], B.shape[3]
    B = B.repeat_interleave(H // G, dim=2)  # head h reads group h // (H // G)
    C = C.repeat_interleave(H // G, dim=2)

    d = dt if dt_bias is None else dt + dt_bias
    if dt_softplus:
        d = torch.where(d <= 20.0, torch.log1p(torch.exp(d)), d)
    d = d.clamp(float(dt_limit[0]), float(dt_limit[1]))  # NaN stays NaN
    decay = torch.exp(A * d)  # [b, L, H]

    ids = sequence_ids(b, L, seq_idx, cu_seqlens)
    previous = torch.cat([torch.zeros(b, 1, dtype=ids.dtype), ids[:, :-1]], dim=1)
    restart = ids != previous  # [b, L]

    ends = {}  # token -> sequences whose last token it is
    if cu_seqlens is not None:
        cu = cu_seqlens.detach().to("cpu", torch.int64).tolist()
        for s in range(len(cu) - 1):
            if cu[s] < cu[s + 1]:
                ends.setdefault(cu[s + 1] - 1, []).append(s)
    varlen_states = torch.zeros(len(cu) - 1, H, P, N, dtype=torch.float64) if cu_seqlens is not None else None

    h = h0.clone() if h0 is not None else torch.zeros(b, H, P, N, dtype=torch.float64)
    y = torch.empty(b, L, H, P, dtype=torch.float64)
    for t in range(L):
        h = torch.where(restart[:, t, None, None, None], torch.zeros_like(h), h)
        h = decay[:, t, :, None, None] * h + (d[:, t, :, None, None] * x[:, t, :, :, None]) * B[:, t, :, None, :]
        yt = (h * C[:, t, :, None, :]).sum(-1)  # [b, H, P]
        if D is not None:
            yt = yt + (D[None, :, None] if D.dim() == 1 else D[None]) * x[:, t]
        if z is not None:
            zt = z[:, t]
            yt = yt * (zt / (1.0 + torch.exp(-zt)))
        y[:, t] = yt
        for s in ends.get(t, ()):
            varlen_states[s] = h[0]
    return y, h, varlen_states
