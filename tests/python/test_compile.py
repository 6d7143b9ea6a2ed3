"""The op under torch.compile(fullgraph=True), and torch.library.opcheck of its registrations."""

import pytest
import torch

import mamba2ssd
from problems import DEVICES, make_problem, oracle, assert_close


@pytest.fixture(autouse=True)
def fresh_dynamo():
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("returns", ["y", "final", "varlen", "both"])
def test_compile_fullgraph(device, returns):
    kw = make_problem(b=1, device=device, z=True, D="head", dt_softplus=True, dt_bias=True, dt_limit=(0.0, 0.3),
                      initial_states=True, seqlens=[60, 100], cu_seqlens=True)
    flags = dict(return_final_states=returns in ("final", "both"), return_varlen_states=returns in ("varlen", "both"))

    def fn(x, dt, A, B, C, D, z, dt_bias, initial_states, cu_seqlens):
        out = mamba2ssd.mamba_chunk_scan_combined(
            x, dt, A, B, C, 64, D=D, z=z, dt_bias=dt_bias, initial_states=initial_states, cu_seqlens=cu_seqlens,
            dt_softplus=True, dt_limit=(0.0, 0.3), **flags)
        return out

    args = [kw[k] for k in ("x", "dt", "A", "B", "C", "D", "z", "dt_bias", "initial_states", "cu_seqlens")]
    eager = fn(*args)
    compiled = torch.compile(fn, fullgraph=True)(*args)
    eager = eager if isinstance(eager, tuple) else (eager,)
    compiled = compiled if isinstance(compiled, tuple) else (compiled,)
    assert len(eager) == len(compiled) == 1 + flags["return_final_states"] + flags["return_varlen_states"]
    for e, c in zip(eager, compiled):
        assert e.shape == c.shape and e.dtype == c.dtype
        torch.testing.assert_close(c, e, rtol=0, atol=0)
    y_ref, _, _ = oracle(kw)
    assert_close(compiled[0], y_ref, kw["x"].dtype)


