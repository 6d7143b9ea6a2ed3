"""check_inputs=True: the contents of cu_seqlens and seq_idx validated, a bad entry a ValueError naming it.

On the CPU the host backends check; on CUDA a check kernel writes a device status that the op reads
after a stream sync (not during CUDA graph capture, where nothing is raised). The backward of a
checked forward runs checked too (chunk_scan_bwd's check_inputs). docs/reliability.md, "Checked mode".
"""

import pytest
import torch

import mamba2ssd
from problems import DEVICES, make_problem, requires_cuda_backend

f = mamba2ssd.mamba_chunk_scan_combined


def ids_with_one_drop(device, b=2, L=160):
    """seq_idx [b, L] int32, non-decreasing except seq_idx[1, 70] = 0 after ids of 1."""
    ids = torch.zeros(b, L, dtype=torch.int32)
    ids[:, 50:] = 1
    ids[:, 120:] = 2
    ids[1, 70] = 0
    return ids.to(device)


SEQ_IDX_MESSAGE = r"seq_idx\[1, 70\] = 0 is less than the id before it: seq_idx must be non-decreasing"


@pytest.mark.parametrize("device", DEVICES)
def test_well_formed_inputs_unchanged(device):
    # The check reads; it changes nothing of a good call's outputs.
    kw = make_problem(b=1, device=device, seqlens=[60, 100], seq_idx=True, cu_seqlens=True)
    plain = f(**kw, return_final_states=True, return_varlen_states=True)
    checked = f(**kw, return_final_states=True, return_varlen_states=True, check_inputs=True)
    for p, c in zip(plain, checked):
        torch.testing.assert_close(c, p, rtol=0, atol=0)


@pytest.mark.parametrize("device", DEVICES)
def test_decreasing_seq_idx(device):
    kw = make_problem(device=device)
    kw["seq_idx"] = ids_with_one_drop(device)
    with pytest.raises(ValueError, match="mamba_chunk_scan_combined: " + SEQ_IDX_MESSAGE):
        f(**kw, check_inputs=True)
    # Unchecked, as before: no error, and (the kernels stay in bounds) finite outputs.
    y = f(**kw)
    assert torch.isfinite(y).all()


# Bad cu_seqlens (seqlen 160): the host backends' message (they check cu_seqlens in every mode) and
# the CUDA check kernel's (check_input_status), each naming the entry.
BAD_CU_SEQLENS = [
    ([0, 100, 50, 160], r"cu_seqlens must be non-decreasing, got \[1\] = 100 > \[2\] = 50",
     r"cu_seqlens\[2\] = 50 is less than the entry before it"),
    ([5, 160], r"cu_seqlens \[0\] must be 0, got 5", r"cu_seqlens\[0\] = 5: cu_seqlens must start at 0"),
    ([0, 100, 150], r"cu_seqlens \[2\] must equal seqlen 160, got 150",
     r"cu_seqlens\[2\] = 150: the last offset must equal seqlen"),
]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("offsets,cpu_message,cuda_message", BAD_CU_SEQLENS, ids=["decreasing", "first", "last"])
def test_bad_cu_seqlens(device, offsets, cpu_message, cuda_message):
    kw = make_problem(b=1, device=device)
    kw["cu_seqlens"] = torch.tensor(offsets, dtype=torch.int32, device=device)
    with pytest.raises(ValueError, match=cpu_message if device == "cpu" else cuda_message):
        f(**kw, check_inputs=True)
    if device == "cpu":  # unchecked, as before: the host backends refuse it anyway
        with pytest.raises(ValueError, match=cpu_message):
            f(**kw)
    else:  # unchecked, as before: no sync, no error, outputs unspecified but in bounds
        f(**kw)
        torch.cuda.synchronize()


@pytest.mark.parametrize("device", DEVICES)
def test_backward_checked_gradients_unchanged(device):
    kw = make_problem(b=1, device=device, z=True, D="head", seqlens=[60, 100], seq_idx=True, cu_seqlens=True)
    grads = {}
    for checked in (False, True):
        leaves = {k: kw[k].detach().clone().requires_grad_(True) for k in ("x", "dt", "B", "C", "D", "z")}
        y = f(**dict(kw, **leaves), check_inputs=checked)
        y.square().sum().backward()
        grads[checked] = [leaves[k].grad for k in leaves]
    for a, b in zip(grads[False], grads[True]):
        torch.testing.assert_close(b, a, rtol=0, atol=0)


def bwd_args(kw, check_inputs):
    """chunk_scan_bwd's arguments for make_problem's kw: a random dout, no state cotangents."""
    return (torch.randn_like(kw["x"]), None, None, kw["x"], kw["dt"], kw["A"], kw["B"], kw["C"], kw["chunk_size"],
            None, None, None, None, kw.get("seq_idx"), kw.get("cu_seqlens"), False, 0.0, float("inf"), "auto",
            check_inputs)


