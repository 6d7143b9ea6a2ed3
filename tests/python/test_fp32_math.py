"""The fp32_math keyword of mamba_chunk_scan_combined: "tf32" (the default) or "accurate" (3xTF32
products on CUDA). Refused strings raise ValueError naming it; the CPU and 16-bit inputs ignore it;
on CUDA "accurate" is nearer the oracle than "tf32" and within its own, tighter bar; the op keeps
working under torch.compile and opcheck with it."""

import pytest
import torch

import mamba2ssd
from problems import DEVICES, make_problem, oracle, rel_l2, requires_cuda_backend

f = mamba2ssd.mamba_chunk_scan_combined


@pytest.mark.parametrize("device", DEVICES)
def test_bad_value_raises_value_error_naming_it(device):
    kw = make_problem(device=device)
    for bad in ("fast", "TF32", ""):
        with pytest.raises(ValueError, match=rf"fp32_math must be one of tf32, accurate, got '{bad}'"):
            f(**kw, fp32_math=bad)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_both_values_accepted(device, dtype):
    kw = make_problem(device=device, dtype=dtype, z=True, initial_states=True)
    y_ref, final_ref, _ = oracle(kw)
    for math in ("tf32", "accurate"):
        y, final_states = f(**kw, return_final_states=True, fp32_math=math)
        assert rel_l2(y, y_ref) <= mamba2ssd.tolerance(dtype, math), math
        assert rel_l2(final_states, final_ref) <= mamba2ssd.tolerance(dtype, math), math


def test_cpu_ignores_it():
    # The CPU backend's arithmetic is fp32 (no TF32): the same bits either way.
    kw = make_problem(z=True, initial_states=True)
    torch.testing.assert_close(f(**kw, fp32_math="accurate"), f(**kw), rtol=0, atol=0)


def test_tolerance_table():
    # The accurate bar is float32's only, and tighter than TF32's.
    assert mamba2ssd.tolerance(torch.float32, "accurate") < mamba2ssd.tolerance(torch.float32) / 10
    assert mamba2ssd.tolerance(torch.float32, "tf32") == mamba2ssd.tolerance(torch.float32)
    for t in (torch.float16, torch.bfloat16, torch.float64):
        assert mamba2ssd.tolerance(t, "accurate") == mamba2ssd.tolerance(t)
    with pytest.raises(ValueError, match=r"fp32_math must be one of tf32, accurate, got 'fast'"):
        mamba2ssd.tolerance(torch.float32, "fast")


@requires_cuda_backend
@pytest.mark.parametrize("cuda_path", ["three-kernel", "fused"])
def test_cuda_accurate_is_nearer_the_oracle(cuda_path):
    # 3xTF32 within its bar, TF32 farther and outside it, on each path.
    kw = make_problem(device="cuda", P=64, N=64, L=300, z=True, initial_states=True, seed=3)
    y_ref, final_ref, _ = oracle(kw)
    errs = {}
    for math in ("tf32", "accurate"):
        y, final_states = f(**kw, return_final_states=True, cuda_path=cuda_path, fp32_math=math)
        errs[math] = (rel_l2(y, y_ref), rel_l2(final_states, final_ref))
    bar = mamba2ssd.tolerance(torch.float32, "accurate")
    for i, what in enumerate(("y", "final_states")):
        assert errs["accurate"][i] <= bar, (what, errs)
        assert errs["tf32"][i] > bar, (what, errs)
        assert 4 * errs["accurate"][i] < errs["tf32"][i], (what, errs)


@pytest.fixture
def fresh_dynamo():
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


@pytest.mark.parametrize("device", DEVICES)
def test_compile_fullgraph_with_it(device, fresh_dynamo):
    kw = make_problem(device=device, P=64, z=True)

    def fn(x, dt, A, B, C, z):
        return f(x, dt, A, B, C, 64, z=z, fp32_math="accurate")

    args = [kw[k] for k in ("x", "dt", "A", "B", "C", "z")]
    torch.testing.assert_close(torch.compile(fn, fullgraph=True)(*args), fn(*args), rtol=0, atol=0)


@pytest.mark.parametrize("device", DEVICES)
def test_opcheck_with_it(device):
    kw = make_problem(device=device, z=True, initial_states=True)
    args = (kw["x"], kw["dt"], kw["A"], kw["B"], kw["C"], 64, None, kw["z"], None, kw["initial_states"], None, None,
            False, 0.0, float("inf"), True, False, "auto", False, "accurate")
    torch.library.opcheck(torch.ops.mamba2ssd.chunk_scan_fwd.default, args,
                          test_utils=("test_schema", "test_autograd_registration", "test_faketensor",
                                      "test_aot_dispatch_dynamic"))
    grad_args = tuple(a.detach().clone().requires_grad_(True) if isinstance(a, torch.Tensor) and a.is_floating_point()
                      else a for a in args)
    torch.library.opcheck(torch.ops.mamba2ssd.chunk_scan_fwd.default, grad_args,
                          test_utils=("test_autograd_registration", "test_aot_dispatch_dynamic"))
