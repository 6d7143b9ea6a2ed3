"""Packed sequences: cu_seqlens with and without seq_idx, varlen states, ragged and empty sequences."""

import pytest
import torch

import mamba2ssd
from problems import DEVICES, DTYPES, make_problem, oracle, run_and_check

SEQLENS = {
    "ragged": [37, 1, 90, 32],
    "chunk_aligned": [64, 64, 32],
    "one": [160],
    "empty_inside": [50, 0, 110],
    "empty_first_and_last": [0, 100, 60, 0],
    "many_short": [5] * 32,
}


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("with_seq_idx", [False, True], ids=["cu_seqlens_only", "with_seq_idx"])
@pytest.mark.parametrize("name", list(SEQLENS))
def test_varlen_states(device, with_seq_idx, name):
    kw = make_problem(b=1, L=160, seqlens=SEQLENS[name], cu_seqlens=True, seq_idx=with_seq_idx, device=device,
                      z=True, D="head")
    run_and_check(kw, return_final_states=True, return_varlen_states=True)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("chunk_size", [64, 128, 256])
def test_varlen_dtypes_chunks(device, dtype, chunk_size):
    kw = make_problem(b=1, L=300, seqlens=[130, 2, 100, 68], cu_seqlens=True, dtype=dtype, chunk_size=chunk_size,
                      device=device, dt_softplus=True, dt_bias=True)
    run_and_check(kw, return_final_states=False, return_varlen_states=True)


@pytest.mark.parametrize("device", DEVICES)
def test_cu_seqlens_alone_restarts_sequences(device):
    # Beyond mamba_ssm: cu_seqlens without seq_idx is enough; y equals the run with the seq_idx it implies.
    kw = make_problem(b=1, L=160, seqlens=[37, 1, 90, 32], cu_seqlens=True, seq_idx=True, device=device)
    with_ids = mamba2ssd.mamba_chunk_scan_combined(**kw)
    kw_alone = {k: v for k, v in kw.items() if k != "seq_idx"}
    alone = mamba2ssd.mamba_chunk_scan_combined(**kw_alone)
    run_and_check(kw_alone)
    torch.testing.assert_close(alone, with_ids, rtol=1e-5, atol=1e-5)
    # And it is not the unpacked answer: the state does restart.
    no_packing = mamba2ssd.mamba_chunk_scan_combined(**{k: v for k, v in kw_alone.items() if k != "cu_seqlens"})
    assert not torch.allclose(alone, no_packing, rtol=1e-3, atol=1e-3)


@pytest.mark.parametrize("device", DEVICES)
def test_initial_states_reach_the_first_sequence_only(device):
    kw = make_problem(b=1, L=160, seqlens=[100, 60], cu_seqlens=True, initial_states=True, device=device)
    y, fs, vs = run_and_check(kw, return_final_states=True, return_varlen_states=True)
    kw_zero = dict(kw, initial_states=torch.zeros_like(kw["initial_states"]))
    y0, vs0 = mamba2ssd.mamba_chunk_scan_combined(**kw_zero, return_varlen_states=True)
    assert not torch.allclose(y[:, :100], y0[:, :100])
    torch.testing.assert_close(y[:, 100:], y0[:, 100:], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(vs[1], vs0[1], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("device", DEVICES)
def test_seq_idx_decides_when_both_given(device):
    # seq_idx drives the restarts; cu_seqlens then only says where the varlen states are read.
    kw = make_problem(b=1, L=160, seqlens=[80, 80], cu_seqlens=True, device=device)
    kw["seq_idx"] = torch.zeros(1, 160, dtype=torch.int32, device=device)  # one sequence for the recurrence
    run_and_check(kw, return_final_states=True, return_varlen_states=True)
    _, _, varlen_ref = oracle(kw)
    y_one = mamba2ssd.mamba_chunk_scan_combined(**{k: v for k, v in kw.items() if k != "cu_seqlens"})
    y_both = mamba2ssd.mamba_chunk_scan_combined(**kw)
    torch.testing.assert_close(y_both, y_one, rtol=1e-5, atol=1e-5)
    assert varlen_ref.shape[0] == 2


@pytest.mark.parametrize("device", DEVICES)
def test_int64_cu_seqlens_and_seq_idx(device):
    kw = make_problem(b=1, L=160, seqlens=[37, 123], cu_seqlens=True, seq_idx=True, device=device)
    kw = dict(kw, cu_seqlens=kw["cu_seqlens"].long(), seq_idx=kw["seq_idx"].long())
    run_and_check(kw, return_varlen_states=True)