@pytest.mark.parametrize("device", DEVICES)
def test_backward_op_checked(device):
    # chunk_scan_bwd called directly: checked, a decreasing id is the forward's ValueError (with the
    # backward's prefix); unchecked, as before, no error.
    kw = make_problem(device=device)
    kw["seq_idx"] = ids_with_one_drop(device)
    with pytest.raises(ValueError, match="mamba_chunk_scan_combined: backward: " + SEQ_IDX_MESSAGE):
        torch.ops.mamba2ssd.chunk_scan_bwd(*bwd_args(kw, True))
    grads = torch.ops.mamba2ssd.chunk_scan_bwd(*bwd_args(kw, False))
    assert torch.isfinite(grads[0]).all()


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("offsets,cpu_message,cuda_message", BAD_CU_SEQLENS, ids=["decreasing", "first", "last"])
def test_backward_op_bad_cu_seqlens(device, offsets, cpu_message, cuda_message):
    kw = make_problem(b=1, device=device)
    kw["cu_seqlens"] = torch.tensor(offsets, dtype=torch.int32, device=device)
    with pytest.raises(ValueError, match="backward: " + (cpu_message if device == "cpu" else cuda_message)):
        torch.ops.mamba2ssd.chunk_scan_bwd(*bwd_args(kw, True))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("checked", [False, True])
def test_autograd_backward_follows_the_forward(device, checked):
    # The forward's check_inputs reaches the backward through autograd's context. Ids that go bad
    # between the two (written through .data, which autograd does not track) are caught by a
    # checked backward; an unchecked one runs as before.
    kw = make_problem(device=device, seqlens=[60, 100], seq_idx=True)
    x = kw["x"].requires_grad_(True)
    y = f(**kw, check_inputs=checked)
    kw["seq_idx"].data.copy_(ids_with_one_drop(device))
    if checked:
        with pytest.raises(ValueError, match="mamba_chunk_scan_combined: backward: " + SEQ_IDX_MESSAGE):
            y.sum().backward()
    else:
        y.sum().backward()
        assert torch.isfinite(x.grad).all()


@pytest.mark.parametrize("device", DEVICES)
def test_opcheck_backward_checked(device):
    kw = make_problem(b=1, device=device, seqlens=[60, 100], seq_idx=True, cu_seqlens=True)
    torch.library.opcheck(torch.ops.mamba2ssd.chunk_scan_bwd.default, bwd_args(kw, True),
                          test_utils=("test_schema", "test_faketensor", "test_aot_dispatch_dynamic"))


@pytest.mark.parametrize("device", DEVICES)
def test_opcheck_checked(device):
    kw = make_problem(b=1, device=device, seqlens=[60, 100], seq_idx=True, cu_seqlens=True)
    args = (kw["x"], kw["dt"], kw["A"], kw["B"], kw["C"], 64, None, None, None, None, kw["seq_idx"], kw["cu_seqlens"],
            False, 0.0, float("inf"), True, True, "auto", True)
    torch.library.opcheck(torch.ops.mamba2ssd.chunk_scan_fwd.default, args,
                          test_utils=("test_schema", "test_autograd_registration", "test_faketensor",
                                      "test_aot_dispatch_dynamic"))


@pytest.mark.parametrize("device", DEVICES)
def test_compile_fullgraph(device):
    # The keyword traces under fullgraph (the fake kernel takes it); the check runs, and raises, when
    # the compiled graph runs.
    torch._dynamo.reset()
    try:
        def fn(x, dt, A, B, C, seq_idx):
            return f(x, dt, A, B, C, 64, seq_idx=seq_idx, check_inputs=True)

        kw = make_problem(device=device, seqlens=[60, 100], seq_idx=True)
        args = [kw[k] for k in ("x", "dt", "A", "B", "C", "seq_idx")]
        compiled = torch.compile(fn, fullgraph=True)
        torch.testing.assert_close(compiled(*args), fn(*args), rtol=0, atol=0)
        args[-1] = ids_with_one_drop(device)
        with pytest.raises(ValueError, match=SEQ_IDX_MESSAGE):
            compiled(*args)
    finally:
        torch._dynamo.reset()


@requires_cuda_backend
def test_cuda_status_is_per_call():
    # Each call zeroes its own status: a good call after a bad one does not raise.
    kw = make_problem(device="cuda")
    bad = dict(kw, seq_idx=ids_with_one_drop("cuda"))
    with pytest.raises(ValueError, match=SEQ_IDX_MESSAGE):
        f(**bad, check_inputs=True)
    f(**kw, seq_idx=torch.zeros(2, 160, dtype=torch.int32, device="cuda"), check_inputs=True)


@requires_cuda_backend
def test_cuda_graph_capture_does_not_raise():
    # During capture nothing may synchronize: the check kernel is recorded, its status unread, and
    # the capture (and each replay) goes through even for bad ids. The eager call raises.
    kw = make_problem(device="cuda")
    kw["seq_idx"] = ids_with_one_drop("cuda")
    with pytest.raises(ValueError, match=SEQ_IDX_MESSAGE):
        f(**kw, check_inputs=True)
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):  # warm-up on a side stream, as torch.cuda.graph wants
        f(**kw)
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        y = f(**kw, check_inputs=True)
    graph.replay()
    torch.cuda.synchronize()
    assert torch.isfinite(y).all()


@requires_cuda_backend
def test_cuda_backward_graph_capture_does_not_raise():
    # The backward op likewise: eager it raises; captured, the check is recorded and nothing raised.
    kw = make_problem(device="cuda")
    kw["seq_idx"] = ids_with_one_drop("cuda")
    args = bwd_args(kw, True)
    with pytest.raises(ValueError, match="backward: " + SEQ_IDX_MESSAGE):
        torch.ops.mamba2ssd.chunk_scan_bwd(*args)
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):  # warm-up on a side stream, as torch.cuda.graph wants
        torch.ops.mamba2ssd.chunk_scan_bwd(*bwd_args(kw, False))
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        grads = torch.ops.mamba2ssd.chunk_scan_bwd(*args)
    graph.replay()
    torch.cuda.synchronize()
    assert torch.isfinite(grads[0]).all()
