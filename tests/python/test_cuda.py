"""CUDA specifics: graph capture, the caller's stream, the device guard. Skipped without a GPU."""

import re

import pytest
import torch

import mamba2ssd
from problems import assert_close, make_problem, oracle, requires_cuda_backend

pytestmark = requires_cuda_backend


def test_cuda_graph_capture_and_replay():
    kw = make_problem(b=1, device="cuda", z=True, D="dim", dt_bias=True, dt_softplus=True, initial_states=True,
                      seqlens=[70, 90], cu_seqlens=True, dtype=torch.bfloat16)
    static = {k: (v.clone() if isinstance(v, torch.Tensor) else v) for k, v in kw.items()}

    def run():
        return mamba2ssd.mamba_chunk_scan_combined(**static, return_final_states=True, return_varlen_states=True)

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm up outside the capture
        run()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        y, fs, vs = run()

    # New inputs, copied into the captured buffers, then replay.
    fresh = make_problem(b=1, device="cuda", z=True, D="dim", dt_bias=True, dt_softplus=True, initial_states=True,
                         seqlens=[70, 90], cu_seqlens=True, dtype=torch.bfloat16, seed=7)
    for k, v in fresh.items():
        if isinstance(v, torch.Tensor):
            static[k].copy_(v)
    graph.replay()
    torch.cuda.synchronize()
    y_ref, fs_ref, vs_ref = oracle(fresh)
    assert_close(y, y_ref, torch.bfloat16, "y")
    assert_close(fs, fs_ref, torch.bfloat16, "final_states")
    assert_close(vs, vs_ref, torch.bfloat16, "varlen_states")


def test_runs_on_the_current_stream():
    # The inputs are written on a side stream after a long sleep; the op, called on that stream,
    # must see them (it would read stale zeros if it ran on another stream).
    kw = make_problem(device="cuda", z=True, D="head")
    source = {k: v for k, v in kw.items()}
    x = torch.zeros_like(kw["x"])
    torch.cuda.synchronize()
    side = torch.cuda.Stream()
    with torch.cuda.stream(side):
        torch.cuda._sleep(100_000_000)
        x.copy_(source["x"])
        y = mamba2ssd.mamba_chunk_scan_combined(**dict(kw, x=x))
    side.synchronize()
    assert_close(y, oracle(kw)[0], torch.float32)


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two GPUs")
def test_device_guard_second_gpu():
    kw = make_problem(device="cuda:1", initial_states=True)
    with torch.cuda.device(0):
        y, fs = mamba2ssd.mamba_chunk_scan_combined(**kw, return_final_states=True)
    assert y.device == torch.device("cuda:1") and fs.device == torch.device("cuda:1")
    y_ref, fs_ref, _ = oracle(kw)
    assert_close(y, y_ref, torch.float32)
    assert_close(fs, fs_ref, torch.float32, "final_states")


def test_no_host_synchronization():
    # A call must not block the host: queue it behind a long sleep and see that it returns first.
    kw = make_problem(device="cuda")
    mamba2ssd.mamba_chunk_scan_combined(**kw, return_final_states=True)  # warm-up: same kernels, loaded
    torch.cuda.synchronize()
    done = torch.cuda.Event()
    torch.cuda._sleep(200_000_000)
    mamba2ssd.mamba_chunk_scan_combined(**kw, return_final_states=True)
    done.record()
    assert not done.query(), "the op waited for the GPU (host synchronization)"
    torch.cuda.synchronize()


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("path", ["auto", "three-kernel", "fused", "hopper", "tile"])
def test_cuda_paths(path, dtype):
    # Each CUDA path on a problem of the fused paths' kind (head dim 64, state 64, packed sequences,
    # several chunks; fp32 runs the hopper path's TF32 walk on sm_90); a path that does not cover it
    # (hopper off sm_90, tile in a build without it) must refuse with a ValueError that says why,
    # never run wrongly.
    kw = make_problem(b=1, L=700, H=4, P=64, G=2, N=64, chunk_size=128, dtype=dtype, device="cuda",
                      z=True, D="head", initial_states=True, seqlens=[300, 1, 399], seq_idx=True)
    try:
        y, fs = mamba2ssd.mamba_chunk_scan_combined(**kw, return_final_states=True, cuda_path=path)
    except ValueError as e:
        assert path in ("hopper", "tile"), f"cuda_path {path} refused: {e}"
        assert re.search(r"cuda_path (hopper|tile) cannot run this call", str(e)), e
        return
    y_ref, fs_ref, _ = oracle(kw)
    assert_close(y, y_ref, dtype, "y")
    assert_close(fs, fs_ref, dtype, "final_states")


def test_hopper_refuses_3xtf32():
    # The hopper path's fp32 products are TF32: fp32_math "accurate" (3xTF32) runs on the fused
    # path, and the hopper path asked for by name says so (on any GPU: the check comes first).
    kw = make_problem(b=1, L=200, H=2, P=64, G=1, N=64, dtype=torch.float32, device="cuda")
    with pytest.raises(ValueError, match=r"cuda_path hopper cannot run this call: its fp32 products are TF32"):
        mamba2ssd.mamba_chunk_scan_combined(**kw, cuda_path="hopper", fp32_math="accurate")
    y = mamba2ssd.mamba_chunk_scan_combined(**kw, fp32_math="accurate")  # auto: the fused path
    y_ref, _, _ = oracle(kw)
    assert_close(y, y_ref, torch.float32, "y")


def test_cuda_matches_cpu():
    kw = make_problem(device="cuda", z=True, D="dim", dt_bias=True, dt_softplus=True, initial_states=True,
                      seqlens=[50, 110], seq_idx=True)
    kw_cpu = {k: (v.cpu() if isinstance(v, torch.Tensor) else v) for k, v in kw.items()}
    y, fs = mamba2ssd.mamba_chunk_scan_combined(**kw, return_final_states=True)
    y_cpu, fs_cpu = mamba2ssd.mamba_chunk_scan_combined(**kw_cpu, return_final_states=True)
    tol = mamba2ssd.tolerance(torch.float32)
    assert ((y.cpu().double() - y_cpu.double()).norm() / y_cpu.double().norm()).item() <= 2 * tol
    assert ((fs.cpu().double() - fs_cpu.double()).norm() / fs_cpu.double().norm()).item() <= 2 * tol


def test_compile_reduce_overhead():
    # torch.compile's CUDA-graph mode captures the op inside inductor's graph trees.
    torch._dynamo.reset()
    kw = make_problem(device="cuda", z=True, D="head", initial_states=True)

    @torch.compile(mode="reduce-overhead", fullgraph=True)
    def fn(x, dt, A, B, C, D, z, initial_states):
        y, fs = mamba2ssd.mamba_chunk_scan_combined(x, dt, A, B, C, 64, D=D, z=z, initial_states=initial_states,
                                                    return_final_states=True)
        return y * 1.0, fs

    args = [kw[k] for k in ("x", "dt", "A", "B", "C", "D", "z", "initial_states")]
    for _ in range(3):  # warm-up, record, replay
        y, fs = fn(*args)
    y_ref, fs_ref, _ = oracle(kw)
    assert_close(y, y_ref, torch.float32)
    assert_close(fs, fs_ref, torch.float32, "final_states")
    torch._dynamo.reset()
