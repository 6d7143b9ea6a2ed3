"""save_states: the CUDA forward keeps the states its backward reads (ForwardParams::saved_states)
instead of the backward walking the sequence again for them. The gradients are the same function:
against the float64 recurrence with and without it, on the hopper walk that saves them as it goes
(head dim 64, 16-bit) and on the walk of their own elsewhere (fp32, head dim 32), under
torch.compile(fullgraph=True) too. On the CPU the flag changes nothing; the op itself refuses it for
CPU tensors, naming it."""

import pytest
import torch

import mamba2ssd
from gradients import assert_gradients_close, cotangents, op_gradients, reference_gradients
from problems import DEVICES, make_problem, requires_cuda_backend

CASES = {
    "hopper_walk": dict(b=2, L=300, H=4, P=64, G=2, N=128, chunk_size=128, dtype=torch.bfloat16, D="head", z=True,
                        dt_bias=True, dt_softplus=True, initial_states=True),
    "own_walk_fp32": dict(b=2, L=200, H=4, P=32, G=2, N=32, dtype=torch.float32, D="dim", initial_states=True),
    "packed": dict(b=1, L=333, H=4, P=64, G=1, N=64, dtype=torch.float16, seqlens=[64, 1, 200, 68], seq_idx=True),
}


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("case", sorted(CASES))
def test_gradients_against_float64_recurrence(device, case):
    kw = make_problem(**CASES[case], device=device)
    cots = cotangents(kw)
    dtype = CASES[case]["dtype"]
    want = reference_gradients(kw, cots)
    assert_gradients_close(op_gradients(kw, cots, save_states=True), want, dtype)
    assert_gradients_close(op_gradients(kw, cots), want, dtype)


@pytest.mark.parametrize("device", DEVICES)
def test_forward_unchanged_without_grad(device):
    # No backward will run: nothing is saved, and y is the same bits as without the flag.
    kw = make_problem(**CASES["hopper_walk"], device=device)
    with torch.no_grad():
        a = mamba2ssd.mamba_chunk_scan_combined(**kw, save_states=True)
        b = mamba2ssd.mamba_chunk_scan_combined(**kw)
    assert torch.equal(a, b)


def test_op_refuses_cpu_tensors():
    kw = make_problem(**CASES["own_walk_fp32"])
    args = (kw["x"], kw["dt"], kw["A"], kw["B"], kw["C"], kw["chunk_size"], kw["D"], None, None,
            kw["initial_states"], None, None, False, 0.0, float("inf"), False, False)
    with pytest.raises(ValueError, match=r"save_states keeps the CUDA forward's states for its backward, but x is on cpu"):
        torch.ops.mamba2ssd.chunk_scan_fwd(*args, save_states=True)
    y, _, _, saved = torch.ops.mamba2ssd.chunk_scan_fwd(*args)
    assert saved.numel() == 0 and y.shape == kw["x"].shape


@requires_cuda_backend
def test_saved_states_shape_and_compiled():
    kw = make_problem(**CASES["hopper_walk"], device="cuda")
    b, L, H, P = kw["x"].shape
    N = kw["B"].shape[3]
    args = (kw["x"], kw["dt"], kw["A"], kw["B"], kw["C"], kw["chunk_size"], kw["D"], kw["z"], kw["dt_bias"],
            kw["initial_states"], None, None, True, 0.0, float("inf"), False, False)
    _, _, _, saved = torch.ops.mamba2ssd.chunk_scan_fwd(*args, save_states=True)
    assert saved.shape == (b, (L + 63) // 64, H, P, N) and saved.dtype == kw["x"].dtype
    assert torch.isfinite(saved).all()
    cots = cotangents(kw)
    eager = op_gradients(kw, cots, save_states=True)
    compiled = op_gradients(kw, cots, fn=torch.compile(mamba2ssd.mamba_chunk_scan_combined, fullgraph=True),
                            save_states=True)
    for name in eager:
        assert torch.equal(eager[name], compiled[name]), name
