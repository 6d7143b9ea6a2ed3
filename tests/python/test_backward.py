"""Forward only: backward raises NotImplementedError, in eager mode and under torch.compile, and
only when a backward actually runs."""

import pytest
import torch

import mamba2ssd
from problems import DEVICES, make_problem

MESSAGE = r"mamba2ssd\.mamba_chunk_scan_combined has no backward"


def call(kw, **flags):
    return mamba2ssd.mamba_chunk_scan_combined(**kw, **flags)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("wants_grad", [("x",), ("dt", "A"), ("B", "C", "D", "z", "dt_bias", "initial_states")])
def test_backward_raises(device, wants_grad):
    kw = make_problem(device=device, D="head", z=True, dt_bias=True, initial_states=True)
    for name in wants_grad:
        kw[name].requires_grad_(True)
    y = call(kw)
    assert y.requires_grad
    with pytest.raises(NotImplementedError, match=MESSAGE):
        y.sum().backward()


@pytest.mark.parametrize("device", DEVICES)
def test_backward_through_final_states_raises(device):
    kw = make_problem(device=device)
    kw["x"].requires_grad_(True)
    _, final_states = call(kw, return_final_states=True)
    with pytest.raises(NotImplementedError, match=MESSAGE):
        final_states.sum().backward()


@pytest.mark.parametrize("device", DEVICES)
def test_forward_with_grad_inputs_matches_no_grad(device):
    kw = make_problem(device=device)
    y_plain = call(kw)
    kw["x"].requires_grad_(True)
    torch.testing.assert_close(call(kw).detach(), y_plain, rtol=0, atol=0)
    with torch.no_grad():
        torch.testing.assert_close(call(kw), y_plain, rtol=0, atol=0)


@pytest.mark.parametrize("device", DEVICES)
def test_compiled_backward_raises(device):
    torch._dynamo.reset()
    kw = make_problem(device=device, D="head")
    y_plain = call(kw)
    kw["x"].requires_grad_(True)

    @torch.compile(fullgraph=True)
    def fn(x, dt, A, B, C, D):
        return mamba2ssd.mamba_chunk_scan_combined(x, dt, A, B, C, 64, D=D) * 2.0

    y = fn(kw["x"], kw["dt"], kw["A"], kw["B"], kw["C"], kw["D"])  # compiles forward and backward
    torch.testing.assert_close(y.detach(), 2.0 * y_plain, rtol=0, atol=0)
    with pytest.raises(NotImplementedError, match=MESSAGE):
        y.sum().backward()
    torch._dynamo.reset()
