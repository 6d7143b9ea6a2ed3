"""The Python half of the op library torch.ops.mamba2ssd (the C++ half is python/csrc).

- chunk_scan_fwd's fake (meta) kernel, so the op traces under torch.compile(fullgraph=True);
- its autograd formula: the forward is all there is, so backward raises NotImplementedError, at
  the time the backward runs (not while torch.compile traces a graph that merely could run it);
- mamba_chunk_scan_combined, mamba_ssm's function over the op.
"""

from __future__ import annotations

import torch
from torch import Tensor

from . import _C  # noqa: F401  (loads the C++ op library and registers torch.ops.mamba2ssd)

__all__ = ["mamba_chunk_scan_combined", "tolerance", "has_cuda_backend"]

_BACKWARD_MESSAGE = (
    "mamba2ssd.mamba_chunk_scan_combined has no backward (forward only); use mamba_ssm's "
    "mamba_chunk_scan_combined for training"
)


def mamba_chunk_scan_combined(
    x: Tensor,
    dt: Tensor,
    A: Tensor,
    B: Tensor,
    C: Tensor,
    chunk_size: int,
    D: Tensor | None = None,
    z: Tensor | None = None,
    dt_bias: Tensor | None = None,
    initial_states: Tensor | None = None,
    seq_idx: Tensor | None = None,
    cu_seqlens: Tensor | None = None,
    dt_softplus: bool = False,
    dt_limit: tuple[float, float] = (0.0, float("inf")),
    return_final_states: bool = False,
    return_varlen_states: bool = False,
    *,
    cuda_path: str = "auto",
):
    """Mamba-2 SSD forward, with the arguments and results of mamba_ssm 2.3.2.post1's function.

    Shapes (b batch, L tokens, H heads, P head dim, G groups, N state size, S sequences):
        x [b, L, H, P] (fp32, fp16 or bf16); dt [b, L, H]; A [H]; B, C [b, L, G, N] (x's dtype);
        D [H] or [H, P]; z like x; dt_bias [H]; initial_states [b, H, P, N];
        seq_idx [b, L] int32; cu_seqlens [S + 1] (b == 1).
    chunk_size is 64, 128 or 256; P is 32, 64 or 128; N a multiple of 16 up to 256.

    Returns y (x's shape and dtype); with return_final_states also final_states [b, H, P, N] fp32;
    with return_varlen_states (needs cu_seqlens) also varlen_states [S, H, P, N] fp32, the state
    at the last token of each sequence: y, (y, final_states), (y, varlen_states) or
    (y, final_states, varlen_states).

    Beyond mamba_ssm: cu_seqlens alone marks packed sequences (the state restarts at each one),
    with or without return_varlen_states; seq_idx, when given, decides the restarts. cuda_path
    (keyword only) picks the CUDA kernels: "auto" (the fastest that applies), "three-kernel",
    "fused", "hopper" (sm_90, 16-bit inputs, 16-byte aligned rows) or "tile" (only in a build with the CUDA Tile C++
    backend); a path that does not cover the call raises ValueError. The CPU ignores it.
    """
    lo, hi = dt_limit
    y, final_states, varlen_states = torch.ops.mamba2ssd.chunk_scan_fwd(
        x, dt, A, B, C, chunk_size, D, z, dt_bias, initial_states, seq_idx, cu_seqlens,
        dt_softplus, float(lo), float(hi), return_final_states, return_varlen_states, cuda_path,
    )
    if return_varlen_states:
        return (y, final_states, varlen_states) if return_final_states else (y, varlen_states)
    return (y, final_states) if return_final_states else y


def tolerance(dtype: torch.dtype) -> float:
    """Relative L2 tolerance ||out - ref|| / ||ref|| against the fp64 oracle for outputs of dtype
    (the project's one table, src/testing/tolerance.h)."""
    return torch.ops.mamba2ssd.tolerance(dtype)


def has_cuda_backend() -> bool:
    """Whether this build of the extension has the CUDA backend (a GPU may still be missing)."""
    return torch.ops.mamba2ssd.has_cuda_backend()


# --- fake kernel -----------------------------------------------------------------------------

@torch.library.register_fake("mamba2ssd::chunk_scan_fwd")
def _chunk_scan_fwd_fake(x, dt, A, B, C, chunk_size, D, z, dt_bias, initial_states, seq_idx, cu_seqlens,
                         dt_softplus, dt_min, dt_max, return_final_states, return_varlen_states, cuda_path="auto"):
    # Outputs as the C++ kernels allocate them: y contiguous in x's dtype, states fp32, and an empty
    # tensor for a state not asked for. Argument checks run when the real kernel runs.
    torch._check(x.dim() == 4, lambda: f"mamba_chunk_scan_combined: x must be a 4-d tensor, got {x.dim()}-d")
    torch._check(B.dim() == 4, lambda: f"mamba_chunk_scan_combined: B must be a 4-d tensor, got {B.dim()}-d")
    b, L, H, P = x.shape
    N = B.shape[3]
    y = x.new_empty((b, L, H, P))
    final_states = x.new_empty((b, H, P, N) if return_final_states else (0,), dtype=torch.float32)
    if return_varlen_states:
        torch._check(cu_seqlens is not None,
                     lambda: "mamba_chunk_scan_combined: return_varlen_states=True needs cu_seqlens")
        varlen_states = x.new_empty((cu_seqlens.shape[0] - 1, H, P, N), dtype=torch.float32)
    else:
        varlen_states = x.new_empty((0,), dtype=torch.float32)
    return y, final_states, varlen_states


# --- autograd: forward only ------------------------------------------------------------------

# Positions of chunk_scan_fwd's floating-point tensor arguments (the ones a gradient could reach).
_GRAD_ARGS = {"x": 0, "dt": 1, "A": 2, "B": 3, "C": 4, "D": 6, "z": 7, "dt_bias": 8, "initial_states": 9}
_NUM_ARGS = 18


@torch.library.custom_op("mamba2ssd::backward_unsupported", mutates_args=())
def _backward_unsupported(grad_y: Tensor, inputs: list[Tensor]) -> list[Tensor]:
    raise NotImplementedError(_BACKWARD_MESSAGE)


@_backward_unsupported.register_fake
def _backward_unsupported_fake(grad_y, inputs):
    return [torch.empty_like(t) for t in inputs]


def _setup_context(ctx, inputs, output):
    # The positions (and tensors, for their shapes) of the arguments that want a gradient.
    wanted = [i for i in _GRAD_ARGS.values()
              if isinstance(inputs[i], Tensor) and inputs[i].requires_grad]
    ctx.grad_positions = wanted
    ctx.save_for_backward(*[inputs[i] for i in wanted])


def _backward(ctx, grad_y, grad_final_states, grad_varlen_states):
    # Routed through an op so that the error comes when a backward runs; a backward formula that
    # raised here would already fail while torch.compile traces the joint graph.
    grads = torch.ops.mamba2ssd.backward_unsupported(grad_y, list(ctx.saved_tensors))
    result = [None] * _NUM_ARGS
    for position, grad in zip(ctx.grad_positions, grads):
        result[position] = grad
    return tuple(result)


torch.library.register_autograd("mamba2ssd::chunk_scan_fwd", _backward, setup_context=_setup_context)
