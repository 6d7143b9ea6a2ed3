"""Bad input raises ValueError with a message naming the argument; nothing crashes."""

import pytest
import torch

import mamba2ssd
from problems import DEVICES, make_problem, requires_cuda_backend

f = mamba2ssd.mamba_chunk_scan_combined


def expect_error(kw, match, **flags):
    with pytest.raises(ValueError, match=match):
        f(**kw, **flags)


def swap(kw, **changes):
    return dict(kw, **changes)


@pytest.mark.parametrize("device", DEVICES)
class TestBadInput:
    def test_wrong_rank(self, device):
        kw = make_problem(device=device)
        expect_error(swap(kw, x=kw["x"][0]), r"x must be a 4-d tensor")
        expect_error(swap(kw, dt=kw["dt"][..., None]), r"dt must be a 3-d tensor")
        expect_error(swap(kw, B=kw["B"][0]), r"B must be a 4-d tensor")
        expect_error(swap(kw, C=kw["C"][0]), r"C must be a 4-d tensor")
        expect_error(swap(kw, A=kw["A"][None]), r"A must be a 1-d tensor")
        expect_error(swap(kw, seq_idx=torch.zeros(2, 160, 1, dtype=torch.int32, device=device)), r"seq_idx must be a 2-d")

    def test_mismatched_batch_and_length(self, device):
        kw = make_problem(device=device)
        expect_error(swap(kw, B=kw["B"][:1]), r"B must have shape \[batch, seqlen, ngroups, dstate\] = \[2, 160, 2, 16\]")
        expect_error(swap(kw, C=kw["C"][:, :100]), r"C must have shape")
        expect_error(swap(kw, dt=kw["dt"][:1]), r"dt must have shape \[batch, seqlen, nheads\] = \[2, 160, 4\]")
        expect_error(swap(kw, z=kw["x"][:, :10]), r"z must have shape")
        expect_error(swap(kw, A=kw["A"][:3]), r"A must have shape \[nheads\] = \[4\]")

    def test_optional_shapes(self, device):
        kw = make_problem(device=device)
        expect_error(swap(kw, D=torch.ones(3, device=device)), r"D must have shape \[nheads\] = \[4\] or \[nheads, headdim\]")
        expect_error(swap(kw, D=torch.ones(4, 16, device=device)), r"D must have shape")
        expect_error(swap(kw, dt_bias=torch.ones(5, device=device)), r"dt_bias must have shape \[nheads\]")
        expect_error(swap(kw, initial_states=torch.zeros(2, 4, 32, 32, device=device)), r"initial_states must have shape")
        expect_error(swap(kw, seq_idx=torch.zeros(1, 160, dtype=torch.int32, device=device)), r"seq_idx must have shape")

    def test_groups_must_divide_heads(self, device):
        kw = make_problem(H=4, G=3, device=device)
        expect_error(kw, r"ngroups must divide nheads, got ngroups 3 for nheads 4")

    def test_unsupported_sizes(self, device):
        expect_error(make_problem(P=40, device=device), r"headdim must be a multiple of 16 in \[16, 128\], got 40")
        expect_error(make_problem(P=144, device=device), r"headdim must be a multiple of 16 in \[16, 128\], got 144")
        expect_error(make_problem(N=20, device=device), r"dstate must be a multiple of 16 in \[16, 256\], got 20")
        expect_error(make_problem(N=512, device=device), r"dstate must be a multiple of 16")
        expect_error(make_problem(chunk_size=0, device=device), r"chunk_size must be >= 1, got 0")
        expect_error(make_problem(L=0, device=device), r"seqlen must be >= 1")

    def test_dtypes(self, device):
        kw = make_problem(device=device)
        expect_error(swap(kw, B=kw["B"].half()), r"B must have x's dtype Float, got Half")
        expect_error(swap(kw, C=kw["C"].bfloat16()), r"C must have x's dtype")
        expect_error(swap(kw, z=kw["x"].double()), r"z must have x's dtype")
        if device == "cuda":  # float64 is the fp64 oracle's, on the CPU (test_gradcheck.py)
            expect_error(swap(kw, x=kw["x"].double(), B=kw["B"].double(), C=kw["C"].double()),
                         r"x is float64 on cuda:0: float64 runs on the CPU only")
        expect_error(swap(kw, x=kw["x"].int(), B=kw["B"].int(), C=kw["C"].int()),
                     r"x must be float32, float16, bfloat16 or float64 \(CPU only\), got Int")
        expect_error(swap(kw, dt=kw["dt"].double()), r"dt must be float32, float16 or bfloat16 \(float64 only with float64 x\)")
        expect_error(swap(kw, A=torch.ones(4, dtype=torch.int32, device=device)), r"A must be a floating-point tensor")
        expect_error(swap(kw, seq_idx=torch.zeros(2, 160, device=device)), r"seq_idx must be an int32 or int64 tensor")
        expect_error(swap(kw, cu_seqlens=torch.tensor([0.0, 160.0], device=device)), r"cu_seqlens must be an int32 or int64")

    def test_dt_limit(self, device):
        kw = make_problem(device=device)
        expect_error(swap(kw, dt_limit=(0.5, 0.1)), r"dt_limit must satisfy lo <= hi")
        expect_error(swap(kw, dt_limit=(-1.0, 1.0)), r"dt_limit lower bound must be >= 0")
        expect_error(swap(kw, dt_limit=(float("nan"), 1.0)), r"dt_limit must not be NaN")

    def test_cuda_path(self, device):
        kw = make_problem(device=device)
        expect_error(kw, r"cuda_path must be one of auto, three-kernel, fused, hopper, tile, got 'fast'",
                     cuda_path="fast")

    def test_cu_seqlens(self, device):
        kw = make_problem(device=device)  # batch 2
        expect_error(swap(kw, cu_seqlens=torch.tensor([0, 160], device=device)), r"cu_seqlens needs batch == 1")
        kw1 = make_problem(b=1, device=device)
        expect_error(swap(kw1, cu_seqlens=torch.tensor([0], device=device)), r"cu_seqlens must hold num_sequences \+ 1 >= 2")
        expect_error(kw1, r"return_varlen_states=True needs cu_seqlens", return_varlen_states=True)
        if device == "cpu":  # contents are checked by the host backends (a GPU check would synchronize)
            expect_error(swap(kw1, cu_seqlens=torch.tensor([0, 100, 150])), r"cu_seqlens \[2\] must equal seqlen 160")
            expect_error(swap(kw1, cu_seqlens=torch.tensor([0, 100, 50, 160])), r"cu_seqlens must be non-decreasing")
            expect_error(swap(kw1, cu_seqlens=torch.tensor([5, 160])), r"cu_seqlens \[0\] must be 0")


