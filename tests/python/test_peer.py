"""Against mamba_ssm 2.3.2.post1's mamba_chunk_scan_combined (the peer), when it can be imported and
a GPU runs it: from PYTHONPATH, or from the git-ignored .peers/ that scripts/get_peers.sh lays out
(its .peers/_deps goes last on the path, so installed copies win). Every argument combination the two
share: the peer needs seq_idx alongside cu_seqlens to restart sequences, and returns varlen states in
C's dtype where mamba2ssd returns fp32."""

import os
import sys
from pathlib import Path

import pytest
import torch

import mamba2ssd
from problems import DTYPES, HAS_GPU, assert_close, make_problem, oracle, rel_l2

if not HAS_GPU:
    pytest.skip("the peer (Triton) needs a CUDA device", allow_module_level=True)
# One autotune config per peer kernel (its deterministic mode picks the cheapest): the comparison is
# about values, and autotuning every config of every kernel variant costs minutes of GPU time.
os.environ.setdefault("MAMBA_DETERMINISTIC", "1")
_PEERS = Path(__file__).resolve().parents[2] / ".peers"
if (_PEERS / "mamba_ssm").is_dir() and str(_PEERS) not in sys.path:
    sys.path.insert(0, str(_PEERS))
    sys.path.append(str(_PEERS / "_deps"))
ssd_combined = pytest.importorskip("mamba_ssm.ops.triton.ssd_combined")
peer = ssd_combined.mamba_chunk_scan_combined

CASES = {
    "plain": {},
    "z_D_head": dict(z=True, D="head"),
    "D_dim": dict(D="dim"),
    "softplus_bias_limit": dict(dt_softplus=True, dt_bias=True, dt_limit=(0.01, 0.2)),
    "initial_final": dict(initial_states=True, final=True),
    "seq_idx": dict(seqlens=[50, 1, 45, 64], seq_idx=True, final=True),
    "seq_idx_initial": dict(seqlens=[100, 60], seq_idx=True, initial_states=True, final=True),
    "varlen": dict(b=1, seqlens=[37, 90, 33], seq_idx=True, cu_seqlens=True, varlen=True, final=True),
    # Initial states with varlen states only where the first sequence outlasts the first chunk: the
    # peer leaves them out of a first sequence that ends inside chunk 0 (its chunk_state_varlen adds
    # the state entering a chunk only to sequences that started before it); the contract keeps them.
    "varlen_initial": dict(b=1, seqlens=[200, 50, 50], seq_idx=True, cu_seqlens=True, varlen=True, final=True,
                           initial_states=True),
    "everything": dict(b=1, z=True, D="dim", dt_bias=True, dt_softplus=True, seqlens=[64, 30, 66], seq_idx=True,
                       cu_seqlens=True, varlen=True, final=True),
}

OUR_DEVICES = ["cpu"] + (["cuda"] if mamba2ssd.has_cuda_backend() else [])


def compare_with_peer(case, dtype, chunk_size, L, G):
    opts = dict(CASES[case])
    final, varlen = opts.pop("final", False), opts.pop("varlen", False)
    if "seqlens" in opts:  # stretch the last sequence to L
        lens = opts["seqlens"]
        opts["seqlens"] = lens[:-1] + [L - sum(lens[:-1])]
    kw = make_problem(L=L, G=G, H=4, chunk_size=chunk_size, dtype=dtype, device="cuda", **opts)
    flags = dict(return_final_states=final, return_varlen_states=varlen)
    theirs = peer(**kw, **flags)
    theirs = theirs if isinstance(theirs, tuple) else (theirs,)
    refs = oracle(kw)
    names = ["y"] + (["final_states"] if final else []) + (["varlen_states"] if varlen else [])
    ref_of = {"y": refs[0], "final_states": refs[1], "varlen_states": refs[2]}
    tol = mamba2ssd.tolerance(dtype)
    for name, t in zip(names, theirs):  # is the contract the peer's function?
        assert rel_l2(t, ref_of[name]) <= 2 * tol, f"{name}: peer vs oracle {rel_l2(t, ref_of[name]):.3g}"
    for device in OUR_DEVICES:  # ours on each device, against the oracle and against the peer
        ours = mamba2ssd.mamba_chunk_scan_combined(
            **{k: (v.to(device) if isinstance(v, torch.Tensor) else v) for k, v in kw.items()}, **flags)
        ours = ours if isinstance(ours, tuple) else (ours,)
        assert len(ours) == len(theirs)
        for name, o, t in zip(names, ours, theirs):
            assert o.shape == t.shape, name
            if name == "y":
                assert o.dtype == t.dtype == dtype
            assert_close(o, ref_of[name], dtype, f"{device} {name}")
            err = rel_l2(o, t.double().cpu())
            assert err <= 2 * tol, f"{device} {name}: ours vs peer {err:.3g}"


@pytest.mark.parametrize("case", list(CASES))
def test_features_against_peer(case):
    compare_with_peer(case, torch.bfloat16, 128, 300, 2)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("chunk_size,L,G", [(64, 160, 2), (128, 300, 1), (256, 300, 4)])
@pytest.mark.parametrize("case", ["seq_idx_initial", "everything"])
def test_dtypes_and_chunks_against_peer(case, dtype, chunk_size, L, G):
    compare_with_peer(case, dtype, chunk_size, L, G)
