"""Gradients against mamba_ssm 2.3.2.post1's (the peer's) on the same inputs, when it can be imported
and a GPU runs it (from PYTHONPATH, or the git-ignored .peers/ of scripts/get_peers.sh, as
test_peer.py). Both against torch.autograd through the float64 recurrence: ours within the tolerance
table and no worse than the peer's error (plus a small slack), and ours close to the peer's. The peer
takes no gradient through varlen states, and needs seq_idx next to cu_seqlens."""

import os
import sys
from pathlib import Path

import pytest
import torch

import mamba2ssd
from gradients import SUMS, assert_gradients_close, cotangents, op_gradients, reference_gradients
from problems import DTYPES, HAS_GPU, make_problem, rel_l2

if not HAS_GPU:
    pytest.skip("the peer (Triton) needs a CUDA device", allow_module_level=True)
os.environ.setdefault("MAMBA_DETERMINISTIC", "1")  # one autotune config per kernel, as test_peer.py
_PEERS = Path(__file__).resolve().parents[2] / ".peers"
if (_PEERS / "mamba_ssm").is_dir() and str(_PEERS) not in sys.path:
    sys.path.insert(0, str(_PEERS))
    sys.path.append(str(_PEERS / "_deps"))
ssd_combined = pytest.importorskip("mamba_ssm.ops.triton.ssd_combined")
peer = ssd_combined.mamba_chunk_scan_combined

CASES = {
    "plain": dict(),
    "z_D_head": dict(z=True, D="head"),
    "D_dim": dict(D="dim"),
    "softplus_bias_limit": dict(dt_softplus=True, dt_bias=True, dt_limit=(0.01, 0.2)),
    "initial_states": dict(initial_states=True),
    "seq_idx": dict(seqlens=[50, 1, 45, 204], seq_idx=True),
    "packed": dict(b=1, seqlens=[37, 90, 173], seq_idx=True, cu_seqlens=True),
    "everything": dict(b=1, z=True, D="dim", dt_bias=True, dt_softplus=True, seqlens=[64, 30, 206], seq_idx=True,
                       cu_seqlens=True, initial_states=True),
}


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("case", list(CASES))
def test_gradients_against_peer(case, dtype):
    kw = make_problem(L=300, H=4, P=64, N=64, G=2, chunk_size=128, dtype=dtype, device="cuda", **CASES[case])
    cots = cotangents(kw)
    want = reference_gradients(kw, cots)
    theirs = op_gradients(kw, cots, fn=peer)
    ours = op_gradients(kw, cots)
    errors = assert_gradients_close(ours, want, dtype)
    for name in ours:
        tol = mamba2ssd.backward_tolerance(dtype, sum=name in SUMS)
        peer_error = rel_l2(theirs[name], want[name])
        assert errors[name] <= max(1.25 * peer_error, 0.25 * tol), \
            f"d{name}: ours {errors[name]:.3g} vs the oracle, worse than the peer's {peer_error:.3g}"
        assert rel_l2(ours[name], theirs[name].double().cpu()) <= 2 * tol, f"d{name}: ours vs peer"