@requires_cuda_backend
def test_tensors_on_different_devices():
    kw = make_problem(device="cuda")
    expect_error(swap(kw, B=kw["B"].cpu()), r"B is on cpu but x is on cuda:0")
    expect_error(swap(kw, x=kw["x"].cpu()), r"dt is on cuda:0 but x is on cpu")
    expect_error(swap(kw, D=torch.ones(4)), r"D is on cpu but x is on cuda:0")
    expect_error(swap(kw, cu_seqlens=torch.tensor([0, 160])), r"cu_seqlens is on cpu")


def test_a_meta_tensor_among_cpu_ones_is_refused():
    # The fake kernels serve the Meta key, which wins over CPU: before they checked devices, y came
    # back as uninitialized memory.
    kw = make_problem()
    expect_error(swap(kw, A=kw["A"].to("meta")), r"A is on meta but x is on cpu")
    expect_error(swap(kw, seq_idx=torch.zeros(2, 160, dtype=torch.int32, device="meta")), r"seq_idx is on meta")


def test_int64_seq_idx_outside_int32_is_refused():
    # Cast to int32, 2^32 became 0: the sequence took initial_states (or lost its restart) silently.
    kw = make_problem(b=1)
    ids = torch.zeros(1, 160, dtype=torch.int64)
    ids[0, 80:] = 2**32
    expect_error(swap(kw, seq_idx=ids), r"seq_idx\[0, 80\] = 4294967296 is outside int32")
    small = torch.zeros(1, 160, dtype=torch.int64)
    small[0, 80:] = 1
    assert torch.equal(f(**swap(kw, seq_idx=small)), f(**swap(kw, seq_idx=small.int())))


