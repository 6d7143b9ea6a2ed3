"""Test problems for the Python tests: random inputs for mamba_chunk_scan_combined, the devices to
run on, and the comparison with the fp64 oracle under mamba2ssd.tolerance()."""

from __future__ import annotations

import pytest
import torch

import mamba2ssd
from oracle import ssd_oracle

HAS_GPU = torch.cuda.is_available()
requires_cuda = pytest.mark.skipif(not HAS_GPU, reason="no CUDA device")
requires_cuda_backend = pytest.mark.skipif(
    not HAS_GPU or not mamba2ssd.has_cuda_backend(),
    reason="no CUDA device" if not HAS_GPU else "mamba2ssd was built without the CUDA backend",
)

# Every test that takes `device` runs on the CPU and, where there is one, on the GPU.
DEVICES = ["cpu", pytest.param("cuda", marks=requires_cuda_backend)]

DTYPES = [torch.float32, torch.float16, torch.bfloat16]


def packed_ids(seqlens, device="cpu"):
    """seq_idx row [sum(seqlens)] int32 and cu_seqlens [S + 1] int32 for sequence lengths."""
    cu = [0]
    for n in seqlens:
        cu.append(cu[-1] + n)
    ids = torch.repeat_interleave(torch.arange(len(seqlens), dtype=torch.int32), torch.tensor(seqlens))
    return ids.to(device), torch.tensor(cu, dtype=torch.int32, device=device)


def make_problem(b=2, L=160, H=4, P=32, G=2, N=16, chunk_size=64, dtype=torch.float32, dt_dtype=None,
                 device="cpu", D=None, z=False, dt_bias=False, dt_softplus=False, dt_limit=None,
                 initial_states=False, seqlens=None, seq_idx=False, cu_seqlens=False, seed=0):
    """Keyword arguments for mamba_chunk_scan_combined (no return_* flags).

    D: None, "head" ([H]) or "dim" ([H, P]). seqlens: packed sequence lengths summing to L; with
    seq_idx=True every batch row gets those sequences (row r rotated by r); with cu_seqlens=True
    (b must be 1) cu_seqlens holds their offsets.
    """
    g = torch.Generator().manual_seed(seed)

    def randn(*shape):
        return torch.randn(*shape, generator=g)

    def uniform(lo, hi, *shape):
        return lo + (hi - lo) * torch.rand(*shape, generator=g)

    kw = dict(chunk_size=chunk_size)
    kw["x"] = randn(b, L, H, P).to(dtype)
    # Step sizes around Mamba's (0.001 .. 0.1); raw values below softplus's knee when it is used.
    kw["dt"] = (randn(b, L, H) * 0.5 - 3.0 if dt_softplus else uniform(0.005, 0.1, b, L, H)).to(dt_dtype or torch.float32)
    kw["A"] = -uniform(0.05, 2.0, H)  # decays that reach across chunks and ones that do not
    kw["B"] = randn(b, L, G, N).to(dtype)
    kw["C"] = randn(b, L, G, N).to(dtype)
    if D == "head":
        kw["D"] = randn(H)
    elif D == "dim":
        kw["D"] = randn(H, P)
    if z:
        kw["z"] = randn(b, L, H, P).to(dtype)
    if dt_bias:
        kw["dt_bias"] = randn(H) * 0.5 if dt_softplus else uniform(0.0, 0.05, H)
    if dt_softplus:
        kw["dt_softplus"] = True
    if dt_limit is not None:
        kw["dt_limit"] = dt_limit
    if initial_states:
        kw["initial_states"] = randn(b, H, P, N)
    if seqlens is not None:
        assert sum(seqlens) == L, (seqlens, L)
        if seq_idx:
            rows = [packed_ids(seqlens[r % len(seqlens):] + seqlens[:r % len(seqlens)])[0] for r in range(b)]
            # Rotating the lengths keeps the ids non-decreasing per row (ids restart at 0 in row order).
            kw["seq_idx"] = torch.stack(rows)
        if cu_seqlens:
            assert b == 1, "cu_seqlens packs sequences into one batch row"
            kw["cu_seqlens"] = packed_ids(seqlens)[1]
    return {k: (v.to(device) if isinstance(v, torch.Tensor) else v) for k, v in kw.items()}


def oracle(kw):
    """The oracle's (y, final_states, varlen_states) for make_problem's arguments."""
    args = {k: v for k, v in kw.items() if k != "chunk_size"}
    return ssd_oracle(**args)


def rel_l2(out, ref):
    out = out.detach().to("cpu", torch.float64)
    return ((out - ref).norm() / ref.norm()).item()


def assert_close(out, ref, dtype, what="y", factor=1.0):
    """out (any device, any dtype) within tolerance(dtype) * factor of the fp64 ref, relative L2."""
    assert out.shape == ref.shape, f"{what}: shape {tuple(out.shape)}, expected {tuple(ref.shape)}"
    assert torch.isfinite(out).all(), f"{what}: non-finite values"
    tol = mamba2ssd.tolerance(dtype) * factor
    err = rel_l2(out, ref)
    assert err <= tol, f"{what}: relative L2 error {err:.3g} > tolerance {tol:.3g} ({dtype})"
    return err


def run_and_check(kw, return_final_states=True, return_varlen_states=False):
    """Runs mamba_chunk_scan_combined on kw, checks every output against the oracle."""
    out = mamba2ssd.mamba_chunk_scan_combined(**kw, return_final_states=return_final_states,
                                              return_varlen_states=return_varlen_states)
    out = out if isinstance(out, tuple) else (out,)
    y_ref, final_ref, varlen_ref = oracle(kw)
    dtype = kw["x"].dtype
    assert out[0].dtype == dtype and out[0].device == kw["x"].device
    assert_close(out[0], y_ref, dtype, "y")
    rest = list(out[1:])
    if return_final_states:
        fs = rest.pop(0)
        assert fs.dtype == torch.float32
        assert_close(fs, final_ref, dtype, "final_states")
    if return_varlen_states:
        vs = rest.pop(0)
        assert vs.dtype == torch.float32
        assert_close(vs, varlen_ref, dtype, "varlen_states")
    return out