@pytest.mark.parametrize("device", DEVICES)
def test_compile_with_surrounding_ops_and_dynamic_shapes(device):
    # The op inside a larger graph (gating and a projection around it), recompiled for a new length.
    def fn(x, dt, A, B, C):
        y = mamba2ssd.mamba_chunk_scan_combined(x * 0.5, torch.nn.functional.softplus(dt), A, B, C, 64)
        return y.sum(dim=-1)

    compiled = torch.compile(fn, fullgraph=True, dynamic=True)
    for L in (96, 130):
        kw = make_problem(L=L, device=device, seed=L)
        args = [kw[k] for k in ("x", "dt", "A", "B", "C")]
        torch.testing.assert_close(compiled(*args), fn(*args), rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("case", ["plain", "everything"])
def test_opcheck(device, case):
    if case == "plain":
        kw = make_problem(device=device)
        args = (kw["x"], kw["dt"], kw["A"], kw["B"], kw["C"], 64, None, None, None, None, None, None,
                False, 0.0, float("inf"), False, False)
    else:
        kw = make_problem(b=1, device=device, z=True, D="dim", dt_bias=True, dt_softplus=True,
                          initial_states=True, seqlens=[60, 100], seq_idx=True, cu_seqlens=True)
        args = (kw["x"], kw["dt"], kw["A"], kw["B"], kw["C"], 64, kw["D"], kw["z"], kw["dt_bias"],
                kw["initial_states"], kw["seq_idx"], kw["cu_seqlens"], True, 0.0, 0.5, True, True)
    torch.library.opcheck(torch.ops.mamba2ssd.chunk_scan_fwd.default, args,
                          test_utils=("test_schema", "test_autograd_registration", "test_faketensor",
                                      "test_aot_dispatch_dynamic"))
    # With inputs that want gradients: the autograd registration and the traced backward. (The CUDA
    # backward refuses a varlen states' cotangent, test_backward_errors.py: there without them.)
    if device == "cuda" and case == "everything":
        args = args[:-1] + (False,)
    grad_args = tuple(a.detach().clone().requires_grad_(True) if isinstance(a, torch.Tensor) and a.is_floating_point()
                      else a for a in args)
    torch.library.opcheck(torch.ops.mamba2ssd.chunk_scan_fwd.default, grad_args,
                          test_utils=("test_autograd_registration", "test_aot_dispatch_dynamic"))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("case", ["plain", "everything"])
def test_opcheck_backward(device, case):
    if case == "plain":
        kw = make_problem(device=device)
        fwd = (kw["x"], kw["dt"], kw["A"], kw["B"], kw["C"], 64, None, None, None, None, None, None, False, 0.0,
               float("inf"))
        cotangents = (torch.randn_like(kw["x"]), None, None)
    else:
        kw = make_problem(b=1, device=device, z=True, D="dim", dt_bias=True, dt_softplus=True,
                          initial_states=True, seqlens=[60, 100], seq_idx=True, cu_seqlens=True)
        fwd = (kw["x"], kw["dt"], kw["A"], kw["B"], kw["C"], 64, kw["D"], kw["z"], kw["dt_bias"],
               kw["initial_states"], kw["seq_idx"], kw["cu_seqlens"], True, 0.0, 0.5)
        b, L, H, P = kw["x"].shape
        N = kw["B"].shape[3]
        # The CUDA backward refuses a varlen states' cotangent (test_backward_errors.py): CPU only.
        cotangents = (torch.randn_like(kw["x"]), torch.randn(b, H, P, N, device=device),
                      torch.randn(2, H, P, N, device=device) if device == "cpu" else None)
    torch.library.opcheck(torch.ops.mamba2ssd.chunk_scan_bwd.default, cotangents + fwd,
                          test_utils=("test_schema", "test_faketensor", "test_aot_dispatch_dynamic"))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dynamic", [False, True])
def test_compile_forward_and_backward(device, dynamic):
    # The op inside a compiled loss (a scaling and a loss around it); AOTAutograd compiles the backward
    # graph, with chunk_scan_bwd in it, which loss.backward() then runs. The gradients equal eager ones.
    kw = make_problem(b=1, device=device, z=True, D="head", dt_bias=True, dt_softplus=True, dt_limit=(0.0, 0.3),
                      initial_states=True, seqlens=[60, 100], cu_seqlens=True)
    names = ("x", "dt", "A", "B", "C", "D", "z", "dt_bias", "initial_states")
    through_varlen = device == "cpu"  # the CUDA backward refuses them (test_backward_errors.py)

    def step(x, dt, A, B, C, D, z, dt_bias, initial_states, cu_seqlens):
        y, final_states, varlen_states = mamba2ssd.mamba_chunk_scan_combined(
            x * 0.5, dt, A, B, C, 64, D=D, z=z, dt_bias=dt_bias, initial_states=initial_states,
            cu_seqlens=cu_seqlens, dt_softplus=True, dt_limit=(0.0, 0.3), return_final_states=True,
            return_varlen_states=True)
        return (y * y).sum() + final_states.sum() + ((varlen_states ** 2).sum() if through_varlen else 0.0)

    def gradients(fn):
        leaves = [kw[k].detach().clone().requires_grad_(True) for k in names]
        loss = fn(*leaves, kw["cu_seqlens"])
        loss.backward()
        return loss, [t.grad for t in leaves]

    loss_eager, grads_eager = gradients(step)
    loss_compiled, grads_compiled = gradients(torch.compile(step, fullgraph=True, dynamic=dynamic))
    torch.testing.assert_close(loss_compiled, loss_eager, rtol=1e-5, atol=0)
    for name, e, c in zip(names, grads_eager, grads_compiled):
        assert c is not None, f"d{name} missing"
        assert c.dtype == e.dtype and c.shape == e.shape, name
        torch.testing.assert_close(c, e, rtol=1e-5, atol=1e-6, msg=f"d{name}")
