"""The Python half of the op library torch.ops.mamba2ssd (the C++ half is python/csrc).

- the fake (meta) kernels of chunk_scan_fwd and chunk_scan_bwd, so both trace under
  torch.compile(fullgraph=True);
- chunk_scan_fwd's autograd formula, which calls chunk_scan_bwd (the library's backward: the
  reference backend for float64 CPU tensors, the CPU backend for other CPU tensors, the CUDA
  backend on the current stream for CUDA tensors);
- mamba_chunk_scan_combined, mamba_ssm's function over the op.
"""

from __future__ import annotations

import torch
from torch import Tensor

from . import _C  # noqa: F401  (loads the C++ op library and registers torch.ops.mamba2ssd)

__all__ = ["mamba_chunk_scan_combined", "tolerance", "backward_tolerance", "has_cuda_backend"]


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
    check_inputs: bool = False,
    fp32_math: str = "tf32",
    save_states: bool = False,
):
    """Mamba-2 SSD, with the arguments and results of mamba_ssm 2.3.2.post1's function, and its
    gradients (autograd) with respect to x, dt, A, B, C, D, z, dt_bias and initial_states, through y
    and the returned states (varlen_states included, on the backends that take them; one that does
    not raises ValueError rather than drop the gradient).

    Shapes (b batch, L tokens, H heads, P head dim, G groups, N state size, S sequences):
        x [b, L, H, P] (fp32, fp16 or bf16; fp64 on the CPU); dt [b, L, H]; A [H]; B, C [b, L, G, N] (x's dtype);
        D [H] or [H, P]; z like x; dt_bias [H]; initial_states [b, H, P, N];
        seq_idx [b, L] int32; cu_seqlens [S + 1] (b == 1).
    chunk_size is any length >= 1 (it does not change the function); P a multiple of 16 up to 128
    (Nemotron-H's 80 too); N a multiple of 16 up to 256.

    Returns y (x's shape and dtype); with return_final_states also final_states [b, H, P, N] fp32;
    with return_varlen_states (needs cu_seqlens) also varlen_states [S, H, P, N] fp32, the state
    at the last token of each sequence: y, (y, final_states), (y, varlen_states) or
    (y, final_states, varlen_states).

    Beyond mamba_ssm: cu_seqlens alone marks packed sequences (the state restarts at each one),
    with or without return_varlen_states; seq_idx, when given, decides the restarts. cuda_path
    (keyword only) picks the CUDA kernels: "auto" (the fastest that applies), "three-kernel",
    "fused", "hopper" (sm_90; bf16 and fp16, fp32 with TF32 products up to state size 128; 16-byte
    aligned rows) or "tile" (only in a build with the CUDA Tile C++ backend); a path that does not
    cover the call raises ValueError. The CPU ignores it. float64
    CPU tensors run the exact fp64 oracle (forward and backward), for torch.autograd.gradcheck.

    check_inputs (keyword only, default False) validates the contents of cu_seqlens and seq_idx:
    cu_seqlens starts at 0, never decreases and ends at seqlen; seq_idx never decreases along a
    row. A bad entry raises ValueError naming it ("seq_idx[0, 250] = 1 is less than the id before
    it ..."). On the CPU this costs a pass over the ids (cu_seqlens is checked in any case). On
    CUDA a small check kernel runs before the forward and the call synchronizes the stream to read
    its result, so the forward is no longer asynchronous. During CUDA graph capture
    (torch.cuda.graph, torch.compile(mode="reduce-overhead")) it cannot synchronize: the check runs
    but nothing reads it and nothing is raised; validate such inputs by one eager call with
    check_inputs=True (or before the replay). Without the check, bad contents never make the
    kernels read or write out of bounds, but give unspecified outputs. The backward (autograd) runs
    checked too, with the same ValueError (prefixed "backward: ") and the same rules on CUDA: it
    synchronizes outside capture, and raises nothing during capture.

    fp32_math (keyword only, default "tf32") says how the CUDA forward multiplies float32 inputs on
    the tensor cores: "tf32" rounds every operand to TF32 (mamba_ssm's accuracy class);
    "accurate" splits each into two TF32 parts and takes three products (3xTF32), close to float32
    FMA accuracy, at three tensor-core products for one. float16, bfloat16 and the CPU ignore it;
    cuda_path "tile" refuses "accurate"; another string raises ValueError. The backward (autograd)
    ignores it: its float32 products are TF32.

    save_states (keyword only, default False) trades memory for a faster backward on CUDA: the
    forward keeps the state entering every 64-token chunk (b * ceil(L / 64) * H * P * N elements in
    x's dtype, 134 MB at b 4, L 16384, H 8, P 64, N 128 in bf16) until the backward, which reads them
    instead of walking the sequence again for them (docs/backward.md, "What the backward needs from
    the forward"). It applies where a backward will run (grad enabled, an input requiring grad) on
    CUDA tensors; elsewhere it changes nothing. Forward and gradients are the same function either way.
    """
    _expect_scan_tensors("mamba_chunk_scan_combined", x, dt, A, B, C, D, z, dt_bias, initial_states, seq_idx,
                         cu_seqlens)
    lo, hi = _dt_limit_bounds("mamba_chunk_scan_combined", dt_limit)
    needs_grad = torch.is_grad_enabled() and any(
        t is not None and t.requires_grad for t in (x, dt, A, B, C, D, z, dt_bias, initial_states))
    y, final_states, varlen_states, _saved_states = torch.ops.mamba2ssd.chunk_scan_fwd(
        x, dt, A, B, C, chunk_size, D, z, dt_bias, initial_states, seq_idx, cu_seqlens,
        dt_softplus, lo, hi, return_final_states, return_varlen_states, cuda_path, check_inputs,
        fp32_math, save_states and needs_grad and x.is_cuda,
    )
    if return_varlen_states:
        return (y, final_states, varlen_states) if return_final_states else (y, varlen_states)
    return (y, final_states) if return_final_states else y


