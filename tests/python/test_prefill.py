"""mamba2ssd.prefill, the packed prefill with per-request cache slots (docs/serving.md, "Packed
prefill"): against a float64 token-by-token recurrence written here, every feature (D per head and
per (head, dim), z, dt_bias with softplus, dt_limit, groups, mixed has_initial_state, pad slots,
requests of 0 tokens, every cache dtype), intermediate states every k tokens, out=, the packed
[1, T, ...] form, seq_idx, bad input naming the parameter, opcheck and torch.compile(fullgraph=True)
on the CPU; on a GPU (skipped, visibly, without one or without the CUDA backend) prefill_cuda
against the CPU prefill and the recurrence for every cache dtype and chunk 64 and 256, slots it
skips, the tensors' devices, CUDA graph capture and replay, and torch.compile."""

from __future__ import annotations

import pytest
import torch

import mamba2ssd
from problems import requires_cuda_backend

STATE_DTYPES = [torch.float32, torch.bfloat16, torch.float16]


def prefill_oracle(state, x, dt, A, B, C, cu_seqlens, slots, has_initial_state=None, D=None, z=None, dt_bias=None,
                   softplus=False, limit=(0.0, float("inf")), pad=-1, state_every=0, intermediate_slots=None):
    """fp64, one token after another per request. state [nslots, H, P, N], x [T, H, P], dt [T, H],
    B, C [T, G, N]; intermediate_slots [S, M]: with state_every k, request s's state after its
    (m*k)-th token goes to slot intermediate_slots[s, m-1] (m <= M; pad entries and pad requests store
    nothing). Returns (y [T, H, P], {slot: the fp64 state stored there})."""
    f = lambda t: None if t is None else t.detach().to("cpu", torch.float64)  # noqa: E731
    cache, x, dt, A, B, C, D, z, bias = f(state), f(x), f(dt), f(A), f(B), f(C), f(D), f(z), f(dt_bias)
    T, H, P = x.shape
    G, N = B.shape[1], B.shape[2]
    rep = H // G
    y = torch.zeros(T, H, P, dtype=torch.float64)
    stored = {}
    cu, slots = cu_seqlens.tolist(), slots.tolist()
    init = [True] * len(slots) if has_initial_state is None else [bool(v) for v in has_initial_state.tolist()]
    boundary = intermediate_slots.tolist() if intermediate_slots is not None else [[] for _ in slots]
    for r, slot in enumerate(slots):
        padded = slot == pad
        s = cache[slot].clone() if not padded and init[r] else torch.zeros(H, P, N, dtype=torch.float64)
        for t in range(cu[r], cu[r + 1]):
            d = dt[t] + (bias if bias is not None else 0.0)
            if softplus:
                d = torch.where(d <= 20.0, torch.log1p(torch.exp(d)), d)
            d = d.clamp(min=limit[0], max=limit[1])
            Bt, Ct = B[t].repeat_interleave(rep, 0), C[t].repeat_interleave(rep, 0)  # [H, N]
            s = torch.exp(A * d)[:, None, None] * s + (d[:, None] * x[t])[:, :, None] * Bt[:, None, :]
            out = (s * Ct[:, None, :]).sum(-1)
            if D is not None:
                out = out + (D[:, None] if D.dim() == 1 else D) * x[t]
            if z is not None:
                out = out * z[t] * torch.sigmoid(z[t])
            y[t] = out
            done = t + 1 - cu[r]
            if state_every and not padded and done % state_every == 0 and done // state_every <= len(boundary[r]):
                to = boundary[r][done // state_every - 1]
                if to != pad:
                    stored[to] = s.clone()
        if not padded:
            stored[slot] = s
    return y, stored


def rel(a, ref):
    a = a.detach().to("cpu", torch.float64)
    n = ref.norm().item()
    return ((a - ref).norm() / (n if n > 0 else 1.0)).item()


def check(y, state_after, state_before, ref, dtype, state_dtype, what=""):
    """y and the stored slots within the prefill's tolerance; every other slot bit for bit unchanged."""
    tol = mamba2ssd.prefill_tolerance(dtype, state_dtype)
    y_ref, stored = ref
    assert torch.isfinite(y).all(), f"{what}: non-finite y"
    assert rel(y, y_ref) <= tol, f"{what}: y rel L2 {rel(y, y_ref):.3g} > {tol:.3g}"
    for slot in range(state_after.shape[0]):
        if slot in stored:
            err = rel(state_after[slot], stored[slot])
            assert err <= tol, f"{what}: slot {slot} rel L2 {err:.3g} > {tol:.3g}"
        else:
            assert torch.equal(state_after[slot], state_before[slot]), f"{what}: slot {slot} not named but changed"


def cu_of(seqlens):
    cu = [0]
    for n in seqlens:
        cu.append(cu[-1] + n)
    return torch.tensor(cu, dtype=torch.int32)


def problem(seqlens=(37, 0, 1, 70, 5), H=4, P=32, G=2, N=16, nslots=9, dtype=torch.float32,
            state_dtype=torch.float32, softplus=False, seed=0):
    g = torch.Generator().manual_seed(seed)
    T = sum(seqlens)
    rn = lambda *s: torch.randn(*s, generator=g)  # noqa: E731
    S = len(seqlens)
    return dict(
        x=rn(T, H, P).to(dtype),
        dt=(rn(T, H) * 0.5 - 3.0) if softplus else torch.rand(T, H, generator=g) * 0.1 + 0.005,
        A=-(torch.rand(H, generator=g) * 1.95 + 0.05),
        B=rn(T, G, N).to(dtype),
        C=rn(T, G, N).to(dtype),
        cu_seqlens=cu_of(seqlens),
        state=rn(nslots, H, P, N).to(state_dtype),
        slots=torch.randperm(nslots, generator=g)[:S].to(torch.int32),
    )


def call(p, state, **kw):
    return mamba2ssd.prefill(p["x"], p["dt"], p["A"], p["B"], p["C"], 64, p["cu_seqlens"], state, p["slots"], **kw)


def oracle(p, **kw):
    return prefill_oracle(p["state"], p["x"], p["dt"], p["A"], p["B"], p["C"], p["cu_seqlens"], p["slots"], **kw)


# --- features against the fp64 recurrence -----------------------------------------------------

FEATURES = {
    "plain": {},
    "D per head": {"D": "head"},
    "D per (head, dim)": {"D": "dim"},
    "z": {"z": True},
    "dt_bias + softplus": {"dt_bias": True, "softplus": True},
    "dt_limit": {"limit": (0.02, 0.07)},
    "everything": {"D": "dim", "z": True, "dt_bias": True, "softplus": True, "limit": (0.01, 0.2)},
}


@pytest.mark.parametrize("feature", list(FEATURES))
@pytest.mark.parametrize("ngroups", [1, 2, 4])
def test_features(feature, ngroups):
    spec = FEATURES[feature]
    p = problem(G=ngroups, softplus=spec.get("softplus", False), seed=1 + ngroups)
    T, H, P = p["x"].shape
    g = torch.Generator().manual_seed(100 + ngroups)
    opt, ref_opt = {}, {}
    if spec.get("D") == "head":
        opt["D"] = torch.randn(H, generator=g)
    elif spec.get("D") == "dim":
        opt["D"] = torch.randn(H, P, generator=g)
    if spec.get("z"):
        opt["z"] = torch.randn(T, H, P, generator=g)
    if spec.get("dt_bias"):
        opt["dt_bias"] = torch.randn(H, generator=g) * 0.5
    ref_opt.update(opt)
    if spec.get("softplus"):
        opt["dt_softplus"], ref_opt["softplus"] = True, True
    if "limit" in spec:
        opt["dt_limit"], ref_opt["limit"] = spec["limit"], spec["limit"]
    # Mixed starts: requests 0 and 3 continue from their slots, 1, 2 and 4 are new.
    has_init = torch.tensor([True, False, False, True, False])
    state = p["state"].clone()
    y = call(p, state, has_initial_state=has_init, **opt)
    assert y.shape == p["x"].shape and y.dtype == p["x"].dtype
    check(y, state, p["state"], oracle(p, has_initial_state=has_init, **ref_opt), torch.float32, torch.float32, feature)


@pytest.mark.parametrize("state_dtype", STATE_DTYPES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_dtypes(dtype, state_dtype):
    # Every inputs' dtype with every cache dtype, held to prefill_tolerance(dtype, state_dtype); dt in bf16 too.
    p = problem(dtype=dtype, state_dtype=state_dtype, seed=3)
    if dtype == torch.bfloat16:
        p["dt"] = p["dt"].to(torch.bfloat16)
    has_init = torch.tensor([1, 0, 1, 1, 0], dtype=torch.uint8)  # uint8 as well as bool
    state = p["state"].clone()
    y = call(p, state, has_initial_state=has_init, D=torch.ones(4))
    assert y.dtype == dtype and state.dtype == state_dtype
    check(y, state, p["state"], oracle(p, has_initial_state=has_init, D=torch.ones(4)), dtype, state_dtype,
          f"{dtype} / cache {state_dtype}")


@pytest.mark.parametrize("P", [16, 80])
def test_head_dims_past_the_powers_of_two(P):
    p = problem(P=P, N=48, seed=8)
    state = p["state"].clone()
    y = call(p, state)
    check(y, state, p["state"], oracle(p), torch.float32, torch.float32, f"head dim {P}")


def test_every_request_reads_its_slot_without_has_initial_state():
    p = problem(seed=4)
    state = p["state"].clone()
    y = call(p, state)
    check(y, state, p["state"], oracle(p), torch.float32, torch.float32, "has_initial_state None")


def test_pads_and_empty_requests():
    # Request 1 (0 tokens) is cached: its slot keeps its bits. Request 2 (6 tokens) is a pad: no slot
    # read or written, its y from a zero state. Request 4 (0 tokens) is new: its slot is zeroed.
    p = problem(seqlens=(20, 0, 6, 33, 0), seed=5)
    p["slots"] = torch.tensor([4, 7, -1, 0, 2], dtype=torch.int32)
    has_init = torch.tensor([True, True, True, False, False])
    state = p["state"].clone()
    y = call(p, state, has_initial_state=has_init)
    ref = oracle(p, has_initial_state=has_init)
    check(y, state, p["state"], ref, torch.float32, torch.float32, "pads and empty requests")
    assert torch.equal(state[7], p["state"][7]), "a cached request of 0 tokens must leave its slot as it was"
    assert (state[2] == 0).all(), "a new request of 0 tokens stores a zero state"
    assert rel(y[20:26], ref[0][20:26]) <= 1e-5, "a pad's y must come from a zero state"
    assert -1 not in ref[1]


def test_pad_slot_id_other_than_minus_one():
    p = problem(seed=6)
    p["slots"] = torch.tensor([3, 99, 0, 5, 1], dtype=torch.int32)
    state = p["state"].clone()
    y = call(p, state, pad_slot_id=99)
    check(y, state, p["state"], oracle(p, pad=99), torch.float32, torch.float32, "pad_slot_id 99")


def test_out_given_and_packed_form():
    p = problem(dtype=torch.bfloat16, seed=7)
    state = p["state"].clone()
    out = torch.full_like(p["x"], float("nan"))
    ret = call(p, state, out=out, z=p["x"])
    assert ret is out
    check(out, state, p["state"], oracle(p, z=p["x"]), torch.bfloat16, torch.float32, "out=")
    # mamba_chunk_scan_combined's packed form: [1, T, ...] everywhere; the same bits, and out= kept.
    state1 = p["state"].clone()
    out1 = torch.empty(1, *p["x"].shape, dtype=p["x"].dtype)
    seq_idx = torch.repeat_interleave(torch.arange(5, dtype=torch.int32), torch.diff(p["cu_seqlens"]))
    ret1 = mamba2ssd.prefill(p["x"][None], p["dt"][None], p["A"], p["B"][None], p["C"][None], 64, p["cu_seqlens"],
                             state1, p["slots"], seq_idx=seq_idx[None], z=p["x"][None], out=out1)
    assert ret1 is out1
    assert torch.equal(out1[0], out) and torch.equal(state1, state)
    y_new = mamba2ssd.prefill(p["x"][None], p["dt"][None], p["A"], p["B"][None], p["C"][None], 64, p["cu_seqlens"],
                              p["state"].clone(), p["slots"], z=p["x"][None])
    assert y_new.shape == (1, *p["x"].shape) and torch.equal(y_new[0], out)


def test_strided_inputs_and_cache():
    # Inputs without contiguous rows are copied; the cache may have any strides with contiguous rows.
    p = problem(seed=8)
    T, H, P = p["x"].shape
    nslots, _, _, N = p["state"].shape
    big = torch.randn(nslots, H + 1, P, N)
    big[:, :H] = p["state"]
    state = big[:, :H]  # not contiguous, rows contiguous
    spare = big[:, H:].clone()
    x_t = p["x"].transpose(1, 2).contiguous().transpose(1, 2)  # last dim stride H
    y = mamba2ssd.prefill(x_t, p["dt"], p["A"], p["B"], p["C"], 64, p["cu_seqlens"], state, p["slots"])
    check(y, state, p["state"], oracle(p), torch.float32, torch.float32, "strided")
    assert torch.equal(big[:, H:], spare), "the cache's storage outside its view must not be touched"


def test_seq_idx_must_agree_with_cu_seqlens():
    p = problem(seed=9)
    ids = torch.repeat_interleave(torch.arange(5, dtype=torch.int32), torch.diff(p["cu_seqlens"]))
    state = p["state"].clone()
    y = call(p, state, seq_idx=ids.long())
    check(y, state, p["state"], oracle(p), torch.float32, torch.float32, "seq_idx")
    bad = ids.clone()
    bad[10] = 7
    # seq_idx is [T] (one row): its entries are named by token, as cu_seqlens' and slots' are.
    with pytest.raises(ValueError, match=r"prefill: seq_idx\[10\] = 7 after 0 inside request 0: seq_idx must change "
                                         r"exactly where cu_seqlens"):
        call(p, p["state"].clone(), seq_idx=bad)


def test_int64_seq_idx_outside_int32_and_meta_tensors_are_refused():
    p = problem(seed=9)
    ids = torch.repeat_interleave(torch.arange(5, dtype=torch.int64), torch.diff(p["cu_seqlens"])) + 2**32
    with pytest.raises(ValueError, match=r"prefill: seq_idx\[0\] = 4294967296 is outside int32"):
        call(p, p["state"].clone(), seq_idx=ids)
    with pytest.raises(ValueError, match=r"prefill: A is on meta but state is on cpu"):
        mamba2ssd.prefill(p["x"], p["dt"], p["A"].to("meta"), p["B"], p["C"], 64, p["cu_seqlens"], p["state"].clone(),
                          p["slots"])


def test_dt_limit_is_judged_as_given_not_as_its_float():
    # Narrowed to float first, -1e-50 became -0 (passing >= 0) and a lower bound of 1e39 was named as inf.
    p = problem(seed=9)
    with pytest.raises(ValueError, match=r"^prefill: fwd: dt_limit lower bound must be >= 0, got -1e-50$"):
        call(p, p["state"].clone(), dt_limit=(-1e-50, 1.0))
    with pytest.raises(ValueError, match=r"^prefill: fwd: dt_limit lower bound must be finite in float32 \(at most "
                                         r"3.40282e\+38\), got 1e\+39$"):
        call(p, p["state"].clone(), dt_limit=(1e39, float("inf")))


def test_sizes_past_the_limits_are_refused_before_out_is_allocated():
    # out (x's shape) was allocated before the op's checks: an x expanded past 2^56 elements (a view
    # of one token) failed in the allocator, unnamed.
    p = problem(seed=9)
    T = 2**52
    big = {name: p[name][:1].expand(T, *p[name].shape[1:]) for name in ("x", "dt", "B", "C")}
    with pytest.raises(ValueError, match=r"^prefill: fwd: batch \* seqlen \* nheads \* headdim = 1 \* 4503599627370496 "
                                         r"\* 4 \* 32 is more than 2\^56 elements"):
        mamba2ssd.prefill(big["x"], big["dt"], p["A"], big["B"], big["C"], 64, torch.tensor([0, T]), p["state"].clone(),
                          p["slots"][:1])


def test_matches_the_forward_for_new_requests():
    # All requests new: y is mamba_chunk_scan_combined's over cu_seqlens, the stored states its varlen_states.
    p = problem(seqlens=(40, 3, 64, 17), seed=10)
    state = p["state"].clone()
    y = call(p, state, has_initial_state=torch.zeros(4, dtype=torch.bool))
    y_fwd, varlen = mamba2ssd.mamba_chunk_scan_combined(
        p["x"][None], p["dt"][None], p["A"], p["B"][None], p["C"][None], 64, cu_seqlens=p["cu_seqlens"],
        return_varlen_states=True)
    tol = mamba2ssd.prefill_tolerance(torch.float32, torch.float32)
    assert rel(y, y_fwd[0].double()) <= tol
    assert rel(state[p["slots"].long()], varlen.double()) <= tol


# --- intermediate states (a state every k tokens, for a prefix cache) --------------------------

def intermediate_problem(state_dtype=torch.float32, seed=20):
    # Requests of 0, 64 (= k), 200 (3 boundaries, M = 2 keeps 2), 63 (< k), 128 (2k, its last boundary in
    # its own slot) and 130 tokens, the last a pad request; every entry's slot distinct from the rest.
    p = problem(seqlens=(0, 64, 200, 63, 128, 130), nslots=24, state_dtype=state_dtype, seed=seed)
    p["slots"] = torch.tensor([0, 1, 2, 3, 4, -1], dtype=torch.int32)
    inter = torch.tensor([[10, 11], [12, 13], [14, -1], [15, 16], [17, 4], [18, 19]], dtype=torch.int32)
    inter[2, 1] = 20  # request 2's second boundary stored to 20; its first (14) too; the third cut by M
    return p, inter


@pytest.mark.parametrize("state_dtype", STATE_DTYPES)
def test_intermediate_states(state_dtype):
    p, inter = intermediate_problem(state_dtype)
    has_init = torch.tensor([True, False, True, False, True, True])
    before = p["state"].clone()
    before[[14, 20, 12, 17]] = float("nan")  # the stored boundaries: a store left out fails below
    state = before.clone()
    y = call(p, state, has_initial_state=has_init, state_every=64, intermediate_slots=inter)
    ref = oracle(p, has_initial_state=has_init, state_every=64, intermediate_slots=inter)
    assert sorted(ref[1]) == [0, 1, 2, 3, 4, 12, 14, 17, 20]
    check(y, state, before, ref, torch.float32, state_dtype, f"state_every 64, cache {state_dtype}")
    # The last boundary of request 4 (128 = 2k) went to its own slot 4: its final state, once.
    assert torch.isfinite(state).all()


def test_intermediate_states_every_two_chunks():
    # k = 128 with chunk 64; torch.ops keywords too.
    p, inter = intermediate_problem(seed=21)
    state = p["state"].clone()
    out = torch.empty_like(p["x"])
    torch.ops.mamba2ssd.prefill(state, p["x"], p["dt"], p["A"], p["B"], p["C"], 64, p["cu_seqlens"], None, None, None,
                                None, False, 0.0, float("inf"), p["slots"], None, -1, out, state_every=128,
                                intermediate_slots=inter)
    ref = oracle(p, state_every=128, intermediate_slots=inter)
    assert sorted(ref[1]) == [0, 1, 2, 3, 4, 14, 17]  # 200 and 128 tokens: one boundary each
    check(out, state, p["state"], ref, torch.float32, torch.float32, "state_every 128")


def test_intermediate_states_refusals():
    p, inter = intermediate_problem(seed=22)
    state = p["state"].clone()

    def refused(match, **kw):
        with pytest.raises(ValueError, match=match):
            call(p, state, **kw)

    refused(r"prefill: state_every must be a multiple of fwd.chunk_size 64, got 100", state_every=100,
            intermediate_slots=inter)
    refused(r"prefill: state_every must be >= 0 \(0: no intermediate states\), got -64", state_every=-64,
            intermediate_slots=inter)
    refused(r"prefill: intermediate_slots is null but state_every is 64", state_every=64)
    refused(r"prefill: intermediate_slots is given but state_every is 0", intermediate_slots=inter)
    # Without columns, a view or a tensor of its own (whose data pointer is null) alike.
    for empty in (inter[:, :0], torch.zeros(inter.size(0), 0, dtype=torch.int32)):
        refused(r"prefill: intermediate_slots must have at least one column \(a slot per stored state\) with "
                r"state_every 64, got shape \[6, 0\]", state_every=64, intermediate_slots=empty)
    refused(r"prefill: intermediate_slots must be an int32 tensor, got Long", state_every=64,
            intermediate_slots=inter.long())
    refused(r"prefill: intermediate_slots must be a 2-d tensor \[num_requests, max_intermediate\]", state_every=64,
            intermediate_slots=inter[0])
    refused(r"prefill: intermediate_slots must have shape \[num_requests, max_intermediate\] = \[6, M\], got \[5, 2\]",
            state_every=64, intermediate_slots=inter[:5])
    bad = inter.clone()
    bad[3, 1] = 24
    refused(r"prefill: intermediate_slots\[3, 1\] = 24 is outside the cache \[0, nslots 24\) and is not pad_slot_id -1",
            state_every=64, intermediate_slots=bad)
    bad = inter.clone()
    bad[2, 0] = 3
    refused(r"prefill: slots\[3\] and intermediate_slots\[2, 0\] are both slot 3: an intermediate state stored there "
            r"would clobber the state request 3 reads or stores", state_every=64, intermediate_slots=bad)
    bad = inter.clone()
    bad[4, 0] = 14
    refused(r"prefill: intermediate_slots\[2, 0\] and intermediate_slots\[4, 0\] are both slot 14: two stored "
            r"intermediate states may not share a slot", state_every=64, intermediate_slots=bad)
    assert torch.equal(state, p["state"]), "a refused call must not touch the cache"


def test_prefill_tolerance_table():
    assert mamba2ssd.prefill_tolerance(torch.float32, torch.bfloat16) >= mamba2ssd.decode_tolerance(
        torch.float32, torch.bfloat16)
    assert mamba2ssd.prefill_tolerance(torch.bfloat16, torch.float32) == mamba2ssd.tolerance(torch.bfloat16)
    with pytest.raises(ValueError, match="prefill_tolerance: dtype must be"):
        mamba2ssd.prefill_tolerance(torch.float64, torch.float32)


# --- bad input --------------------------------------------------------------------------------

def test_refusals_name_the_parameter():
    p = problem(seed=11)
    T, H, P = p["x"].shape
    nslots = p["state"].shape[0]
    base = dict(x=p["x"], dt=p["dt"], A=p["A"], B=p["B"], C=p["C"], chunk_size=64, cu_seqlens=p["cu_seqlens"],
                slots=p["slots"])
    state = p["state"].clone()

    def refused(match, **kw):
        with pytest.raises(ValueError, match=match):
            mamba2ssd.prefill(**{**base, "state": state, **kw})

    refused(r"prefill: x must be a 3-d tensor \[tokens, nheads, headdim\]", x=p["x"][None, None])
    refused(r"prefill: x must be \[tokens, nheads, headdim\] or \[1, tokens", x=p["x"][None].expand(2, -1, -1, -1))
    refused(r"prefill: x must have shape .* = \[113, 4, 32\], got \[113, 4, 16\]", x=p["x"][:, :, :16])
    refused(r"prefill: dt must have shape \[tokens, nheads\]", dt=p["dt"][:-1])
    refused(r"prefill: A must have shape \[nheads\]", A=p["A"][:2])
    refused(r"prefill: B must have shape", B=p["B"][:, :, :8])
    refused(r"prefill: C must have shape .* \(B's shape\)", C=p["C"][:, :1])
    refused(r"prefill: z must have shape", z=p["x"][:-1])
    refused(r"prefill: D must have shape \[nheads\] = \[4\] or \[nheads, headdim\]", D=torch.ones(3))
    refused(r"prefill: dt_bias must have shape \[nheads\]", dt_bias=torch.ones(H + 1))
    refused(r"prefill: dt_bias must be a 1-d tensor", dt_bias=torch.ones(H, 1))
    refused(r"prefill: state must be a 4-d tensor", state=state[0])
    refused(r"prefill: slots must have shape \[num_requests\]", slots=p["slots"][:4])
    refused(r"prefill: has_initial_state must have shape", has_initial_state=torch.ones(6, dtype=torch.bool))
    refused(r"prefill: seq_idx must have shape \[tokens\]", seq_idx=torch.zeros(T - 1, dtype=torch.int32))
    refused(r"prefill: out must have shape .* \(x's shape\)", out=torch.empty(T, H, P + 1))
    refused(r"prefill: cu_seqlens must be a 1-d tensor", cu_seqlens=p["cu_seqlens"][None])
    # Arguments of the wrong kind (not values the library judges): TypeError, named.
    for name, bad, match in (("dt_limit", None, r"dt_limit must be a pair \(lo, hi\) of numbers, got None"),
                             ("dt_limit", (0.0, 1.0, 2.0), r"dt_limit must be a pair"),
                             ("pad_slot_id", None, r"pad_slot_id must be an integer, got None"),
                             ("state_every", None, r"state_every must be an integer, got None"),
                             ("chunk_size", None, r"chunk_size must be an integer, got None")):
        with pytest.raises(TypeError, match=r"prefill: " + match):
            mamba2ssd.prefill(**{**base, "state": state, name: bad})
    # dtypes
    refused(r"prefill: x must be float32, float16 or bfloat16, got Double", x=p["x"].double())
    refused(r"prefill: B must have x's dtype Float, got BFloat16", B=p["B"].bfloat16())
    refused(r"prefill: out must have x's dtype", out=torch.empty(T, H, P, dtype=torch.half))
    refused(r"prefill: dt must be float32", dt=p["dt"].double())
    refused(r"prefill: state must be float32, float16 or bfloat16, got Double", state=state.double())
    refused(r"prefill: slots must be an int32 tensor, got Long", slots=p["slots"].long())
    refused(r"prefill: has_initial_state must be a bool or uint8 tensor, got Int",
            has_initial_state=torch.ones(5, dtype=torch.int32))
    refused(r"prefill: cu_seqlens must be an int32 or int64 tensor, got Float", cu_seqlens=p["cu_seqlens"].float())
    refused(r"prefill: A must be a floating-point tensor", A=torch.ones(H, dtype=torch.int32))
    # layout of what is written in place
    refused(r"prefill: state's last dimension must be contiguous", state=state.transpose(2, 3).contiguous().transpose(2, 3))
    refused(r"prefill: out's last dimension must be contiguous", out=torch.empty(T, P, H).transpose(1, 2))
    # the library's own rules (validate), through the op
    refused(r"prefill: .*headdim", x=torch.randn(T, H, 24), out=torch.empty(T, H, 24),
            state=torch.zeros(nslots, H, 24, 16))
    refused(r"prefill: .*chunk_size", chunk_size=0)
    refused(r"prefill: output state overlaps output y", out=state.view(-1)[:T * H * P].view(T, H, P))
    assert torch.equal(state, p["state"]), "a refused call must not touch the cache"


def test_bad_slots_and_cu_seqlens_name_the_entries():
    p = problem(seed=12)
    state = p["state"].clone()
    with pytest.raises(ValueError, match=r"prefill: slots\[1\] = 9 is outside the cache \[0, nslots 9\) and is not "
                                         r"pad_slot_id -1"):
        call({**p, "slots": torch.tensor([0, 9, 2, 3, 4], dtype=torch.int32)}, state)
    with pytest.raises(ValueError, match=r"prefill: slots\[3\] = -2 is outside the cache"):
        call({**p, "slots": torch.tensor([0, 1, 2, -2, 4], dtype=torch.int32)}, state)
    with pytest.raises(ValueError, match=r"prefill: slots\[0\] and slots\[3\] are both slot 6: two requests may not "
                                         r"share a slot"):
        call({**p, "slots": torch.tensor([6, 1, 2, 6, 4], dtype=torch.int32)}, state)
    # Two pads are not a shared slot.
    call({**p, "slots": torch.tensor([-1, 1, -1, 6, 4], dtype=torch.int32)}, p["state"].clone())
    with pytest.raises(ValueError, match=r"prefill: .*cu_seqlens must be non-decreasing, got \[2\] = 40 > \[3\] = 30"):
        call({**p, "cu_seqlens": torch.tensor([0, 37, 40, 30, 108, 113], dtype=torch.int32)}, state)
    with pytest.raises(ValueError, match=r"prefill: cu_seqlens \[0\] must be 0, got 1"):
        call({**p, "cu_seqlens": torch.tensor([1, 37, 37, 38, 108, 113], dtype=torch.int32)}, state)
    with pytest.raises(ValueError, match=r"prefill: cu_seqlens \[5\] must equal seqlen 113, got 112"):
        call({**p, "cu_seqlens": torch.tensor([0, 37, 37, 38, 108, 112], dtype=torch.int32)}, state)
    assert torch.equal(state, p["state"]), "a refused call must not touch the cache"


# --- CUDA: prefill_cuda through the op (GPU only) ---------------------------------------------

def to_cuda(p):
    return {k: v.cuda() for k, v in p.items()}


def cuda_and_cpu(p, chunk, poison=(), **kw):
    """The same call on the GPU and on the CPU from the same cache; out poisoned (NaN) first, and the
    cache slots in `poison` too (the ones a store must fill). Returns ((y, state) per device, the cache
    before) on the CPU."""
    before = p["state"].clone()
    if poison:
        before[list(poison)] = float("nan")
    runs = {}
    for device in ("cuda", "cpu"):
        q = {k: v.to(device) for k, v in p.items()}
        opt = {k: v.to(device) if isinstance(v, torch.Tensor) else v for k, v in kw.items()}
        state = before.to(device, copy=True)  # a copy on the CPU too: `before` stays as it was
        out = torch.full_like(q["x"], float("nan"))
        y = mamba2ssd.prefill(q["x"], q["dt"], q["A"], q["B"], q["C"], chunk, q["cu_seqlens"], state, q["slots"],
                              out=out, **opt)
        assert y is out
        runs[device] = (y.cpu(), state.cpu())
    return runs, before


def check_cuda(runs, before, ref, dtype, state_dtype, what):
    """The GPU's y and cache against the recurrence (check) and against the CPU's: each within the
    tolerance of the fp64 reference, so within twice it of each other."""
    (y, state), (y_cpu, state_cpu) = runs["cuda"], runs["cpu"]
    check(y, state, before, ref, dtype, state_dtype, "cuda " + what)
    check(y_cpu, state_cpu, before, ref, dtype, state_dtype, "cpu " + what)
    tol = mamba2ssd.prefill_tolerance(dtype, state_dtype)
    assert rel(y, y_cpu.double()) <= 2 * tol, f"{what}: cuda vs cpu y {rel(y, y_cpu.double()):.3g}"
    written = list(ref[1])
    assert rel(state[written], state_cpu[written].double()) <= 2 * tol, f"{what}: cuda vs cpu stored states"


@requires_cuda_backend
@pytest.mark.parametrize("chunk", [64, 256])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("state_dtype", STATE_DTYPES)
def test_cuda_matches_cpu_and_oracle(state_dtype, dtype, chunk):
    # Requests longer than a chunk, of one token, of none, a pad; mixed starts; z, D per (head, dim),
    # dt_bias with softplus; dt in bf16 with bf16 inputs.
    p = problem(seqlens=(300, 0, 1, 130, 64, 7, 257), H=4, P=64, G=2, N=32, nslots=12, dtype=dtype,
                state_dtype=state_dtype, softplus=True, seed=30)
    if dtype == torch.bfloat16:
        p["dt"] = p["dt"].to(torch.bfloat16)
    p["slots"][5] = -1
    T, H, P = p["x"].shape
    g = torch.Generator().manual_seed(31)
    feats = dict(D=torch.randn(H, P, generator=g), z=torch.randn(T, H, P, generator=g).to(dtype),
                 dt_bias=torch.randn(H, generator=g) * 0.5)
    has_init = torch.tensor([True, False, True, False, True, True, True])
    runs, before = cuda_and_cpu(p, chunk, has_initial_state=has_init, dt_softplus=True, **feats)
    ref = oracle({**p, "state": before}, has_initial_state=has_init, softplus=True, **feats)
    check_cuda(runs, before, ref, dtype, state_dtype, f"{dtype} / cache {state_dtype} / chunk {chunk}")


@requires_cuda_backend
@pytest.mark.parametrize("P", [16, 80, 112])
def test_cuda_head_dims_past_the_powers_of_two(P):
    # Nemotron-H's head dim 80 (and 16, 112): the walks' last column tile partly past the head dim.
    p = problem(seqlens=(300, 0, 1, 130, 64, 7), H=4, P=P, G=2, N=128, nslots=8, dtype=torch.bfloat16,
                softplus=True, seed=32)
    T, H, _ = p["x"].shape
    g = torch.Generator().manual_seed(33)
    feats = dict(D=torch.randn(H, P, generator=g), z=torch.randn(T, H, P, generator=g).to(torch.bfloat16))
    has_init = torch.tensor([True, False, True, False, True, True])
    runs, before = cuda_and_cpu(p, 256, has_initial_state=has_init, dt_softplus=True, **feats)
    ref = oracle({**p, "state": before}, has_initial_state=has_init, softplus=True, **feats)
    check_cuda(runs, before, ref, torch.bfloat16, torch.float32, f"head dim {P}")


def intermediate_case(k, state_dtype, seed):
    # intermediate_problem's requests for any k: 0, k, 3k + 8 (3 boundaries, M = 2 keeps 2), k - 1,
    # 2k (its last boundary in its own slot) and 2k + 2 tokens, the last a pad request.
    p = problem(seqlens=(0, k, 3 * k + 8, k - 1, 2 * k, 2 * k + 2), nslots=24, state_dtype=state_dtype, seed=seed)
    p["slots"] = torch.tensor([0, 1, 2, 3, 4, -1], dtype=torch.int32)
    inter = torch.tensor([[10, 11], [12, 13], [14, 20], [15, 16], [17, 4], [18, 19]], dtype=torch.int32)
    return p, inter


@requires_cuda_backend
@pytest.mark.parametrize("chunk", [64, 256])
@pytest.mark.parametrize("state_dtype", STATE_DTYPES)
def test_cuda_intermediate_states(state_dtype, chunk):
    p, inter = intermediate_case(chunk, state_dtype, seed=32)
    has_init = torch.tensor([True, False, True, False, True, True])
    runs, before = cuda_and_cpu(p, chunk, poison=(14, 20, 12, 17), has_initial_state=has_init, state_every=chunk,
                                intermediate_slots=inter)
    ref = oracle({**p, "state": before}, has_initial_state=has_init, state_every=chunk, intermediate_slots=inter)
    assert sorted(ref[1]) == [0, 1, 2, 3, 4, 12, 14, 17, 20]
    check_cuda(runs, before, ref, torch.float32, state_dtype, f"state_every {chunk}, cache {state_dtype}")
    # Every two chunks: fewer boundaries, the same rules.
    if chunk == 64:
        runs, before = cuda_and_cpu(p, 64, poison=(14,), state_every=128, intermediate_slots=inter)
        ref = oracle({**p, "state": before}, state_every=128, intermediate_slots=inter)
        check_cuda(runs, before, ref, torch.float32, state_dtype, f"state_every 128, cache {state_dtype}")


@requires_cuda_backend
def test_cuda_skips_slots_outside_the_cache():
    # The GPU reads no slot on the host (no sync): an entry outside [0, nslots) that is not the pad id
    # is treated as the pad id, its request's y from a zero state and no slot touched (mamba2ssd.h).
    p = problem(seed=33)
    p["slots"] = torch.tensor([4, 99, 0, -7, 2], dtype=torch.int32)
    q = to_cuda(p)
    state = q["state"].clone()
    y = call(q, state)
    ref = oracle({**p, "slots": torch.tensor([4, -1, 0, -1, 2], dtype=torch.int32)})
    check(y, state.cpu(), p["state"], ref, torch.float32, torch.float32, "slots outside the cache")


@requires_cuda_backend
def test_cuda_tensors_must_share_the_states_device():
    p = to_cuda(problem(seed=14))
    state = p["state"].clone()
    with pytest.raises(ValueError, match=r"prefill: slots is on cpu but state is on cuda:0"):
        call({**p, "slots": p["slots"].cpu()}, state)
    with pytest.raises(ValueError, match=r"prefill: cu_seqlens is on cpu but state is on cuda:0"):
        call({**p, "cu_seqlens": p["cu_seqlens"].cpu()}, state)
    with pytest.raises(ValueError, match=r"prefill: x is on cuda:0 but state is on cpu"):
        call(p, state.cpu())
    with pytest.raises(ValueError, match=r"prefill: state_every must be a multiple of fwd.chunk_size 64, got 100"):
        call(p, state, state_every=100, intermediate_slots=torch.zeros(5, 1, dtype=torch.int32, device="cuda"))
    assert torch.equal(state, p["state"]), "a refused call must not touch the cache"


@requires_cuda_backend
def test_cuda_kernel_refuses_host_memory():
    # The CUDA kernel reached with host tensors (the dispatcher sent straight to its CUDA entry):
    # prefill_cuda refuses pointers that are not device memory, nothing touched.
    p = problem(seed=13)
    state = p["state"].clone()
    out = torch.zeros_like(p["x"])
    keys = torch._C.DispatchKeySet(torch._C.DispatchKey.CUDA)
    with pytest.raises(ValueError, match=r"prefill: .*device memory"):
        torch.ops.mamba2ssd.prefill.default.redispatch(
            keys, state, p["x"], p["dt"], p["A"], p["B"], p["C"], 64, p["cu_seqlens"], None, None, None, None, False,
            0.0, float("inf"), p["slots"], None, -1, out)
    assert torch.equal(state, p["state"]) and (out == 0).all()


@requires_cuda_backend
def test_cuda_graph_capture_and_replay():
    # An engine captures its prefill: no host synchronization, eager or captured, and a replay gives
    # the eager call's bits (the workspace comes from the graph's pool, sized from T and S alone).
    p = problem(seqlens=(0, 64, 200, 63, 128, 130), H=8, P=64, G=1, N=64, nslots=24, dtype=torch.bfloat16,
                state_dtype=torch.bfloat16, seed=34)
    p["slots"] = torch.tensor([0, 1, 2, 3, 4, -1], dtype=torch.int32)
    inter = torch.tensor([[10, 11], [12, 13], [14, 20], [15, 16], [17, 4], [18, 19]], dtype=torch.int32)
    q = to_cuda(p)
    inter_d = inter.cuda()
    has_init = torch.tensor([True, False, True, False, True, True], device="cuda")
    D = torch.randn(8, device="cuda")
    state = q["state"].clone()
    out = torch.full_like(q["x"], float("nan"))

    def step():
        mamba2ssd.prefill(q["x"], q["dt"], q["A"], q["B"], q["C"], 64, q["cu_seqlens"], state, q["slots"], has_init,
                          D=D, out=out, state_every=64, intermediate_slots=inter_d)

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        torch.cuda.set_sync_debug_mode("error")  # an eager call may not synchronize either
        try:
            step()  # also the warm-up outside the capture
        finally:
            torch.cuda.set_sync_debug_mode("default")
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()
    eager_y, eager_state = out.clone(), state.clone()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        step()
    for _ in range(2):  # replays from the same starting point give the same bits each time
        state.copy_(q["state"])
        out.fill_(float("nan"))
        torch.cuda.set_sync_debug_mode("error")  # any host synchronization inside raises
        try:
            graph.replay()
        finally:
            torch.cuda.set_sync_debug_mode("default")
        torch.cuda.synchronize()
        assert torch.equal(out, eager_y), "graph replay: y differs from the eager call"
        assert torch.equal(state, eager_state), "graph replay: the cache differs from the eager call"
    ref = oracle(p, has_initial_state=has_init.cpu(), D=D.cpu(), state_every=64, intermediate_slots=inter)
    check(out, state.cpu(), p["state"], ref, torch.bfloat16, torch.bfloat16, "graph replay")


@requires_cuda_backend
def test_cuda_compile_fullgraph_updates_the_cache():
    p = to_cuda(problem(seed=35))
    has_init = torch.tensor([True, False, True, True, False], device="cuda")
    D = torch.ones(4, device="cuda")
    eager_state = p["state"].clone()
    eager = call(p, eager_state, has_initial_state=has_init, D=D)
    step = torch.compile(lambda s, x, dt, B, C: mamba2ssd.prefill(
        x, dt, p["A"], B, C, 64, p["cu_seqlens"], s, p["slots"], has_init, D=D), fullgraph=True)
    state = p["state"].clone()
    y = step(state, p["x"], p["dt"], p["B"], p["C"])
    assert torch.equal(y, eager)
    assert torch.equal(state, eager_state)
    assert not torch.equal(state, p["state"])


# --- torch.library registration and torch.compile ----------------------------------------------

def test_opcheck():
    p = problem(seqlens=(9, 0, 20), nslots=4, seed=15)
    args = (p["state"].clone(), p["x"], p["dt"], p["A"], p["B"], p["C"], 64, p["cu_seqlens"], None, torch.ones(4),
            p["x"], torch.zeros(4), True, 0.0, float("inf"), p["slots"], torch.tensor([True, False, True]), -1,
            torch.empty_like(p["x"]))
    torch.library.opcheck(torch.ops.mamba2ssd.prefill.default, args)
    p, inter = intermediate_problem(seed=24)
    args = (p["state"].clone(), p["x"], p["dt"], p["A"], p["B"], p["C"], 64, p["cu_seqlens"], None, None, None, None,
            False, 0.0, float("inf"), p["slots"], None, -1, torch.empty_like(p["x"]), 64, inter)
    torch.library.opcheck(torch.ops.mamba2ssd.prefill.default, args)


def test_compile_fullgraph_updates_the_cache():
    # Engines compile their forward: the op's mutations (state, out) must survive functionalization.
    p = problem(seed=16)
    has_init = torch.tensor([True, False, True, True, False])
    eager_state = p["state"].clone()
    eager = call(p, eager_state, has_initial_state=has_init, D=torch.ones(4))
    step = torch.compile(lambda s, x, dt, B, C: mamba2ssd.prefill(
        x, dt, p["A"], B, C, 64, p["cu_seqlens"], s, p["slots"], has_init, D=torch.ones(4)), fullgraph=True)
    state = p["state"].clone()
    y = step(state, p["x"], p["dt"], p["B"], p["C"])
    assert torch.equal(y, eager)
    assert torch.equal(state, eager_state)
    assert not torch.equal(state, p["state"])
