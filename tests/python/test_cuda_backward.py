"""The CUDA backward through the op (skipped without a GPU): gradients against the float64 recurrence
on the training shapes the Hopper path targets, the same bits on every run, and forward + backward
captured in one CUDA graph and replayed on new inputs. (test_backward.py runs every feature on the GPU
too; test_peer_backward.py compares with mamba_ssm.)"""

import pytest
import torch

import mamba2ssd
from gradients import assert_gradients_close, cotangents, grad_names, op_gradients, reference_gradients
from problems import make_problem, requires_cuda_backend

pytestmark = requires_cuda_backend

# Mamba-2 training shapes, shortened (the float64 recurrence keeps every state for autograd): head dim
# 64, state 64 to 256, groups, D, z, dt_bias + softplus, a chunk boundary and a ragged end.
TRAINING = dict(b=1, L=300, H=4, P=64, G=2, chunk_size=256, D="head", z=True, dt_bias=True, dt_softplus=True,
                initial_states=True)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
@pytest.mark.parametrize("N", [64, 128, 256])
def test_training_shapes_against_float64_recurrence(dtype, N):
    kw = make_problem(**TRAINING, N=N, dtype=dtype, device="cuda")
    cots = cotangents(kw)
    assert_gradients_close(op_gradients(kw, cots), reference_gradients(kw, cots), dtype)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=str)
@pytest.mark.parametrize("case", ["training", "varlen"])
def test_same_bits_every_run(dtype, case):
    # No floating-point atomics: two runs (and a run after other work on the GPU) give identical bits.
    if case == "training":
        kw = make_problem(**TRAINING, N=128, dtype=dtype, device="cuda")
        cots = cotangents(kw)
    else:
        kw = make_problem(b=1, L=700, H=4, P=64, N=64, G=2, dtype=dtype, device="cuda", seqlens=[300, 1, 399],
                          seq_idx=True, cu_seqlens=True, z=True, D="dim")
        cots = cotangents(kw, final=True)
    first = op_gradients(kw, cots)
    torch.randn(1 << 24, device="cuda").sum()  # disturb caches and the allocator in between
    second = op_gradients(kw, cots)
    for name in first:
        assert torch.equal(first[name], second[name]), f"d{name} differs between two runs"


def test_cuda_graph_capture_of_forward_and_backward():
    spec = dict(b=1, L=320, H=4, P=64, N=64, G=2, device="cuda", z=True, D="dim", dt_bias=True, dt_softplus=True,
                initial_states=True, dtype=torch.bfloat16)
    kw = make_problem(**spec)
    names = grad_names(kw)
    leaves = {k: kw[k].detach().clone().requires_grad_(True) for k in names}
    cots = cotangents(kw)
    dout = cots["y"].to("cuda", torch.bfloat16)
    dfinal = cots["final_states"].to("cuda", torch.float32)

    def step():
        y, final_states = mamba2ssd.mamba_chunk_scan_combined(**dict(kw, **leaves), return_final_states=True)
        return torch.autograd.grad((y, final_states), list(leaves.values()), (dout, dfinal))

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm up outside the capture
        for _ in range(2):
            step()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = step()

    # New inputs copied into the captured leaves, then replay: the gradients of the new inputs.
    fresh = make_problem(**spec, seed=7)
    with torch.no_grad():
        for k in names:
            leaves[k].copy_(fresh[k])
    graph.replay()
    torch.cuda.synchronize()
    got = dict(zip(names, captured))
    assert_gradients_close(got, reference_gradients(fresh, cots), torch.bfloat16)
    eager = dict(zip(names, step()))  # and exactly what an eager call gives
    for name in names:
        assert torch.equal(got[name], eager[name]), f"d{name}: replay differs from an eager call"


def test_backward_runs_on_the_current_stream():
    # The backward launched on a side stream whose inputs are written there after a long sleep: it must
    # see them (a backward on another stream would read the stale zeros).
    kw = make_problem(device="cuda", P=64, N=64, z=True, D="head")
    cots = cotangents(kw, final=False)
    want = op_gradients(kw, cots)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())  # kw and `want` were made on the default stream
    with torch.cuda.stream(side):
        x = torch.zeros_like(kw["x"]).requires_grad_(True)
        torch.cuda._sleep(50_000_000)
        with torch.no_grad():
            x.copy_(kw["x"])
        y = mamba2ssd.mamba_chunk_scan_combined(**dict(kw, x=x))
        (dx,) = torch.autograd.grad(y, x, cots["y"].to("cuda", y.dtype))
    torch.cuda.synchronize()
    assert torch.equal(dx, want["x"])


def test_backward_no_host_synchronization():
    # Forward + backward queued behind a long sleep: the host gets back before the GPU is done.
    kw = make_problem(device="cuda", P=64, N=64, D="head")
    x = kw["x"].detach().clone().requires_grad_(True)
    dout = torch.randn_like(x)

    def step():
        y = mamba2ssd.mamba_chunk_scan_combined(**dict(kw, x=x))
        return torch.autograd.grad(y, x, dout)

    step()  # warm-up: the same kernels, loaded
    torch.cuda.synchronize()
    done = torch.cuda.Event()
    torch.cuda._sleep(200_000_000)
    step()
    done.record()
    assert not done.query(), "the backward waited for the GPU (host synchronization)"
    torch.cuda.synchronize()


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two GPUs")
def test_backward_device_guard_second_gpu():
    kw = make_problem(device="cuda:1", P=64, N=64, initial_states=True, D="dim")
    cots = cotangents(kw)
    with torch.cuda.device(0):
        got = op_gradients(kw, cots)
    assert all(g.device == torch.device("cuda:1") for g in got.values())
    assert_gradients_close(got, reference_gradients(kw, cots), torch.float32)