def tolerance(dtype: torch.dtype, fp32_math: str = "tf32") -> float:
    """Relative L2 tolerance ||out - ref|| / ||ref|| against the fp64 oracle for outputs of dtype
    (the project's one table, src/testing/tolerance.h); fp32_math="accurate" gives float32's bar
    with 3xTF32 products (the other dtypes' bars do not depend on it)."""
    return torch.ops.mamba2ssd.tolerance(dtype, fp32_math)


def backward_tolerance(dtype: torch.dtype, sum: bool = False) -> float:
    """The bar for the backward's gradients, by the dtype of x (the one table); sum=True for dA,
    ddt_bias and dD, which sum over every token (their terms cancel, so their error is amplified)."""
    return torch.ops.mamba2ssd.backward_tolerance(dtype, sum)


def has_cuda_backend() -> bool:
    """Whether this build of the extension has the CUDA backend (a GPU may still be missing)."""
    return torch.ops.mamba2ssd.has_cuda_backend()


# --- the ops' shared argument checks ----------------------------------------------------------
# What the library cannot name because it never sees it: a None or a numpy array where a tensor goes
# (torch's dispatch would say "tensor does not have a device", or an attribute would be missing), a
# dt_limit that is not a pair, an integer argument given as None. Values are the library's to judge.

def _expect_tensors(function, required, optional=()):
    """Each (name, value) of `required` a torch.Tensor, each of `optional` one or None: else TypeError."""
    for name, t in required:
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{function}: {name} must be a torch.Tensor, got {type(t).__name__}")
    for name, t in optional:
        if t is not None and not isinstance(t, torch.Tensor):
            raise TypeError(f"{function}: {name} must be a torch.Tensor or None, got {type(t).__name__}")


def _expect_scan_tensors(function, x, dt, A, B, C, D, z, dt_bias, initial_states, seq_idx, cu_seqlens):
    """_expect_tensors over the scan's tensor arguments (the op's and the distributed one's)."""
    _expect_tensors(function, (("x", x), ("dt", dt), ("A", A), ("B", B), ("C", C)),
                    (("D", D), ("z", z), ("dt_bias", dt_bias), ("initial_states", initial_states),
                     ("seq_idx", seq_idx), ("cu_seqlens", cu_seqlens)))


def _dt_limit_bounds(function, dt_limit):
    """dt_limit's (lo, hi) as Python floats (the library judges them as given: validate_dt_limit)."""
    if not isinstance(dt_limit, (tuple, list)) or len(dt_limit) != 2 or any(v is None for v in dt_limit):
        raise TypeError(f"{function}: dt_limit must be a pair (lo, hi) of numbers, got {dt_limit!r}")
    return float(dt_limit[0]), float(dt_limit[1])


def _int_arg(function, name, value):
    """An integer argument as int (as int() takes it), or TypeError naming it when it is None or text."""
    if value is None or isinstance(value, (str, bytes)):
        raise TypeError(f"{function}: {name} must be an integer, got {value!r}")
    return int(value)


# --- fake kernel -----------------------------------------------------------------------------

def _one_device(function, first, named, whose):
    """The fake kernels serve the Meta dispatch key too, which wins over CPU and CUDA: a meta tensor
    among real ones reaches them, not the C++ kernels and their device check, and would leave its
    outputs unwritten. The same check here, the same ValueError: every tensor on the device of
    `first` (a (name, tensor) pair), as torch's own ops ask."""
    name0, t0 = first
    for name, t in named:
        if isinstance(t, torch.Tensor):
            torch._check_value(t.device == t0.device,
                               lambda: f"{function}: {name} is on {t.device} but {name0} is on {t0.device}; "
                                       f"every tensor must be on {whose} device")


