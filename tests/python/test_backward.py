"""The op's gradients (autograd) against torch.autograd through the float64 recurrence, for every
feature, on the CPU and (where there is one) the GPU; which gradients come back, and in which dtype."""

import pytest
import torch

import mamba2ssd
from gradients import assert_gradients_close, check_gradients, cotangents, op_gradients, reference_gradients
from problems import DEVICES, DTYPES, make_problem, oracle

# Every feature on its own, then together. final/varlen: which states the loss reaches.
CASES = {
    "plain": dict(),
    "z": dict(z=True),
    "D_head": dict(D="head"),
    "D_dim": dict(D="dim"),
    "dt_bias_softplus": dict(dt_bias=True, dt_softplus=True),
    # Bounds that clamp a share of the tokens at both ends (zero gradient there).
    "dt_limit": dict(dt_limit=(0.02, 0.08)),
    "dt_limit_softplus": dict(dt_bias=True, dt_softplus=True, dt_limit=(0.03, 0.1)),
    "initial_states": dict(initial_states=True),
    "no_final_states": dict(final=False),
    "groups": dict(H=6, G=3),
    "one_group": dict(H=4, G=1),
    "seq_idx": dict(seqlens=[50, 1, 45, 64], seq_idx=True),
    "seq_idx_initial": dict(seqlens=[100, 60], seq_idx=True, initial_states=True),
    "cu_seqlens": dict(b=1, seqlens=[37, 90, 33], cu_seqlens=True),
    "varlen_states": dict(b=1, seqlens=[37, 0, 90, 33], cu_seqlens=True, varlen=True, initial_states=True),
    "everything": dict(b=1, z=True, D="dim", dt_bias=True, dt_softplus=True, dt_limit=(0.0, 0.2),
                       initial_states=True, seqlens=[64, 30, 66], seq_idx=True, cu_seqlens=True, varlen=True),
}


def case_problem(case, **extra):
    spec = dict(CASES[case], **extra)
    final, varlen = spec.pop("final", True), spec.pop("varlen", False)
    kw = make_problem(**spec)
    return kw, cotangents(kw, final=final, varlen=varlen)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("case", list(CASES))
def test_gradients_match_float64_recurrence(device, case):
    kw, cots = case_problem(case, device=device)
    check_gradients(kw, cots, kw["x"].dtype)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("chunk_size", [64, 128, 256])
def test_gradients_every_dtype_and_chunk(device, dtype, chunk_size):
    kw, cots = case_problem("everything", device=device, dtype=dtype, chunk_size=chunk_size, L=300,
                            seqlens=[100, 130, 70])
    check_gradients(kw, cots, dtype)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("P,N", [(64, 64), (128, 128), (64, 256), (80, 128)])
def test_gradients_head_dims_and_state_sizes(device, P, N):
    kw, cots = case_problem("everything", device=device, dtype=torch.bfloat16, P=P, N=N, H=2, G=1)
    check_gradients(kw, cots, torch.bfloat16)


def test_float64_gradients_are_the_oracles():
    # float64 runs the C++ oracle, forward and backward: the same numbers as torch.autograd through
    # the Python recurrence up to summation order.
    # The clamp's upper bound is one fp32 holds exactly: the library keeps dt_limit as float, so 0.2
    # would clamp to 0.2f, a different function in the 8th digit.
    kw, cots = case_problem("everything", dtype=torch.float64, dt_limit=(0.0, 0.125))
    for k in ("A", "dt", "D", "dt_bias", "initial_states"):
        kw[k] = kw[k].double()
    y, final_states, varlen_states = mamba2ssd.mamba_chunk_scan_combined(**kw, return_final_states=True,
                                                                         return_varlen_states=True)
    for out, ref in zip((y, final_states, varlen_states), oracle(kw)):
        assert out.dtype == torch.float64
        torch.testing.assert_close(out, ref, rtol=1e-12, atol=1e-12)
    got, want = op_gradients(kw, cots), reference_gradients(kw, cots)
    for name in got:
        assert got[name].dtype == torch.float64
        torch.testing.assert_close(got[name], want[name], rtol=1e-10, atol=1e-10, msg=f"d{name}")


@pytest.mark.parametrize("device", DEVICES)
def test_only_the_states_reach_the_loss(device):
    # y unused: its cotangent is None (zeros for the backend), the gradient flows from final_states.
    kw, cots = case_problem("initial_states", device=device)
    cots["y"] = torch.zeros_like(cots["y"])
    want = reference_gradients(kw, cots)
    x = kw["x"].detach().clone().requires_grad_(True)
    h0 = kw["initial_states"].detach().clone().requires_grad_(True)
    _, final_states = mamba2ssd.mamba_chunk_scan_combined(**dict(kw, x=x, initial_states=h0),
                                                          return_final_states=True)
    (final_states.double() * cots["final_states"].to(device)).sum().backward()
    assert_gradients_close({"x": x.grad, "initial_states": h0.grad},
                           {"x": want["x"], "initial_states": want["initial_states"]}, kw["x"].dtype)


@pytest.mark.parametrize("device", DEVICES)
def test_gradients_only_where_asked_and_in_the_inputs_dtypes(device):
    kw = make_problem(device=device, dtype=torch.bfloat16, D="head", dt_bias=True, initial_states=True)
    kw["A"] = kw["A"].double().requires_grad_(True)                       # converted to fp32 inside
    kw["initial_states"] = kw["initial_states"].bfloat16().requires_grad_(True)
    kw["dt"] = kw["dt"].half().requires_grad_(True)
    y = mamba2ssd.mamba_chunk_scan_combined(**kw)
    y.float().sum().backward()
    assert kw["A"].grad.dtype == torch.float64
    assert kw["initial_states"].grad.dtype == torch.bfloat16
    assert kw["dt"].grad.dtype == torch.float16
    for name in ("x", "B", "C", "D", "dt_bias"):
        assert kw[name].grad is None, name  # no requires_grad, no gradient


@pytest.mark.parametrize("device", DEVICES)
def test_gradients_accumulate_across_calls(device):
    # Two calls on the same leaf: autograd sums their gradients (the op returns fresh tensors each time).
    kw, cots = case_problem("z", device=device)
    once = op_gradients(kw, cots)["x"]
    x = kw["x"].detach().clone().requires_grad_(True)
    for _ in range(2):
        y, final_states = mamba2ssd.mamba_chunk_scan_combined(**dict(kw, x=x), return_final_states=True)
        ((y.double() * cots["y"].to(device)).sum() + (final_states.double() * cots["final_states"].to(device)).sum()
         ).backward()
    torch.testing.assert_close(x.grad, 2 * once, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("device", DEVICES)
def test_no_grad_forward_saves_nothing(device):
    kw = make_problem(device=device)
    kw["x"].requires_grad_(True)
    with torch.no_grad():
        y = mamba2ssd.mamba_chunk_scan_combined(**kw)
    assert not y.requires_grad and y.grad_fn is None


def test_cpu_gradients_are_deterministic():
    kw, cots = case_problem("everything", dtype=torch.bfloat16)
    first, second = op_gradients(kw, cots), op_gradients(kw, cots)
    for name in first:
        assert torch.equal(first[name], second[name]), f"d{name} differs between two runs"
