"""Strided inputs: views with a contiguous last dimension are read in place; others are copied."""

import pytest
import torch

import mamba2ssd

from problems import DEVICES, DTYPES, make_problem, run_and_check


def widen(t, extra=8):
    """The same values as t, as a view into a larger buffer (last dim contiguous, other strides not)."""
    big = torch.zeros(*t.shape[:-1], t.shape[-1] + extra, dtype=t.dtype, device=t.device)
    big[..., : t.shape[-1]] = t
    return big[..., : t.shape[-1]]


def seq_major(t):
    """The same values as t [b, L, ...], stored [L, b, ...] (batch and token strides swapped)."""
    return t.transpose(0, 1).contiguous().transpose(0, 1)


def last_dim_strided(t):
    """The same values with a last-dimension stride of 2 (must be copied before use)."""
    big = torch.zeros(*t.shape[:-1], 2 * t.shape[-1], dtype=t.dtype, device=t.device)
    big[..., ::2] = t
    return big[..., ::2]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("layout", ["widened", "seq_major", "last_dim_strided"])
def test_strided_inputs(device, dtype, layout):
    kw = make_problem(device=device, dtype=dtype, z=True, D="dim", dt_bias=True, initial_states=True,
                      seqlens=[100, 60], seq_idx=True)
    view = {"widened": widen, "seq_major": seq_major, "last_dim_strided": last_dim_strided}[layout]
    for name in ("x", "dt", "B", "C", "z", "initial_states", "seq_idx", "D", "A", "dt_bias"):
        kw[name] = view(kw[name]) if kw[name].dim() >= 2 or layout == "last_dim_strided" else kw[name]
    if layout != "last_dim_strided":
        assert not kw["x"].is_contiguous() and kw["x"].stride(-1) == 1
    run_and_check(kw)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_inputs_expanded_over_batch_and_tokens(device, dtype):
    # torch's expand(): x, z and C one batch row for every row, B and dt one token's for every token,
    # the initial states one row's (stride 0); read in place like any view, as the oracle reads them.
    kw = make_problem(b=3, L=150, device=device, dtype=dtype, z=True, D="dim", dt_bias=True, initial_states=True)
    b, L = kw["x"].shape[:2]
    for name in ("x", "z", "C", "initial_states"):
        kw[name] = kw[name][:1].expand(b, *kw[name].shape[1:])
    for name in ("B", "dt"):
        kw[name] = kw[name][:, :1].expand(b, L, *kw[name].shape[2:])
    assert kw["x"].stride(0) == 0 and kw["B"].stride(1) == 0
    run_and_check(kw)


@pytest.mark.parametrize("device", DEVICES)
def test_gradients_through_expanded_inputs(device):
    # The backward of expanded inputs: each gradient per element of the view, which autograd sums
    # into the leaf; the same sums as through a materialized copy (repeat).
    kw = make_problem(b=3, L=130, device=device, z=True, D="dim", initial_states=True)
    b = kw["x"].shape[0]
    leaves = {n: kw[n][:1].clone().requires_grad_() for n in ("x", "C", "initial_states")}
    weights = torch.randn(kw["x"].shape, generator=torch.Generator().manual_seed(3)).to(device)

    def grads(expand):
        args = dict(kw)
        for n, leaf in leaves.items():
            args[n] = leaf.expand(b, *leaf.shape[1:]) if expand else leaf.repeat(b, *[1] * (leaf.dim() - 1))
        y = mamba2ssd.mamba_chunk_scan_combined(**args)
        return torch.autograd.grad((y * weights).sum(), list(leaves.values()))

    for name, got, want in zip(leaves, grads(True), grads(False)):
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5, msg=lambda m: f"d{name}: {m}")


@pytest.mark.parametrize("device", DEVICES)
def test_broadcast_groups(device):
    # B and C expanded from one group to every head (stride 0), as a caller might pass them.
    kw = make_problem(H=4, G=1, device=device, D="head")
    kw4 = dict(kw, B=kw["B"].expand(-1, -1, 4, -1), C=kw["C"].expand(-1, -1, 4, -1))
    assert kw4["B"].stride(2) == 0
    run_and_check(kw4)


@pytest.mark.parametrize("device", DEVICES)
def test_sliced_batch_and_heads(device):
    # A batch/token slice of larger tensors: storage offsets and strides pass through.
    big = make_problem(b=3, L=200, device=device, z=True, initial_states=True)
    kw = dict(big)
    for name in ("x", "dt", "B", "C", "z"):
        kw[name] = big[name][1:, 20:180]
    kw["initial_states"] = big["initial_states"][1:]
    run_and_check(kw)