def _default_out(x, check_sizes):
    """The serving functions' default out: contiguous, x's shape and dtype (x may be any view). Only
    if the allocation fails, check_sizes() (the library's size limits, which an x expanded as a view
    can pass beyond) raises the ValueError naming the sizes in place of the allocator's error: a call
    per step on the decode path would cost a dispatch every step. (A compiled graph allocates out
    itself; the op's checks follow.)"""
    if torch.compiler.is_compiling():
        return torch.empty_like(x, memory_format=torch.contiguous_format)
    try:
        return torch.empty_like(x, memory_format=torch.contiguous_format)
    except RuntimeError:
        check_sizes()
        raise


@torch.library.register_fake("mamba2ssd::chunk_scan_fwd")
def _chunk_scan_fwd_fake(x, dt, A, B, C, chunk_size, D, z, dt_bias, initial_states, seq_idx, cu_seqlens,
                         dt_softplus, dt_min, dt_max, return_final_states, return_varlen_states, cuda_path="auto",
                         check_inputs=False, fp32_math="tf32", save_states=False):
    # Outputs as the C++ kernels allocate them: y contiguous in x's dtype, states fp32 (fp64 in a
    # float64 call), and an empty tensor for a state not asked for. Argument checks run when the real
    # kernel runs, and so does check_inputs's validation of the contents (when the compiled graph runs).
    _one_device("mamba_chunk_scan_combined", ("x", x),
               [("dt", dt), ("A", A), ("B", B), ("C", C), ("D", D), ("z", z), ("dt_bias", dt_bias),
                ("initial_states", initial_states), ("seq_idx", seq_idx), ("cu_seqlens", cu_seqlens)], "x's")
    torch._check(x.dim() == 4, lambda: f"mamba_chunk_scan_combined: x must be a 4-d tensor, got {x.dim()}-d")
    torch._check(B.dim() == 4, lambda: f"mamba_chunk_scan_combined: B must be a 4-d tensor, got {B.dim()}-d")
    b, L, H, P = x.shape
    N = B.shape[3]
    y = x.new_empty((b, L, H, P))
    states = torch.float64 if x.dtype == torch.float64 else torch.float32
    final_states = x.new_empty((b, H, P, N) if return_final_states else (0,), dtype=states)
    if return_varlen_states:
        torch._check(cu_seqlens is not None,
                     lambda: "mamba_chunk_scan_combined: return_varlen_states=True needs cu_seqlens")
        varlen_states = x.new_empty((cu_seqlens.shape[0] - 1, H, P, N), dtype=states)
    else:
        varlen_states = x.new_empty((0,), dtype=states)
    torch._check(not save_states or x.device.type == "cuda",
                 lambda: "mamba_chunk_scan_combined: save_states keeps the CUDA forward's states, but x is on "
                         f"{x.device}")
    saved_states = x.new_empty((b, (L + 63) // 64, H, P, N) if save_states else (0,))
    return y, final_states, varlen_states, saved_states


# --- autograd ----------------------------------------------------------------------------------

# chunk_scan_fwd's arguments by position, and the positions of the ones a gradient reaches.
_NUM_ARGS = 21
_GRAD_ARGS = {"x": 0, "dt": 1, "A": 2, "B": 3, "C": 4, "D": 6, "z": 7, "dt_bias": 8, "initial_states": 9}


@torch.library.register_fake("mamba2ssd::chunk_scan_bwd")
def _chunk_scan_bwd_fake(dout, dfinal_states, dvarlen_states, x, dt, A, B, C, chunk_size, D, z, dt_bias,
                         initial_states, seq_idx, cu_seqlens, dt_softplus, dt_min, dt_max, cuda_path="auto",
                         check_inputs=False, saved_states=None):
    # Gradients as the C++ kernels allocate them: contiguous; x's dtype for dx, dB, dC, dz, dt's for ddt,
    # float32 for the rest; in a float64 call everything float64. An absent input's gradient is empty.
    _one_device("mamba_chunk_scan_combined", ("x", x),
               [("dout", dout), ("dfinal_states", dfinal_states), ("dvarlen_states", dvarlen_states), ("dt", dt),
                ("A", A), ("B", B), ("C", C), ("D", D), ("z", z), ("dt_bias", dt_bias),
                ("initial_states", initial_states), ("seq_idx", seq_idx), ("cu_seqlens", cu_seqlens),
                ("saved_states", saved_states)], "x's")
    f64 = x.dtype == torch.float64
    small = torch.float64 if f64 else torch.float32
    b, L, H, P = x.shape
    G, N = B.shape[2], B.shape[3]
    def none():
        return x.new_empty((0,), dtype=small)

    return (
        x.new_empty((b, L, H, P)),
        x.new_empty((b, L, H), dtype=torch.float64 if f64 else dt.dtype),
        x.new_empty((H,), dtype=small),
        x.new_empty((b, L, G, N)),
        x.new_empty((b, L, G, N)),
        x.new_empty(D.shape, dtype=small) if D is not None else none(),
        x.new_empty((b, L, H, P)) if z is not None else none(),
        x.new_empty((H,), dtype=small) if dt_bias is not None else none(),
        x.new_empty((b, H, P, N), dtype=small) if initial_states is not None else none(),
    )


@torch.library.register_fake("mamba2ssd::chunk_scan_bwd_into")
def _chunk_scan_bwd_into_fake(dout, dfinal_states, dvarlen_states, x, dt, A, B, C, chunk_size, D, z, dt_bias,
                              initial_states, seq_idx, cu_seqlens, dt_softplus, dt_min, dt_max, cuda_path, check_inputs,
                              saved_states, dx, ddt, dB, dC, dz):
    # dx, ddt, dB, dC and dz are written in place; the rest as chunk_scan_bwd returns them.
    grads = _chunk_scan_bwd_fake(dout, dfinal_states, dvarlen_states, x, dt, A, B, C, chunk_size, D, z, dt_bias,
                                 initial_states, seq_idx, cu_seqlens, dt_softplus, dt_min, dt_max, cuda_path,
                                 check_inputs, saved_states)
    return grads[2], grads[5], grads[7], grads[8]


def _setup_context(ctx, inputs, output):
    # Inputs, not outputs, are saved: the backward recomputes what it needs of the forward (the
    # library's backward takes the forward's inputs), so nothing of y's size is kept alive; but the
    # states the forward saved for it (save_states: the fourth output, empty otherwise) are kept.
    (x, dt, A, B, C, chunk_size, D, z, dt_bias, initial_states, seq_idx, cu_seqlens, dt_softplus, dt_min, dt_max,
     _return_final_states, _return_varlen_states, cuda_path, check_inputs, _fp32_math, _save_states) = inputs
    saved_states = output[3]
    ctx.mark_non_differentiable(saved_states)
    ctx.save_for_backward(x, dt, A, B, C, D, z, dt_bias, initial_states, seq_idx, cu_seqlens, saved_states)
    # fp32_math is the forward's only: the backward's fp32 products are TF32 whatever it says.
    # check_inputs too: a checked forward gets a checked backward (it reads the same seq_idx and
    # cu_seqlens, which may have changed in place since, or whose forward check ran unread in a graph).
    ctx.options = (chunk_size, dt_softplus, dt_min, dt_max, cuda_path, check_inputs)
    # An output the loss does not use gets None rather than a tensor of zeros: no zeros to allocate,
    # and no state cotangent handed to a backend that may not take one (varlen states).
    ctx.set_materialize_grads(False)


def _backward(ctx, grad_y, grad_final_states, grad_varlen_states, _grad_saved_states):
    x, dt, A, B, C, D, z, dt_bias, initial_states, seq_idx, cu_seqlens, saved_states = ctx.saved_tensors
    chunk_size, dt_softplus, dt_min, dt_max, cuda_path, check_inputs = ctx.options
    if grad_y is None:  # only the states reach the loss
        grad_y = torch.zeros_like(x)
    grads = torch.ops.mamba2ssd.chunk_scan_bwd(
        grad_y, grad_final_states, grad_varlen_states, x, dt, A, B, C, chunk_size, D, z, dt_bias,
        initial_states, seq_idx, cu_seqlens, dt_softplus, dt_min, dt_max, cuda_path, check_inputs,
        saved_states if saved_states.numel() > 0 else None,
    )
    result = [None] * _NUM_ARGS
    inputs = (x, dt, A, B, C, D, z, dt_bias, initial_states)
    for (position, grad), t in zip(zip(_GRAD_ARGS.values(), grads), inputs):
        # The library computes A, D, dt_bias and the states' gradients in float32 (and converts
        # inputs of other dtypes); each gradient goes back in its input's dtype.
        if t is not None and ctx.needs_input_grad[position]:
            result[position] = grad if grad.dtype == t.dtype else grad.to(t.dtype)
    return tuple(result)


torch.library.register_autograd("mamba2ssd::chunk_scan_fwd", _backward, setup_context=_setup_context)


def _no_double_backward(ctx, *grads):
    # Without a formula of its own, chunk_scan_bwd's outputs got torch's fallback under
    # create_graph=True, whose gradients were zeros after a warning: a silently wrong second order.
    raise RuntimeError("mamba_chunk_scan_combined: the backward is not differentiable (no double backward: "
                       "gradients of its gradients, create_graph=True then grad again, are not supported)")


torch.library.register_autograd("mamba2ssd::chunk_scan_bwd", _no_double_backward)
