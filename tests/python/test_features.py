"""Every feature of mamba_chunk_scan_combined against the fp64 oracle, on each device."""

import pytest
import torch

import mamba2ssd
from problems import DEVICES, DTYPES, make_problem, run_and_check

FEATURES = {
    "plain": {},
    "z": dict(z=True),
    "D_head": dict(D="head"),
    "D_dim": dict(D="dim"),
    "dt_bias": dict(dt_bias=True),
    "softplus": dict(dt_softplus=True),
    "softplus_bias": dict(dt_softplus=True, dt_bias=True),
    "dt_limit": dict(dt_limit=(0.02, 0.06)),
    "softplus_bias_limit": dict(dt_softplus=True, dt_bias=True, dt_limit=(0.03, 0.2)),
    "initial_states": dict(initial_states=True),
    "seq_idx": dict(seqlens=[50, 1, 45, 64], seq_idx=True),
    "seq_idx_initial_states": dict(seqlens=[70, 90], seq_idx=True, initial_states=True),
    "everything": dict(z=True, D="dim", dt_bias=True, dt_softplus=True, dt_limit=(0.0, 0.5),
                       initial_states=True, seqlens=[64, 30, 66], seq_idx=True),
}


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("feature", list(FEATURES))
def test_feature(device, feature):
    run_and_check(make_problem(device=device, **FEATURES[feature]))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("chunk_size", [64, 128, 256])
@pytest.mark.parametrize("L", [1, 63, 128, 300])
def test_dtype_chunk_length(device, dtype, chunk_size, L):
    # Ragged lengths: shorter than a chunk, exactly chunks, and a partial last chunk.
    run_and_check(make_problem(L=L, chunk_size=chunk_size, dtype=dtype, device=device, z=True, D="head",
                               initial_states=True, seed=L))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("x_dtype", DTYPES, ids=str)
@pytest.mark.parametrize("dt_dtype", DTYPES, ids=str)
def test_dt_dtype(device, x_dtype, dt_dtype):
    run_and_check(make_problem(dtype=x_dtype, dt_dtype=dt_dtype, device=device, dt_softplus=True, dt_bias=True))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("H,G", [(4, 1), (4, 2), (4, 4), (6, 3)])
def test_groups(device, H, G):
    run_and_check(make_problem(H=H, G=G, device=device, D="head"))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("P,N", [(32, 16), (64, 64), (128, 32), (32, 256), (80, 128), (48, 48)])
def test_head_and_state_sizes(device, P, N):
    run_and_check(make_problem(b=1, L=96, H=2, G=1, P=P, N=N, device=device, initial_states=True))


@pytest.mark.parametrize("device", DEVICES)
def test_return_forms(device):
    kw = make_problem(b=1, L=100, seqlens=[40, 60], cu_seqlens=True, device=device)
    f = mamba2ssd.mamba_chunk_scan_combined
    y = f(**kw)
    assert isinstance(y, torch.Tensor) and y.shape == kw["x"].shape and y.dtype == kw["x"].dtype
    y2, fs = f(**kw, return_final_states=True)
    assert fs.shape == (1, 4, 32, 16) and fs.dtype == torch.float32
    y3, vs = f(**kw, return_varlen_states=True)
    assert vs.shape == (2, 4, 32, 16) and vs.dtype == torch.float32
    y4, fs4, vs4 = f(**kw, return_final_states=True, return_varlen_states=True)
    for other in (y2, y3, y4):
        torch.testing.assert_close(other, y, rtol=0, atol=0)
    torch.testing.assert_close(fs4, fs, rtol=0, atol=0)
    torch.testing.assert_close(vs4, vs, rtol=0, atol=0)


@pytest.mark.parametrize("device", DEVICES)
def test_defaults_match_explicit_arguments(device):
    kw = make_problem(device=device)
    y = mamba2ssd.mamba_chunk_scan_combined(kw["x"], kw["dt"], kw["A"], kw["B"], kw["C"], 64)
    y_explicit = mamba2ssd.mamba_chunk_scan_combined(
        kw["x"], kw["dt"], kw["A"], kw["B"], kw["C"], 64, D=None, z=None, dt_bias=None, initial_states=None,
        seq_idx=None, cu_seqlens=None, dt_softplus=False, dt_limit=(0.0, float("inf")),
        return_final_states=False, return_varlen_states=False)
    torch.testing.assert_close(y, y_explicit, rtol=0, atol=0)


@pytest.mark.parametrize("device", DEVICES)
def test_small_parameters_of_other_dtypes(device):
    # A, D and dt_bias may come in any float dtype (as with mamba_ssm); initial_states too.
    kw = make_problem(device=device, D="dim", dt_bias=True, initial_states=True)
    kw64 = dict(kw, A=kw["A"].double(), D=kw["D"].half(), dt_bias=kw["dt_bias"].double(),
                initial_states=kw["initial_states"].bfloat16())
    run_and_check(kw64)
