"""Bad input to the backward: non-finite cotangents propagate without a crash; the backward op called
directly with cotangents autograd would never hand it, or with a call the forward refuses, raises
ValueError naming the argument; a backend that refuses a gradient says so rather than drop it."""

import pytest
import torch

import mamba2ssd
from gradients import cotangents, op_gradients, reference_gradients, assert_gradients_close
from problems import DEVICES, make_problem, requires_cuda_backend, rel_l2

bwd = torch.ops.mamba2ssd.chunk_scan_bwd


def backward_args(kw, dout=None, dfinal=None, dvarlen=None):
    """chunk_scan_bwd's arguments for make_problem's kw (no D, z, ... unless kw has them)."""
    return (dout if dout is not None else torch.randn_like(kw["x"]), dfinal, dvarlen, kw["x"], kw["dt"], kw["A"],
            kw["B"], kw["C"], kw["chunk_size"], kw.get("D"), kw.get("z"), kw.get("dt_bias"), kw.get("initial_states"),
            kw.get("seq_idx"), kw.get("cu_seqlens"), kw.get("dt_softplus", False), 0.0, float("inf"))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("bad", [float("nan"), float("inf")])
def test_nonfinite_dout_propagates(device, bad):
    kw = make_problem(device=device, z=True, D="head", initial_states=True)
    for name in ("x", "B", "C", "dt", "A", "initial_states"):
        kw[name].requires_grad_(True)
    y = mamba2ssd.mamba_chunk_scan_combined(**kw)
    dout = torch.randn_like(y)
    t = 100
    dout[0, t, 1, 3] = bad
    y.backward(dout)  # no exception, no crash
    assert not torch.isfinite(kw["x"].grad).all()
    assert not torch.isfinite(kw["A"].grad).all()
    if device == "cpu":  # where the oracle puts them: tokens after t and other batch rows never see dout_t
        assert torch.isfinite(kw["x"].grad[1]).all()
        assert torch.isfinite(kw["x"].grad[0, t + 1:]).all()
        assert not torch.isfinite(kw["x"].grad[0, : t + 1, 1]).all()


@pytest.mark.parametrize("device", DEVICES)
def test_nonfinite_state_cotangent_propagates(device):
    kw = make_problem(device=device)
    kw["x"].requires_grad_(True)
    _, final_states = mamba2ssd.mamba_chunk_scan_combined(**kw, return_final_states=True)
    dfinal = torch.randn_like(final_states)
    dfinal[1, 2, 0, 0] = float("nan")
    final_states.backward(dfinal)
    assert torch.isfinite(kw["x"].grad[0]).all()
    assert not torch.isfinite(kw["x"].grad[1]).all()


@pytest.mark.parametrize("device", DEVICES)
class TestBadBackwardCall:
    def test_dout_shape_dtype_rank(self, device):
        kw = make_problem(device=device)
        with pytest.raises(ValueError, match=r"dout must have shape \[batch, seqlen, nheads, headdim\] \(y's shape\) = "
                                             r"\[2, 160, 4, 32\], got \[2, 159, 4, 32\]"):
            bwd(*backward_args(kw, dout=torch.randn_like(kw["x"])[:, 1:]))
        with pytest.raises(ValueError, match=r"dout must be a 4-d tensor"):
            bwd(*backward_args(kw, dout=torch.randn_like(kw["x"])[0]))
        with pytest.raises(ValueError, match=r"backward: dout must have y's dtype Float, got BFloat16"):
            bwd(*backward_args(kw, dout=torch.randn_like(kw["x"]).bfloat16()))

    def test_state_cotangents(self, device):
        kw = make_problem(device=device)
        with pytest.raises(ValueError, match=r"dfinal_states must have shape \[batch, nheads, headdim, dstate\]"):
            bwd(*backward_args(kw, dfinal=torch.zeros(2, 4, 32, 8, device=device)))
        with pytest.raises(ValueError, match=r"backward: dvarlen_states needs cu_seqlens"):
            bwd(*backward_args(kw, dvarlen=torch.zeros(1, 4, 32, 16, device=device)))
        kw1 = make_problem(b=1, device=device, seqlens=[60, 100], cu_seqlens=True)
        with pytest.raises(ValueError, match=r"dvarlen_states must have shape \[num_sequences, nheads, headdim, "
                                             r"dstate\] = \[2, 4, 32, 16\], got \[3, 4, 32, 16\]"):
            bwd(*backward_args(kw1, dvarlen=torch.zeros(3, 4, 32, 16, device=device)))

    def test_call_the_forward_refuses(self, device):
        # The backward checks the forward's arguments by the forward's rules.
        with pytest.raises(ValueError, match=r"headdim must be a multiple of 16 in \[16, 128\], got 40"):
            bwd(*backward_args(make_problem(P=40, device=device)))
        kw = make_problem(device=device)
        with pytest.raises(ValueError, match=r"C must have shape"):
            bwd(*backward_args(dict(kw, C=kw["C"][:, :100])))
        with pytest.raises(ValueError, match=r"^mamba_chunk_scan_combined: backward: cu_seqlens needs batch == 1"):
            bwd(*backward_args(dict(kw, cu_seqlens=torch.tensor([0, 160], device=device))))

    def test_empty_state_cotangents_mean_none(self, device):
        # An output not asked for is an empty tensor; its (empty) cotangent is no cotangent.
        kw = make_problem(device=device)
        dout = torch.randn_like(kw["x"])
        with_empty = bwd(*backward_args(kw, dout=dout, dfinal=torch.empty(0, device=device),
                                        dvarlen=torch.empty(0, device=device)))
        without = bwd(*backward_args(kw, dout=dout))
        for a, b in zip(with_empty, without):
            assert torch.equal(a, b)