def test_dt_limit_is_judged_as_given_not_as_its_float():
    # The bounds were narrowed to float before the library judged them: -1e-50 became -0 and passed
    # as >= 0, (0, -1e-50) passed lo <= hi, and a lower bound of 1e39 was named as inf.
    kw = make_problem()
    expect_error(swap(kw, dt_limit=(-1e-50, 1.0)), r"dt_limit lower bound must be >= 0, got -1e-50$")
    expect_error(swap(kw, dt_limit=(0.0, -1e-50)), r"dt_limit must satisfy lo <= hi, got \(0, -1e-50\)$")
    expect_error(swap(kw, dt_limit=(1e39, float("inf"))),
                 r"dt_limit lower bound must be finite in float32 \(at most 3.40282e\+38\), got 1e\+39$")
    # An upper bound past float's range clamps float dt as no bound does.
    assert torch.equal(f(**swap(kw, dt_limit=(0.0, 1e39))), f(**kw))


def test_sizes_past_the_limits_are_refused_before_the_outputs_are_allocated():
    # y (and the backward's gradients) were allocated before the library's size limits were checked:
    # inputs expanded past 2^56 elements (views of one token) failed in the allocator, unnamed.
    kw = make_problem(b=1)
    b = L = 2**26
    big = {name: kw[name][:1, :1].expand(b, L, *kw[name].shape[2:]) for name in ("x", "dt", "B", "C")}
    message = r"batch \* seqlen \* nheads \* headdim = 67108864 \* 67108864 \* 4 \* 32 is more than 2\^56 elements"
    expect_error(swap(kw, **big), r"^mamba_chunk_scan_combined: " + message)
    with pytest.raises(ValueError, match=r"^mamba_chunk_scan_combined: backward: " + message):
        torch.ops.mamba2ssd.chunk_scan_bwd(big["x"], None, None, big["x"], big["dt"], kw["A"], big["B"], big["C"], 64,
                                           None, None, None, None, None, None, False, 0.0, float("inf"))


def test_double_backward_is_refused():
    # Without a formula for the backward op, create_graph=True gave second-order gradients of zeros.
    kw = make_problem(b=1, dtype=torch.float64)
    x = kw["x"].requires_grad_()
    (g,) = torch.autograd.grad(f(**kw).square().sum(), x, create_graph=True)
    assert g.abs().sum() > 0
    with pytest.raises(RuntimeError, match=r"the backward is not differentiable \(no double backward"):
        torch.autograd.grad(g.sum(), x)


def test_arguments_of_the_wrong_kind_are_named():
    # What the library never sees: None or a numpy array where a tensor goes, a dt_limit that is not a
    # pair. (torch's dispatch said "tensor does not have a device"; unpacking, "too many values".)
    kw = make_problem()
    for name in ("x", "dt", "A", "B", "C"):
        with pytest.raises(TypeError, match=rf"mamba_chunk_scan_combined: {name} must be a torch.Tensor, got NoneType"):
            f(**swap(kw, **{name: None}))
    with pytest.raises(TypeError, match=r"mamba_chunk_scan_combined: x must be a torch.Tensor, got ndarray"):
        f(**swap(kw, x=kw["x"].numpy()))
    with pytest.raises(TypeError, match=r"mamba_chunk_scan_combined: D must be a torch.Tensor or None, got list"):
        f(**swap(kw, D=[1.0, 1.0, 1.0, 1.0]))
    for bad in (None, (0.0, 1.0, 2.0), 0.5, (None, 1.0)):
        with pytest.raises(TypeError, match=r"mamba_chunk_scan_combined: dt_limit must be a pair \(lo, hi\) of numbers"):
            f(**swap(kw, dt_limit=bad))
    assert torch.equal(f(**swap(kw, dt_limit=[0.0, float("inf")])), f(**kw))  # a list is a pair too


def test_messages_name_the_function():
    kw = make_problem()
    with pytest.raises(ValueError, match=r"^mamba_chunk_scan_combined: B must have shape"):
        f(**swap(kw, B=kw["B"][:1]))
