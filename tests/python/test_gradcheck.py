"""torch.autograd.gradcheck of the op in float64 on the CPU, where it runs the exact fp64 oracle
(forward_reference, backward_reference): the backward's analytical Jacobian against central finite
differences of the forward, with every feature, through y and the states."""

import pytest
import torch

import mamba2ssd
from gradients import grad_names
from problems import make_problem

# Small problems: gradcheck perturbs every input element and runs a backward per output element.
BASE = dict(b=2, L=12, H=2, P=32, G=1, N=16, chunk_size=64, dtype=torch.float64)
CASES = {
    "plain": dict(),
    "z_D_head": dict(z=True, D="head"),
    "D_dim": dict(D="dim"),
    "dt_bias_softplus": dict(dt_bias=True, dt_softplus=True),
    # Bounds that clamp some tokens; make_problem's steps stay clear of the bounds by far more than
    # gradcheck's eps, so each token is on one side of its bound for both perturbations.
    "dt_limit": dict(dt_limit=(0.03, 0.07)),
    "initial_states": dict(initial_states=True),
    "groups": dict(H=4, G=2),
    "seq_idx": dict(L=12, seqlens=[5, 7], seq_idx=True, initial_states=True),
    "cu_seqlens_varlen": dict(b=1, seqlens=[4, 0, 8], cu_seqlens=True, initial_states=True, varlen=True),
    "everything": dict(b=1, L=16, H=4, G=2, z=True, D="dim", dt_bias=True, dt_softplus=True, dt_limit=(0.0, 0.2),
                       initial_states=True, seqlens=[6, 10], seq_idx=True, cu_seqlens=True, varlen=True),
}


def float64_problem(spec):
    spec = dict(BASE, **spec)
    varlen = spec.pop("varlen", False)
    kw = make_problem(**spec)
    for k in grad_names(kw):  # A, D, dt_bias, dt, initial_states come as float32
        kw[k] = kw[k].double()
    return kw, varlen


def clear_of_bounds(kw, lo, hi, margin=1e-4):
    """True when no processed step lies within margin of a clamp bound (finite differences there
    would straddle the kink)."""
    d = kw["dt"] + (kw["dt_bias"] if kw.get("dt_bias") is not None else 0.0)
    if kw.get("dt_softplus"):
        d = torch.nn.functional.softplus(d)
    return bool(((d - lo).abs() > margin).all() and ((d - hi).abs() > margin).all())


@pytest.mark.parametrize("case", list(CASES))
def test_gradcheck(case):
    kw, varlen = float64_problem(CASES[case])
    if "dt_limit" in kw:
        assert clear_of_bounds(kw, *kw["dt_limit"]), "move the bounds away from the steps"
    names = grad_names(kw)

    def fn(*tensors):
        out = mamba2ssd.mamba_chunk_scan_combined(**dict(kw, **dict(zip(names, tensors))), return_final_states=True,
                                                  return_varlen_states=varlen)
        return out

    inputs = tuple(kw[k].detach().clone().requires_grad_(True) for k in names)
    # fast_mode: the Jacobian against random vectors on both sides, not element by element (the
    # full Jacobian of the larger cases would take minutes); "plain" runs in full below.
    assert torch.autograd.gradcheck(fn, inputs, eps=1e-6, atol=1e-7, rtol=1e-5, fast_mode=True)


def test_gradcheck_full_jacobian():
    kw, _ = float64_problem(dict(b=1, L=6, D="head", z=True, initial_states=True))
    names = grad_names(kw)

    def fn(*tensors):
        return mamba2ssd.mamba_chunk_scan_combined(**dict(kw, **dict(zip(names, tensors))), return_final_states=True)

    inputs = tuple(kw[k].detach().clone().requires_grad_(True) for k in names)
    assert torch.autograd.gradcheck(fn, inputs, eps=1e-6, atol=1e-7, rtol=1e-5)


def test_gradcheck_catches_a_wrong_gradient():
    # The check can fail: the same op with its dx scaled by 1 + 1e-3 does not pass.
    kw, _ = float64_problem(dict(b=1, L=6))

    class Scaled(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            return x.view_as(x)

        @staticmethod
        def backward(ctx, g):
            return g * (1 + 1e-3)

    def fn(x):
        return mamba2ssd.mamba_chunk_scan_combined(**dict(kw, x=Scaled.apply(x)))

    x = kw["x"].detach().clone().requires_grad_(True)
    assert not torch.autograd.gradcheck(fn, (x,), eps=1e-6, atol=1e-7, rtol=1e-5, raise_exception=False,
                                        fast_mode=True)
