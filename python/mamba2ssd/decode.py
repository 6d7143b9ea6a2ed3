"""The decode step: mamba_ssm's selective_state_update for Mamba-2, with the slot indexing of serving
engines, over the op torch.ops.mamba2ssd.selective_state_update (CPU and CUDA).

    out = selective_state_update(state, x, dt, A, B, C, D=D, z=z, dt_bias=dt_bias, dt_softplus=True,
                                 state_batch_indices=slots)

mamba_ssm's Mamba-2 step passes per-head values expanded to the head dim and state size (A as
A[h] expanded to [H, P, N], dt, dt_bias and D expanded to [.., H, P] with stride 0). Those forms are
taken as they are: a tensor expanded with stride 0 is read as its per-head values. A tensor that
really varies along P or N (Mamba-1's A [D, N], a dt per channel) is refused with ValueError: this
is Mamba-2's scalar-per-head recurrence.
"""

from __future__ import annotations

import torch
from torch import Tensor

from . import _C  # noqa: F401  (loads the C++ op library and registers torch.ops.mamba2ssd)
from ._ops import _default_out, _dt_limit_bounds, _int_arg, _one_device

__all__ = ["selective_state_update", "decode_tolerance"]

_NAME = "selective_state_update"


def _per_head(name: str, t: Tensor, lead: int, trailing: tuple[int, ...]) -> Tensor:
    """t with `lead` leading dims then [H] or [H] + trailing[:k] (P, or P and N) expanded with stride 0
    along the trailing dims: the per-head values, shape lead + [H]."""
    extra = t.dim() - lead - 1
    if extra <= 0:
        return t
    if extra > len(trailing) or tuple(t.shape[lead + 1:]) != trailing[:extra]:
        allowed = " or ".join(str(list(trailing[:k])) for k in range(1, len(trailing) + 1))
        raise ValueError(f"{_NAME}: {name} of shape {list(t.shape)}: its dims after the heads must be {allowed} "
                         f"(head dim P, then state size N), or absent")
    for d in range(lead + 1, t.dim()):
        if t.size(d) > 1 and t.stride(d) != 0:
            raise ValueError(
                f"{_NAME}: {name} of shape {list(t.shape)} varies along dim {d}; mamba2ssd runs Mamba-2's "
                f"recurrence, with one {name} per head: pass it per head, or expanded from per head (stride 0)")
    index = (slice(None),) * (lead + 1) + (0,) * extra
    return t[index]