@requires_cuda_backend
def test_cotangent_on_another_device():
    kw = make_problem(device="cuda")
    with pytest.raises(ValueError, match=r"backward: dout is on cpu but x is on cuda:0"):
        bwd(*backward_args(kw, dout=torch.randn(kw["x"].shape)))
    with pytest.raises(ValueError, match=r"backward: dfinal_states is on cpu but x is on cuda:0"):
        bwd(*backward_args(kw, dfinal=torch.zeros(2, 4, 32, 16)))


@pytest.mark.parametrize("device", DEVICES)
def test_varlen_state_gradients_supported_or_refused(device):
    # Gradients through varlen_states: correct, or a ValueError that names them; never dropped.
    kw = make_problem(b=1, device=device, seqlens=[37, 90, 33], cu_seqlens=True)
    cots = cotangents(kw, final=False, varlen=True)
    cots["y"] = torch.zeros_like(cots["y"])  # only varlen_states reaches the loss
    try:
        got = op_gradients(kw, cots)
    except ValueError as e:
        assert "varlen" in str(e), str(e)
        return
    assert_gradients_close(got, reference_gradients(kw, cots), kw["x"].dtype)
    assert got["x"].abs().max() > 0


def _into_buffers(kw):
    """NaN buffers, and chunk_scan_bwd_into's dx, ddt, dB, dC, dz as slices of them: dx, dB and dC of one
    [b, L, H P + 2 G N] (laid out as the layer's xBC), dz of [b, L, 1 + H P] and ddt of [b, L, H + 2]
    (dt's dtype), each with columns left around it."""
    b, L, H, P = kw["x"].shape
    G, N = kw["B"].shape[2:]
    def nan(width, dtype=kw["x"].dtype):
        return torch.full((b, L, width), float("nan"), dtype=dtype, device=kw["x"].device)
    xbc, zb, dtb = nan(H * P + 2 * G * N), nan(1 + H * P), nan(H + 2, kw["dt"].dtype)
    dx, dB, dC = xbc.split([H * P, G * N, G * N], -1)
    return (xbc, zb, dtb), dict(dx=dx.unflatten(-1, (H, P)), ddt=dtb[..., 1:1 + H], dB=dB.unflatten(-1, (G, N)),
                                dC=dC.unflatten(-1, (G, N)), dz=zb[..., 1:].unflatten(-1, (H, P)))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_backward_into_given_buffers(device, dtype):
    """chunk_scan_bwd_into (the layer call's): the same bits as chunk_scan_bwd's gradients, written into
    slices of the caller's buffers (the columns around them keep their NaN), the rest returned."""
    kw = make_problem(device=device, dtype=dtype, z=True, D="head", dt_bias=True, dt_softplus=True,
                      initial_states=True)
    args = backward_args(kw) + ("auto", False, None)
    want = bwd(*args)
    (xbc, zb, dtb), into = _into_buffers(kw)
    dA, dD, ddt_bias, dinit = torch.ops.mamba2ssd.chunk_scan_bwd_into(*args, *into.values())
    for name, got, ref in [("dx", into["dx"], want[0]), ("ddt", into["ddt"], want[1]), ("dA", dA, want[2]),
                           ("dB", into["dB"], want[3]), ("dC", into["dC"], want[4]), ("dD", dD, want[5]),
                           ("dz", into["dz"], want[6]), ("ddt_bias", ddt_bias, want[7]),
                           ("dinitial_states", dinit, want[8])]:
        assert torch.equal(got, ref), name
    assert not xbc.isnan().any() and not zb[..., 1:].isnan().any() and not dtb[..., 1:-1].isnan().any()
    assert zb[..., 0].isnan().all() and dtb[..., 0].isnan().all() and dtb[..., -1].isnan().all()


@pytest.mark.parametrize("device", DEVICES)
def test_backward_into_bad_buffers_are_named(device):
    kw = make_problem(device=device, z=True)
    args = backward_args(kw) + ("auto", False, None)
    into = lambda **c: tuple(c.get(k, v) for k, v in _into_buffers(kw)[1].items())  # noqa: E731
    into_ = torch.ops.mamba2ssd.chunk_scan_bwd_into
    with pytest.raises(ValueError, match=r"backward: dx must have shape \[2, 160, 4, 32\], got \[2, 159, 4, 32\]"):
        into_(*args, *into(dx=torch.empty_like(kw["x"])[:, 1:]))
    with pytest.raises(ValueError, match=r"backward: dB must be Float, got BFloat16"):
        into_(*args, *into(dB=torch.empty_like(kw["B"], dtype=torch.bfloat16)))
    with pytest.raises(ValueError, match=r"backward: output dx overlaps input x"):
        into_(*args, *into(dx=kw["x"]))
    shared = torch.empty_like(kw["B"])
    with pytest.raises(ValueError, match=r"backward: output dB overlaps output dC"):
        into_(*args, *into(dB=shared, dC=shared))
    kw_plain = make_problem(device=device)
    with pytest.raises(ValueError, match=r"backward: dz is given but z is not"):
        into_(*(backward_args(kw_plain) + ("auto", False, None)), *_into_buffers(kw_plain)[1].values())
