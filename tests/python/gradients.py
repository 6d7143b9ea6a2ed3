"""Gradients for the tests: the op's (through torch.autograd) and the reference's (torch.autograd
through the float64 recurrence of oracle.py) for the same inputs and cotangents, and their comparison
under mamba2ssd.backward_tolerance()."""

from __future__ import annotations

import torch

import mamba2ssd
from oracle import ssd_oracle
from problems import rel_l2

# The differentiable inputs, in chunk_scan_fwd's order; those whose gradient sums over every token.
GRAD_INPUTS = ("x", "dt", "A", "B", "C", "D", "z", "dt_bias", "initial_states")
SUMS = ("A", "dt_bias", "D")


def grad_names(kw):
    return [k for k in GRAD_INPUTS if kw.get(k) is not None]


def cotangents(kw, final=True, varlen=False, seed=1):
    """Random cotangents for y (and final_states, varlen_states), float64 on the CPU, each holding
    values of its output's dtype: autograd hands the op dout in y's dtype, so a cotangent finer than
    that would measure the rounding of dout, not the backward."""
    g = torch.Generator().manual_seed(seed)
    b, L, H, P = kw["x"].shape
    N = kw["B"].shape[3]
    states = torch.float64 if kw["x"].dtype == torch.float64 else torch.float32

    def draw(*shape, dtype):
        return torch.randn(*shape, generator=g, dtype=torch.float64).to(dtype).to(torch.float64)

    out = {"y": draw(b, L, H, P, dtype=kw["x"].dtype)}
    if final:
        out["final_states"] = draw(b, H, P, N, dtype=states)
    if varlen:
        out["varlen_states"] = draw(kw["cu_seqlens"].shape[0] - 1, H, P, N, dtype=states)
    return out


def _loss(outputs, cots):
    """sum(cotangent * output) over the outputs that have a cotangent."""
    return sum((out.to(torch.float64) * cots[name].to(out.device)).sum() for name, out in outputs.items()
               if name in cots)


def op_gradients(kw, cots, fn=None, **flags):
    """The op's (or fn's, with the same arguments: mamba_ssm's) gradients with respect to every given
    floating input, by name."""
    fn = fn or mamba2ssd.mamba_chunk_scan_combined
    leaves = {k: kw[k].detach().clone().requires_grad_(True) for k in grad_names(kw)}
    args = dict(kw, **leaves)
    final, varlen = "final_states" in cots, "varlen_states" in cots
    out = fn(**args, return_final_states=final, return_varlen_states=varlen, **flags)
    out = out if isinstance(out, tuple) else (out,)
    names = ["y"] + (["final_states"] if final else []) + (["varlen_states"] if varlen else [])
    grads = torch.autograd.grad(_loss(dict(zip(names, out)), cots), list(leaves.values()))
    return dict(zip(leaves, grads))


def reference_gradients(kw, cots):
    """torch.autograd through the float64 recurrence: the same gradients, float64 on the CPU."""
    leaves = {k: kw[k].detach().to("cpu", torch.float64).requires_grad_(True) for k in grad_names(kw)}
    args = {k: v for k, v in dict(kw, **leaves).items() if k != "chunk_size"}
    y, final_states, varlen_states = ssd_oracle(**args, differentiable=True)
    outputs = {"y": y, "final_states": final_states}
    if varlen_states is not None:
        outputs["varlen_states"] = varlen_states
    grads = torch.autograd.grad(_loss(outputs, cots), list(leaves.values()), allow_unused=True)
    return {k: (g if g is not None else torch.zeros_like(leaves[k])) for k, g in zip(leaves, grads)}


def assert_gradients_close(got, want, dtype, factor=1.0):
    """Every gradient in `got` within backward_tolerance(dtype) * factor of `want` (the sums' bar for
    A, dt_bias, D), relative L2; returns the errors by name."""
    assert set(got) == set(want), (sorted(got), sorted(want))
    errors = {}
    for name in got:
        tol = mamba2ssd.backward_tolerance(dtype, sum=name in SUMS) * factor
        g, w = got[name], want[name]
        assert g.shape == w.shape, f"d{name}: shape {tuple(g.shape)}, expected {tuple(w.shape)}"
        assert torch.isfinite(g).all(), f"d{name}: non-finite values"
        errors[name] = rel_l2(g, w) if w.norm() > 0 else g.detach().abs().max().item()
        assert errors[name] <= tol, f"d{name}: relative L2 error {errors[name]:.3g} > tolerance {tol:.3g} ({dtype})"
    return errors


def check_gradients(kw, cots, dtype, factor=1.0):
    """The op's gradients against the float64 recurrence's. A backend that refuses gradients through
    varlen states (the CUDA backward, today) must say so with a ValueError naming dvarlen_states;
    the rest is then checked without that cotangent."""
    if "varlen_states" in cots:
        try:
            got = op_gradients(kw, cots)
            return assert_gradients_close(got, reference_gradients(kw, cots), dtype, factor)
        except ValueError as e:
            assert "dvarlen_states" in str(e), str(e)
            cots = {k: v for k, v in cots.items() if k != "varlen_states"}
    return assert_gradients_close(op_gradients(kw, cots), reference_gradients(kw, cots), dtype, factor)
