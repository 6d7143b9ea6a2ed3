"""mamba2ssd.selective_state_update, the decode step: mamba_ssm's argument forms (A [H, P, N] and dt,
dt_bias, D expanded with stride 0), the library's own (per head, T tokens, destination slots), pads,
every cache dtype, bad input; on the CPU always, on the GPU where there is one (skipped visibly
otherwise), plus CUDA graphs and a comparison with mamba_ssm's Triton kernel (GPU only)."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest
import torch

import mamba2ssd
from problems import DEVICES, HAS_GPU, requires_cuda_backend

ssu = mamba2ssd.selective_state_update
STATE_DTYPES = [torch.float32, torch.bfloat16, torch.float16]


def decode_oracle(state, x, dt, A, B, C, D=None, z=None, dt_bias=None, softplus=False, limit=(0.0, float("inf")),
                  read=None, dst=None, pad=-1):
    """fp64 oracle in the library's layout: state [S, H, P, N], x [b, T, H, P], dt [b, T, H], A [H],
    B, C [b, T, G, N], D [H] or [H, P], read [b], dst [b, T]. Returns (out [b, T, H, P], the cache after,
    rounded to its dtype as the backends store it; unrounded for a fp32 cache)."""
    f = lambda t: None if t is None else t.detach().to("cpu", torch.float64)  # noqa: E731
    S0, x, dt, A, B, C, D, z, bias = f(state), f(x), f(dt), f(A), f(B), f(C), f(D), f(z), f(dt_bias)
    b, T, H, P = x.shape
    G, N = B.shape[2], B.shape[3]
    rep = H // G
    out = torch.zeros(b, T, H, P, dtype=torch.float64)
    after = S0.clone()
    indexed = read is not None  # the pad marks index entries only: without them request i reads slot i
    read = list(range(b)) if read is None else read.tolist()
    dst = None if dst is None else dst.reshape(b, T).tolist()
    S = S0.shape[0]
    for i in range(b):
        r = read[i]
        if (indexed and r == pad) or not 0 <= r < S:
            continue
        s = S0[r].clone()  # [H, P, N]
        for t in range(T):
            d = dt[i, t] + (bias if bias is not None else 0.0)
            if softplus:
                d = torch.where(d <= 20.0, torch.log1p(torch.exp(d)), d)
            d = d.clamp(min=limit[0], max=limit[1])
            Bt = B[i, t].repeat_interleave(rep, 0)  # [H, N]
            Ct = C[i, t].repeat_interleave(rep, 0)
            s = torch.exp(A * d)[:, None, None] * s + (d[:, None] * x[i, t])[:, :, None] * Bt[:, None, :]
            y = (s * Ct[:, None, :]).sum(-1)
            if D is not None:
                y = y + (D[:, None] if D.dim() == 1 else D) * x[i, t]
            if z is not None:
                y = y * z[i, t] * torch.sigmoid(z[i, t])
            out[i, t] = y
            target = (r if t == T - 1 else None) if dst is None else dst[i][t]
            if target is not None and target != pad and 0 <= target < S:
                after[target] = s
    return out, after


def rel(a, ref):
    a = a.detach().to("cpu", torch.float64)
    n = ref.norm().item()
    return ((a - ref).norm() / (n if n > 0 else 1.0)).item()


def check(out, state_after, ref, dtype, state_dtype, what=""):
    tol = mamba2ssd.decode_tolerance(dtype, state_dtype)
    out_ref, state_ref = ref
    assert torch.isfinite(out).all(), f"{what}: non-finite out"
    assert rel(out, out_ref) <= tol, f"{what}: out rel L2 {rel(out, out_ref):.3g} > {tol:.3g}"
    assert rel(state_after, state_ref) <= tol, f"{what}: state rel L2 {rel(state_after, state_ref):.3g} > {tol:.3g}"


def problem(b=6, T=1, H=4, P=32, G=2, N=32, S=None, dtype=torch.bfloat16, state_dtype=torch.float32, device="cpu",
            seed=0):
    g = torch.Generator().manual_seed(seed)
    S = S or b * (T + 1) + 3
    rn = lambda *s: torch.randn(*s, generator=g)  # noqa: E731
    kw = dict(
        state=rn(S, H, P, N).to(state_dtype),
        x=rn(b, T, H, P).to(dtype),
        dt=(torch.rand(b, T, H, generator=g) * 0.2 + 0.002),
        A=-torch.exp(torch.rand(H, generator=g) * 2.8 - 1.4),
        B=rn(b, T, G, N).to(dtype),
        C=rn(b, T, G, N).to(dtype),
        read=torch.randperm(S, generator=g)[:b].to(torch.int32),
    )
    return {k: v.to(device) for k, v in kw.items()}


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("state_dtype", STATE_DTYPES)
def test_mamba_ssm_forms(device, state_dtype):
    # Mamba-2's step in mamba_ssm: A, dt, dt_bias, D expanded over P (and N) with stride 0, T = 1.
    p = problem(device=device, state_dtype=state_dtype, seed=1)
    b, _, H, P = p["x"].shape
    N = p["state"].shape[-1]
    g = torch.Generator().manual_seed(2)
    D = torch.randn(H, generator=g).to(device)
    dt_bias = (torch.randn(H, generator=g) * 0.5).to(device)
    z = torch.randn(b, H, P, generator=g).to(device, p["x"].dtype)
    dt_raw = torch.randn(b, H, generator=g).to(device) * 0.5 - 3.0
    state = p["state"].clone()
    out = ssu(state, p["x"][:, 0], dt_raw[:, :, None].expand(b, H, P), p["A"][:, None, None].expand(H, P, N),
              p["B"][:, 0], p["C"][:, 0], D=D[:, None].expand(H, P), z=z, dt_bias=dt_bias[:, None].expand(H, P),
              dt_softplus=True, state_batch_indices=p["read"])
    assert out.shape == (b, H, P) and out.dtype == p["x"].dtype
    ref = decode_oracle(p["state"], p["x"], dt_raw[:, None], p["A"], p["B"], p["C"], D=D, z=z[:, None],
                        dt_bias=dt_bias, softplus=True, read=p["read"])
    check(out[:, None], state, ref, p["x"].dtype, state_dtype, "mamba_ssm forms")


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("state_dtype", STATE_DTYPES)
@pytest.mark.parametrize("P", [16, 80])
def test_head_dims_past_the_powers_of_two(device, state_dtype, P):
    # Nemotron-H's step (head dim 80, state 128, groups): rows past the head dim are no row of the cache.
    p = problem(b=5, H=4, P=P, G=2, N=128, device=device, state_dtype=state_dtype, seed=3)
    state = p["state"].clone()
    out = ssu(state, p["x"][:, 0], p["dt"][:, 0], p["A"], p["B"][:, 0], p["C"][:, 0], state_batch_indices=p["read"])
    ref = decode_oracle(p["state"], p["x"], p["dt"], p["A"], p["B"], p["C"], read=p["read"])
    check(out[:, None], state, ref, p["x"].dtype, state_dtype, f"head dim {P}")


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("state_dtype", STATE_DTYPES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_multi_token_destinations_pads(device, state_dtype, dtype):
    # T = 3 tokens, the state after each stored to its own slot, some pads; D per (head, dim); limit.
    p = problem(b=7, T=3, dtype=dtype, state_dtype=state_dtype, device=device, seed=3)
    b, T, H, P = p["x"].shape
    S = p["state"].shape[0]
    perm = torch.randperm(S, generator=torch.Generator().manual_seed(4)).to(torch.int32)
    read = perm[:b].clone()
    read[[1, 4]] = -1
    dst = perm[b:b + b * T].reshape(b, T).clone()
    dst[2, 0] = -1  # this token's state is not kept
    read, dst = read.to(device), dst.to(device)
    D = torch.randn(H, P).to(device)
    state = p["state"].clone()
    out = torch.full_like(p["x"], float("nan"))
    ret = ssu(state, p["x"], p["dt"], p["A"], p["B"], p["C"], D=D, state_batch_indices=read,
              dst_state_batch_indices=dst, out=out, dt_limit=(0.01, 0.15))
    assert ret is out
    ref = decode_oracle(p["state"], p["x"], p["dt"], p["A"], p["B"], p["C"], D=D, limit=(0.01, 0.15), read=read, dst=dst)
    check(out, state, ref, dtype, state_dtype, "multi-token")
    assert (out[[1, 4]] == 0).all(), "pad requests' out must be zero"
    # Read slots are not destinations here: they keep their bits.
    for r in read.tolist():
        if r >= 0:
            assert torch.equal(state[r], p["state"][r])


@pytest.mark.parametrize("device", DEVICES)
def test_in_place_without_indices(device):
    # No state_batch_indices: request b reads and writes slot b.
    p = problem(b=4, S=4, device=device, seed=5)
    state = p["state"].clone()
    out = ssu(state, p["x"][:, 0], p["dt"][:, 0], p["A"], p["B"][:, 0], p["C"][:, 0])
    ref = decode_oracle(p["state"], p["x"], p["dt"], p["A"], p["B"], p["C"])
    check(out[:, None], state, ref, p["x"].dtype, torch.float32, "in place")
    # pad_slot_id marks index entries only (as in mamba_ssm): request 1 still runs in slot 1.
    state = p["state"].clone()
    out = ssu(state, p["x"][:, 0], p["dt"][:, 0], p["A"], p["B"][:, 0], p["C"][:, 0], pad_slot_id=1)
    check(out[:, None], state, ref, p["x"].dtype, torch.float32, "in place, pad_slot_id 1")
    assert out[1].abs().sum() > 0 and not torch.equal(state[1], p["state"][1])


@pytest.mark.parametrize("device", DEVICES)
def test_one_head_form(device):
    # mamba_ssm's head-less form: state [S, P, N], x [b, P], dt [b, P] and A [P, N] expanded.
    p = problem(b=3, H=1, G=1, device=device, seed=6)
    b, _, _, P = p["x"].shape
    N = p["state"].shape[-1]
    state = p["state"][:, 0].clone()
    out = ssu(state, p["x"][:, 0, 0], p["dt"][:, 0, :].expand(b, P), p["A"].expand(P, N), p["B"][:, 0, 0],
              p["C"][:, 0, 0], state_batch_indices=p["read"])
    assert out.shape == (b, P)
    ref = decode_oracle(p["state"], p["x"], p["dt"], p["A"], p["B"], p["C"], read=p["read"])
    check(out[:, None, None], state[:, None], ref, p["x"].dtype, torch.float32, "one head")


@pytest.mark.parametrize("device", DEVICES)
def test_refusals(device):
    p = problem(device=device)
    b, _, H, P = p["x"].shape
    N = p["state"].shape[-1]
    args = lambda **kw: {**dict(state=p["state"].clone(), x=p["x"], dt=p["dt"], A=p["A"], B=p["B"], C=p["C"],  # noqa: E731
                                state_batch_indices=p["read"]), **kw}
    with pytest.raises(ValueError, match=r"A of shape \[4, 32, 32\] varies along dim 1"):
        ssu(**args(A=torch.randn(H, P, N, device=device)))
    with pytest.raises(ValueError, match=r"dt of shape .* varies along dim 3"):
        ssu(**args(dt=torch.rand(b, 1, H, P, device=device)))
    with pytest.raises(ValueError, match=r"selective_state_update: B must have x's dtype"):
        ssu(**args(B=p["B"].float()))
    with pytest.raises(ValueError, match=r"selective_state_update: C must have shape"):
        ssu(**args(C=p["C"][:, :, :1]))
    with pytest.raises(ValueError, match=r"selective_state_update: state's last dimension must be contiguous"):
        ssu(**args(state=p["state"].clone().transpose(2, 3)))
    with pytest.raises(ValueError, match=r"out must have x's shape"):
        ssu(**args(out=torch.empty(1, device=device)))
    # Per-head values expanded to other sizes than the head dim (and state size), and integer A:
    # taken before, as if per head.
    with pytest.raises(ValueError, match=r"A of shape \[4, 7, 3\]: its dims after the heads must be \[32\] or"):
        ssu(**args(A=p["A"][:, None, None].expand(H, 7, 3)))
    with pytest.raises(ValueError, match=r"dt of shape \[6, 1, 4, 5\]: its dims after the heads must be \[32\]"):
        ssu(**args(dt=p["dt"][..., None].expand(b, 1, H, 5)))
    with pytest.raises(ValueError, match=r"A must be a floating-point tensor, got torch.int64"):
        ssu(**args(A=torch.full((H,), -1, device=device)))
    with pytest.raises(ValueError, match=r"num_accepted_tokens must be an int32 or int64 tensor \[batch\]"):
        ssu(**args(state_batch_indices=torch.stack([p["read"], p["read"]], 1),
                   num_accepted_tokens=torch.ones(b, device=device)))
    with pytest.raises(ValueError, match=r"B must have x's rank 4 .*, got shape \[\]"):
        ssu(**args(B=torch.tensor(1.0, dtype=p["B"].dtype, device=device)))
    with pytest.raises(ValueError, match=r"A is on meta but state is on"):
        ssu(**args(A=p["A"].to("meta")))


def test_arguments_of_the_wrong_kind_are_named():
    p = problem(b=3, T=2)
    args = dict(state=p["state"].clone(), x=p["x"], dt=p["dt"], A=p["A"], B=p["B"], C=p["C"],
                state_batch_indices=p["read"])
    with pytest.raises(TypeError, match=r"selective_state_update: dt_limit must be a pair \(lo, hi\) of numbers, got None"):
        ssu(**args, dt_limit=None)
    with pytest.raises(TypeError, match=r"selective_state_update: pad_slot_id must be an integer, got None"):
        ssu(**args, pad_slot_id=None)
    # A destination per request ([b]) is the one-token form: with T = 2 the shape given is named.
    with pytest.raises(ValueError, match=r"dst_state_batch_indices \[b\] takes one token a request; with 2 tokens it "
                                         r"must be \[b, T\] = \[3, 2\], got \[3\]"):
        ssu(**args, dst_state_batch_indices=torch.tensor([7, 8, 9], dtype=torch.int32))


@pytest.mark.parametrize("device", DEVICES)
def test_x_of_any_strides(device):
    # out is made contiguous whatever x's strides (it followed them, and the op refused that out).
    p = problem(device=device)
    x = p["x"][:, 0].transpose(1, 2).contiguous().transpose(1, 2)  # [b, H, P], last stride H
    args = dict(dt=p["dt"][:, 0], A=p["A"], B=p["B"][:, 0], C=p["C"][:, 0], state_batch_indices=p["read"])
    out = ssu(p["state"].clone(), x, **args)
    assert torch.equal(out, ssu(p["state"].clone(), x.contiguous(), **args))


def test_cpu_refuses_bad_and_aliasing_slots():
    p = problem(b=3, S=8)
    base = dict(x=p["x"], dt=p["dt"], A=p["A"], B=p["B"], C=p["C"])
    state = p["state"].clone()
    with pytest.raises(ValueError, match=r"state_batch_indices\[1\] = 8 is outside the cache \[0, nslots 8\)"):
        ssu(state, **base, state_batch_indices=torch.tensor([0, 8, 2], dtype=torch.int32))
    # int64 entries past int32's range are refused by name, not wrapped onto another slot (2^32 + 1 -> 1).
    with pytest.raises(ValueError, match=r"state_batch_indices\[1\] = 4294967297 is outside the cache"):
        ssu(state, **base, state_batch_indices=torch.tensor([0, 2**32 + 1, 2], dtype=torch.int64))
    with pytest.raises(ValueError, match=r"dst_state_batch_indices\[2, 0\] = -4294967294 is outside the cache"):
        ssu(state, **base, state_batch_indices=torch.tensor([0, 1, 2]),
            dst_state_batch_indices=torch.tensor([[3], [4], [-2**32 + 2]], dtype=torch.int64))
    with pytest.raises(ValueError, match=r"both store to slot 5"):
        ssu(state, **base, state_batch_indices=torch.tensor([0, 1, 2], dtype=torch.int32),
            dst_state_batch_indices=torch.tensor([5, 5, 6], dtype=torch.int32))
    assert torch.equal(state, p["state"]), "a refused call must not touch the cache"


@requires_cuda_backend
def test_cuda_skips_slots_outside_the_cache():
    # The GPU cannot refuse without a synchronization: the entry counts as a pad, nothing is touched.
    p = problem(b=4, S=10, device="cuda", seed=7)
    read = torch.tensor([0, 10, -5, 3], dtype=torch.int32, device="cuda")
    state = p["state"].clone()
    out = ssu(state, p["x"][:, 0], p["dt"][:, 0], p["A"], p["B"][:, 0], p["C"][:, 0], state_batch_indices=read)
    torch.cuda.synchronize()
    assert (out[1] == 0).all() and (out[2] == 0).all()
    ref = decode_oracle(p["state"], p["x"], p["dt"], p["A"], p["B"], p["C"], read=read)
    check(out[:, None], state, ref, p["x"].dtype, torch.float32, "outside the cache")
    # An int64 entry past int32's range is outside the cache too, not wrapped onto slot 2 (2^32 + 2).
    wide = torch.tensor([0, 2**32 + 2, -5, 3], dtype=torch.int64, device="cuda")
    state = p["state"].clone()
    out = ssu(state, p["x"][:, 0], p["dt"][:, 0], p["A"], p["B"][:, 0], p["C"][:, 0], state_batch_indices=wide)
    torch.cuda.synchronize()
    assert (out[1] == 0).all() and torch.equal(state[2], p["state"][2])
    check(out[:, None], state, ref, p["x"].dtype, torch.float32, "int64 outside int32")


@requires_cuda_backend
def test_cuda_tensors_must_share_the_states_device():
    p = problem(b=2, device="cuda", seed=10)
    base = dict(x=p["x"][:, 0], dt=p["dt"][:, 0], A=p["A"], B=p["B"][:, 0], C=p["C"][:, 0])
    with pytest.raises(ValueError, match=r"selective_state_update: x is on cuda:0 but state is on cpu"):
        ssu(p["state"].cpu(), **base, state_batch_indices=p["read"])


@requires_cuda_backend
def test_cuda_graph_replay_and_no_sync():
    p = problem(b=16, H=8, G=1, N=128, P=64, device="cuda", seed=8)
    state = p["state"].clone()
    x, dt, B, C = (p[k][:, 0].clone() for k in ("x", "dt", "B", "C"))
    out = torch.empty_like(x)

    def step():
        ssu(state, x, dt, p["A"], B, C, state_batch_indices=p["read"], out=out)

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        torch.cuda.set_sync_debug_mode("error")  # an eager call may not synchronize either
        try:
            step()  # also the warm-up outside the capture
        finally:
            torch.cuda.set_sync_debug_mode("default")
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        step()
    state.copy_(p["state"])
    torch.cuda.set_sync_debug_mode("error")  # any host synchronization inside raises
    try:
        graph.replay()
    finally:
        torch.cuda.set_sync_debug_mode("default")
    torch.cuda.synchronize()
    ref = decode_oracle(p["state"], p["x"], p["dt"], p["A"], p["B"], p["C"], read=p["read"])
    check(out[:, None], state, ref, x.dtype, torch.float32, "graph replay")


@requires_cuda_backend
@pytest.mark.parametrize("state_dtype", STATE_DTYPES)
def test_cuda_matches_cpu(state_dtype):
    p = problem(b=9, T=2, H=8, G=2, P=64, N=128, state_dtype=state_dtype, seed=9)
    dst = torch.arange(9, 9 + 18, dtype=torch.int32).reshape(9, 2)
    runs = {}
    for device in ("cpu", "cuda"):
        q = {k: v.to(device) for k, v in p.items()}
        state = q["state"].clone()
        out = ssu(state, q["x"], q["dt"], q["A"], q["B"], q["C"], state_batch_indices=q["read"] % 9,
                  dst_state_batch_indices=dst.to(device), dt_softplus=True)
        runs[device] = (out.cpu(), state.cpu())
    tol = mamba2ssd.decode_tolerance(p["x"].dtype, state_dtype)
    assert rel(runs["cuda"][0], runs["cpu"][0].double()) <= tol
    assert rel(runs["cuda"][1], runs["cpu"][1].double()) <= tol


# --- against mamba_ssm's Triton selective_state_update (GPU only) ------------------------------

def _peer():
    if not HAS_GPU or not mamba2ssd.has_cuda_backend():
        pytest.skip("the peer (Triton) needs a CUDA device and the CUDA backend")
    peers = Path(__file__).resolve().parents[2] / ".peers"
    if (peers / "mamba_ssm").is_dir() and str(peers) not in sys.path:
        sys.path.insert(0, str(peers))
        sys.path.append(str(peers / "_deps"))
    module = pytest.importorskip("mamba_ssm.ops.triton.selective_state_update")
    return module.selective_state_update


@pytest.mark.parametrize("state_dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("ngroups", [1, 4])
def test_against_mamba_ssm(state_dtype, ngroups):
    peer = _peer()
    torch.manual_seed(10)
    b, S, H, P, N = 32, 40, 16, 64, 128
    dev = "cuda"
    state0 = torch.randn(S, H, P, N, device=dev).to(state_dtype)
    x = torch.randn(b, H, P, device=dev, dtype=torch.bfloat16)
    dt = torch.randn(b, H, device=dev) * 0.5 - 3.0
    A = -torch.rand(H, device=dev) * 2 - 0.1
    B = torch.randn(b, ngroups, N, device=dev, dtype=torch.bfloat16)
    C = torch.randn(b, ngroups, N, device=dev, dtype=torch.bfloat16)
    D = torch.randn(H, device=dev)
    dt_bias = torch.randn(H, device=dev) * 0.5
    z = torch.randn(b, H, P, device=dev, dtype=torch.bfloat16)
    idx = torch.randperm(S, device=dev)[:b].to(torch.int32)
    # mamba_ssm's Mamba-2 step: everything expanded over P (and N).
    exp = dict(dt=dt[:, :, None].expand(b, H, P), A=A[:, None, None].expand(H, P, N), D=D[:, None].expand(H, P),
               dt_bias=dt_bias[:, None].expand(H, P))
    s_peer, s_ours = state0.clone(), state0.clone()
    y_peer = peer(s_peer, x, exp["dt"], exp["A"], B, C, D=exp["D"], z=z, dt_bias=exp["dt_bias"], dt_softplus=True,
                  state_batch_indices=idx)
    y_ours = ssu(s_ours, x, exp["dt"], exp["A"], B, C, D=exp["D"], z=z, dt_bias=exp["dt_bias"], dt_softplus=True,
                 state_batch_indices=idx)
    torch.cuda.synchronize()
    ref = decode_oracle(state0, x[:, None], dt[:, None], A, B[:, None], C[:, None], D=D, z=z[:, None],
                        dt_bias=dt_bias, softplus=True, read=idx)
    tol = mamba2ssd.decode_tolerance(x.dtype, state_dtype)
    check(y_ours[:, None], s_ours, ref, x.dtype, state_dtype, "ours")
    # The peer against the same oracle, and the two against each other.
    assert rel(y_peer[:, None], ref[0]) <= tol, f"peer out {rel(y_peer[:, None], ref[0]):.3g}"
    assert rel(y_ours, y_peer.double().cpu()) <= 2 * tol
    assert rel(s_ours, s_peer.double().cpu()) <= 2 * tol


def test_decode_tolerance_table():
    assert mamba2ssd.decode_tolerance(torch.bfloat16, torch.float32) == mamba2ssd.decode_tolerance(torch.float32, torch.bfloat16)
    assert mamba2ssd.decode_tolerance(torch.float32, torch.float32) < mamba2ssd.decode_tolerance(torch.float16, torch.float32)
    with pytest.raises(ValueError, match="decode_tolerance: dtype must be"):
        mamba2ssd.decode_tolerance(torch.int32, torch.float32)


def test_compile_fullgraph_updates_the_cache():
    # Engines compile their step: the op's mutations (state, out) must survive functionalization.
    p = problem(b=3, S=8, seed=11)
    args = (p["x"][:, 0], p["dt"][:, 0], p["A"], p["B"][:, 0], p["C"][:, 0])
    eager_state = p["state"].clone()
    eager = ssu(eager_state, *args, state_batch_indices=p["read"])
    step = torch.compile(lambda s, *a: ssu(s, *a, state_batch_indices=p["read"]), fullgraph=True)
    state = p["state"].clone()
    out = step(state, *args)
    assert torch.equal(out, eager)
    assert torch.equal(state, eager_state)
    assert not torch.equal(state, p["state"])


def test_dt_limit_is_judged_as_given_not_as_its_float():
    # Narrowed to float first, -1e-50 became -0, which passed as >= 0, and (0, -1e-50) passed lo <= hi.
    p = problem()
    args = dict(state_batch_indices=p["read"])
    with pytest.raises(ValueError, match=r"^selective_state_update: dt_limit lower bound must be >= 0, got -1e-50$"):
        ssu(p["state"].clone(), p["x"], p["dt"], p["A"], p["B"], p["C"], dt_limit=(-1e-50, 1.0), **args)
    with pytest.raises(ValueError, match=r"^selective_state_update: dt_limit must satisfy lo <= hi, "
                                         r"got \(0, -1e-50\)$"):
        ssu(p["state"].clone(), p["x"], p["dt"], p["A"], p["B"], p["C"], dt_limit=(0.0, -1e-50), **args)


def test_sizes_past_the_limits_are_refused_before_out_is_allocated():
    # out (x's shape) was allocated before the op's checks: an x expanded past the limits (a view of
    # one request) failed in the allocator, unnamed.
    p = problem(b=1)
    _, _, H, P = p["x"].shape
    one = dict(x=p["x"][:, 0], dt=p["dt"][:, 0], B=p["B"][:, 0], C=p["C"][:, 0])  # [1, H, P]: one token
    b = 2**40
    big = {k: v.expand(b, *v.shape[1:]) for k, v in one.items()}
    with pytest.raises(ValueError, match=r"^selective_state_update: batch must be < 2\^31, got 1099511627776$"):
        ssu(p["state"].clone(), big["x"], big["dt"], p["A"], big["B"], big["C"])
    b, T = 2**30, 2**22  # [b, T, H, P]: T tokens, 2^58 elements
    big = {k: v[:, None].expand(b, T, *v.shape[1:]) for k, v in one.items()}
    with pytest.raises(ValueError, match=r"^selective_state_update: batch \* ntokens \* nheads \* headdim = 1073741824 "
                                         r"\* 4194304 \* 4 \* 32 is more than 2\^56 elements$"):
        ssu(p["state"].clone(), big["x"], big["dt"], p["A"], big["B"], big["C"])


@pytest.mark.parametrize("device", DEVICES)
def test_num_accepted_tokens_picks_the_read_slot(device):
    # vLLM's speculative form: the previous step stored its K = 3 tokens' states to slots [b, 3];
    # request b continues from the state after its last accepted token.
    p = problem(b=4, T=3, S=24, device=device, seed=12)
    slots = torch.arange(12, dtype=torch.int32).reshape(4, 3).to(device)
    accepted = torch.tensor([1, 3, 2, 0], device=device)  # 0: nothing accepted, the first slot (as vLLM)
    dst = torch.arange(12, 24, dtype=torch.int32).reshape(4, 3).to(device)  # this step's states
    state = p["state"].clone()
    out = ssu(state, p["x"], p["dt"], p["A"], p["B"], p["C"], state_batch_indices=slots,
              dst_state_batch_indices=dst, num_accepted_tokens=accepted)
    read = torch.tensor([0, 5, 7, 9], dtype=torch.int32)
    ref = decode_oracle(p["state"], p["x"], p["dt"], p["A"], p["B"], p["C"], read=read, dst=dst)
    check(out, state, ref, p["x"].dtype, torch.float32, "num_accepted_tokens")
    # Counts outside [1, K] are clamped, not checked (a check would read them on the host: a sync on
    # the GPU): 9 reads the last slot, -4 the first (docs/reliability.md).
    state_clamped = p["state"].clone()
    out_clamped = ssu(state_clamped, p["x"], p["dt"], p["A"], p["B"], p["C"], state_batch_indices=slots,
                      dst_state_batch_indices=dst, num_accepted_tokens=torch.tensor([1, 9, 2, -4], device=device))
    assert torch.equal(out_clamped, out) and torch.equal(state_clamped, state)
