"""The packed prefill of serving: S requests of mixed lengths packed into one row of tokens (vLLM's
mamba_chunk_scan_combined_varlen layout), each starting from the state in its cache slot (or from
zero, a new request) and storing its state after its last token back into that slot, over the op
torch.ops.mamba2ssd.prefill.

    y = prefill(x, dt, A, B, C, chunk_size, cu_seqlens, state, slots, has_initial_state,
                D=D, z=z, dt_bias=dt_bias, dt_softplus=True)

This is what vLLM's Mamba-2 mixer does around its varlen scan, in one call: gather
initial_states = state[slots] (zeroed where has_initial_state is false), scan, then scatter the
per-request final states back into state[slots] (and, with state_every = k, the states every k
tokens into intermediate_slots, for a prefix cache). CPU and CUDA: on a GPU it runs prefill_cuda on
the current stream with a workspace from PyTorch's caching allocator and never synchronizes with the
host, so it can be captured in a CUDA graph (torch.cuda.graph, torch.compile's "reduce-overhead");
every tensor must be on the cache's device.
"""

from __future__ import annotations

import torch
from torch import Tensor

from . import _C  # noqa: F401  (loads the C++ op library and registers torch.ops.mamba2ssd)
from ._ops import _default_out, _dt_limit_bounds, _int_arg, _one_device

__all__ = ["prefill", "prefill_tolerance"]

_NAME = "prefill"


def prefill(
    x: Tensor,
    dt: Tensor,
    A: Tensor,
    B: Tensor,
    C: Tensor,
    chunk_size: int,
    cu_seqlens: Tensor,
    state: Tensor,
    slots: Tensor,
    has_initial_state: Tensor | None = None,
    *,
    seq_idx: Tensor | None = None,
    D: Tensor | None = None,
    z: Tensor | None = None,
    dt_bias: Tensor | None = None,
    dt_softplus: bool = False,
    dt_limit: tuple[float, float] = (0.0, float("inf")),
    pad_slot_id: int = -1,
    out: Tensor | None = None,
    state_every: int = 0,
    intermediate_slots: Tensor | None = None,
) -> Tensor:
    """Packed prefill of S requests from and into their cache slots; updates `state` in place, returns y.

    Shapes (T packed tokens, S requests, H heads, P head dim, G groups, N state size):
        x       [T, H, P] fp32, fp16 or bf16 (also [1, T, H, P], mamba_chunk_scan_combined's packed
                form: then dt, B, C, z, seq_idx and out may carry the leading 1 too)
        dt      [T, H] fp32, fp16 or bf16;  A [H]
        B, C    [T, G, N], x's dtype
        chunk_size   the forward's chunk length: 64, 128 or 256
        cu_seqlens   [S + 1] int32/int64: request s holds tokens [cu_seqlens[s], cu_seqlens[s+1]);
                     non-decreasing (a request of 0 tokens stores its starting state), ends at T
        state        [nslots, H, P, N] fp32, bf16 or fp16: the cache, read and written in place
                     (any strides with contiguous rows)
        slots        [S] int32: request s's slot; pad_slot_id (default -1): neither read nor
                     written, y still computed from a zero state
        has_initial_state  [S] bool or uint8, or None (every request reads its slot): false starts
                     request s from zero (a new request), still storing into its slot
        seq_idx      [T] int32/int64 or None: the engines' per-token request ids; checked to change
                     exactly where cu_seqlens starts a request (the requests are cu_seqlens')
        D [H] or [H, P];  z like x;  dt_bias [H];  dt_softplus;  dt_limit: clamp of dt after both
        out          preallocated, x's shape and dtype, contiguous rows (default: a new tensor)
        state_every  k: 0 (default: no intermediate states), or a multiple of chunk_size: request s
                     also stores its state after its (m*k)-th token (counted from its first token
                     here, that token included) to slot intermediate_slots[s, m-1], for m*k <= its
                     length and m <= M; an entry equal to pad_slot_id skips that store, boundaries
                     past M are not stored, a pad request stores none. When its length is a multiple
                     of k, its last boundary's state is its final state (that entry may name slots[s])
        intermediate_slots  [S, M] int32, with state_every > 0 only (M, max_intermediate, >= 1)
    Returns out. Arithmetic is fp32 (or better); each stored state is rounded to the cache's dtype.
    Every tensor must be on the cache's device. Bad input raises ValueError naming the parameter; on
    the CPU also a slot outside [0, nslots) that is not pad_slot_id, two requests naming one slot, or
    an intermediate state stored to a request's slot or to another's (naming the entries), before
    anything is written. The GPU reads no slot on the host (no sync): it treats an entry outside
    [0, nslots) as pad_slot_id and leaves a slot that two stores name undefined, never writing outside
    the slots named; it does not read seq_idx (cu_seqlens marks the requests).
    """
    given = out
    chunk_size = _int_arg(_NAME, "chunk_size", chunk_size)
    packed = x.dim() == 4
    if packed:
        if x.size(0) != 1:
            raise ValueError(f"{_NAME}: x must be [tokens, nheads, headdim] or [1, tokens, nheads, headdim] (the "
                             f"requests packed into one row), got shape {list(x.shape)}")
        # The packed form's leading 1 off, where present; anything else goes to the op's checks as it is.
        one = lambda t, rank: t[0] if t is not None and t.dim() == rank and t.size(0) == 1 else t  # noqa: E731
        x, dt, B, C, z, seq_idx, out = one(x, 4), one(dt, 3), one(B, 4), one(C, 4), one(z, 4), one(seq_idx, 2), one(out, 4)
    if out is None:
        def check_sizes():
            if x.dim() == 3 and B.dim() == 3 and state.dim() == 4:
                torch.ops.mamba2ssd._validate_prefill_sizes(x.size(0), state.size(1), state.size(2), B.size(1),
                                                            state.size(3), state.size(0), chunk_size)
        out = _default_out(x, check_sizes)
    lo, hi = _dt_limit_bounds(_NAME, dt_limit)
    torch.ops.mamba2ssd.prefill(
        state, x, dt, A, B, C, chunk_size, cu_seqlens, seq_idx, D, z, dt_bias, bool(dt_softplus), lo, hi, slots,
        has_initial_state, _int_arg(_NAME, "pad_slot_id", pad_slot_id), out,
        _int_arg(_NAME, "state_every", state_every), intermediate_slots)
    if given is not None:
        return given
    return out.unsqueeze(0) if packed else out


def prefill_tolerance(dtype: torch.dtype, state_dtype: torch.dtype) -> float:
    """Relative L2 tolerance of the prefill's y and stored states against the fp64 oracle
    (src/testing/tolerance.h: the forward's bar for the inputs' dtype or the decode step's for the
    cache's, whichever is coarser)."""
    return torch.ops.mamba2ssd.prefill_tolerance(dtype, state_dtype)


@torch.library.register_fake("mamba2ssd::prefill")
def _prefill_fake(state, x, dt, A, B, C, chunk_size, cu_seqlens, seq_idx, D, z, dt_bias, dt_softplus, dt_min, dt_max,
                  slots, has_initial_state, pad_slot_id, out, state_every=0, intermediate_slots=None):
    # Writes state and out in place, returns nothing: nothing to allocate.
    _one_device("prefill", ("state", state),
               [("x", x), ("dt", dt), ("A", A), ("B", B), ("C", C), ("cu_seqlens", cu_seqlens), ("seq_idx", seq_idx),
                ("D", D), ("z", z), ("dt_bias", dt_bias), ("slots", slots), ("has_initial_state", has_initial_state),
                ("out", out), ("intermediate_slots", intermediate_slots)], "the state's")
    return None