def selective_state_update(
    state: Tensor,
    x: Tensor,
    dt: Tensor,
    A: Tensor,
    B: Tensor,
    C: Tensor,
    D: Tensor | None = None,
    z: Tensor | None = None,
    dt_bias: Tensor | None = None,
    dt_softplus: bool = False,
    state_batch_indices: Tensor | None = None,
    dst_state_batch_indices: Tensor | None = None,
    pad_slot_id: int = -1,
    out: Tensor | None = None,
    *,
    dt_limit: tuple[float, float] = (0.0, float("inf")),
    num_accepted_tokens: Tensor | None = None,
) -> Tensor:
    """One decode step (or T speculative tokens) of Mamba-2; updates `state` in place, returns out.

    Shapes (b requests, T tokens, H heads, P head dim, G groups, N state size, S cache slots),
    mamba_ssm's forms first, then this library's additions:
        state  [S, H, P, N] fp32, fp16 or bf16 (the cache; also [S, P, N]: one head)
        x      [b, H, P], or [b, T, H, P] for T tokens per request; ([b, P]: one head)
        dt     [b, H] or [b, H, P] expanded from it (stride 0); with T: [b, T, H] or [b, T, H, P]
        A      [H], or [H, P, N] expanded from it (stride 0), fp32
        B, C   [b, G, N], or [b, T, G, N]; x's dtype
        D      [H], [H, P] (per head and dim; an expanded [H] counts as per head)
        z      like x;  dt_bias [H] or [H, P] expanded from it
        state_batch_indices      [b] int32/int64: the slot each request reads (default: slot b)
        dst_state_batch_indices  [b] (T = 1) or [b, T]: where the state after each token goes
                                 (default: the last token's back to the read slot, in place)
        pad_slot_id              entries equal to it are skipped (a pad request's out is zero)
        out                      preallocated, x's shape and dtype (default: a new tensor)
        dt_limit (keyword)       clamp of dt after bias and softplus, as in the forward
        num_accepted_tokens (keyword) [b]: vLLM's speculative form, state_batch_indices [b, K]
                                 holding the slots of the previous step's K tokens; request b reads
                                 slot state_batch_indices[b, min(max(n_b - 1, 0), K - 1)] (a gather
                                 on the device: no synchronization; so n_b is clamped, not checked)
    Returns out. Arithmetic is fp32; the state is rounded to the cache's dtype where stored.
    Slot entries outside [0, S) that are not pad_slot_id: ValueError on the CPU; on the GPU the
    entry is treated as a pad (no out-of-bounds access, no host synchronization). Two requests
    storing to one slot, or one storing to a slot another reads: ValueError on the CPU, undefined
    on the GPU (docs/serving.md).
    """
    if x.dim() < 2 or x.dim() > 4:
        raise ValueError(f"{_NAME}: x must be [b, P], [b, H, P] or [b, T, H, P], got shape {list(x.shape)}")
    one_head = x.dim() == 2
    multi_token = x.dim() == 4
    for name, t in (("B", B), ("C", C)):  # [b, N], [b, G, N] or [b, T, G, N], as x is [b, P], [b, H, P] or [b, T, H, P]
        if t.dim() != x.dim():
            raise ValueError(f"{_NAME}: {name} must have x's rank {x.dim()} ([b, N], [b, G, N] or [b, T, G, N]), "
                             f"got shape {list(t.shape)}")
    for name, t in (("A", A), ("D", D), ("dt_bias", dt_bias)):
        if t is not None and not t.is_floating_point():
            raise ValueError(f"{_NAME}: {name} must be a floating-point tensor, got {t.dtype}")
    if out is not None and out.shape != x.shape:
        raise ValueError(f"{_NAME}: out must have x's shape {list(x.shape)}, got {list(out.shape)}")
    x_given = x
    # Everything to the library's layout: x [b, T, H, P], dt [b, T, H], B [b, T, G, N], state [S, H, P, N].
    if one_head:
        state, x = state.unsqueeze(1), x.unsqueeze(1)
        dt = dt.unsqueeze(1)
        A = A.unsqueeze(0) if A.dim() == 2 else A
        B, C = B.unsqueeze(1), C.unsqueeze(1)
        if z is not None:
            z = z.unsqueeze(1)
        if D is not None and D.dim() == 1 and D.size(0) == x.size(2) and x.size(2) > 1:
            D = D.unsqueeze(0)
        if dt_bias is not None and dt_bias.dim() == 1 and dt_bias.size(0) == x.size(2) and x.size(2) > 1:
            dt_bias = dt_bias.unsqueeze(0)
    lead = 2 if multi_token else 1  # dims before the head dim in dt
    x4 = x if multi_token else x.unsqueeze(1)
    P, N = x4.size(-1), B.size(-1)
    dt = _per_head("dt", dt, lead, (P,))
    dt3 = dt if multi_token else dt.unsqueeze(1)
    A1 = _per_head("A", A, 0, (P, N))
    if dt_bias is not None:
        dt_bias = _per_head("dt_bias", dt_bias, 0, (P,))
    if D is not None and D.dim() == 2 and D.size(1) > 1 and D.stride(1) == 0:
        D = D[:, 0]  # expanded from per head: per head
    B4 = B if multi_token else B.unsqueeze(1)
    C4 = C if multi_token else C.unsqueeze(1)
    z4 = None if z is None else (z if multi_token else z.unsqueeze(1))
    if out is None:
        def check_sizes():
            if state.dim() == 4:
                torch.ops.mamba2ssd._validate_decode_sizes(x4.size(0), x4.size(1), state.size(1), state.size(2),
                                                           B4.size(2), state.size(3), state.size(0))
        out = _default_out(x_given, check_sizes)
    out4 = out.unsqueeze(1) if one_head else out  # [b, T, H, P]
    if not multi_token:
        out4 = out4.unsqueeze(1)
    dst = dst_state_batch_indices
    if dst is not None and dst.dim() == 1:  # [b]: one token a request
        if x4.size(1) != 1:
            raise ValueError(f"{_NAME}: dst_state_batch_indices [b] takes one token a request; with "
                             f"{x4.size(1)} tokens it must be [b, T] = [{x4.size(0)}, {x4.size(1)}], got "
                             f"{list(dst.shape)}")
        dst = dst.unsqueeze(1)
    if num_accepted_tokens is not None:
        if state_batch_indices is None or state_batch_indices.dim() != 2:
            raise ValueError(f"{_NAME}: num_accepted_tokens needs state_batch_indices [batch, K], got "
                             f"{None if state_batch_indices is None else list(state_batch_indices.shape)}")
        if num_accepted_tokens.dtype not in (torch.int32, torch.int64) or num_accepted_tokens.dim() != 1 \
                or num_accepted_tokens.size(0) != state_batch_indices.size(0) or state_batch_indices.size(1) < 1:
            raise ValueError(f"{_NAME}: num_accepted_tokens must be an int32 or int64 tensor [batch] beside "
                             f"state_batch_indices [batch, K >= 1], got {num_accepted_tokens.dtype} "
                             f"{list(num_accepted_tokens.shape)} and {list(state_batch_indices.shape)}")
        column = (num_accepted_tokens.to(torch.long) - 1).clamp(min=0, max=state_batch_indices.size(1) - 1)
        state_batch_indices = state_batch_indices.gather(1, column[:, None])[:, 0]
    if state_batch_indices is not None and state_batch_indices.dim() == 2 and state_batch_indices.size(1) == 1:
        state_batch_indices = state_batch_indices[:, 0]
    lo, hi = _dt_limit_bounds(_NAME, dt_limit)
    torch.ops.mamba2ssd.selective_state_update(
        state, x4, dt3, A1, B4, C4, D, z4, dt_bias, bool(dt_softplus), lo, hi,
        state_batch_indices, dst, _int_arg(_NAME, "pad_slot_id", pad_slot_id), out4)
    return out


def decode_tolerance(dtype: torch.dtype, state_dtype: torch.dtype) -> float:
    """Relative L2 tolerance of the decode step's out and stored states against the fp64 oracle
    (src/testing/tolerance.h: the coarser of the inputs' dtype and the cache's)."""
    return torch.ops.mamba2ssd.decode_tolerance(dtype, state_dtype)


@torch.library.register_fake("mamba2ssd::selective_state_update")
def _selective_state_update_fake(state, x, dt, A, B, C, D, z, dt_bias, dt_softplus, dt_min, dt_max,
                                 state_batch_indices, dst_state_batch_indices, pad_slot_id, out):
    # Writes state and out in place, returns nothing: nothing to allocate.
    _one_device("selective_state_update", ("state", state),
               [("x", x), ("dt", dt), ("A", A), ("B", B), ("C", C), ("out", out), ("D", D), ("z", z),
                ("dt_bias", dt_bias), ("state_batch_indices", state_batch_indices),
                ("dst_state_batch_indices", dst_state_batch_indices)], "the state's")
    return None
