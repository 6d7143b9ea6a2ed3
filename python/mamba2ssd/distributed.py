"""Context parallelism: one sequence sharded along its tokens across the ranks of a process group.

    import mamba2ssd.distributed as cp
    y, final_states = cp.mamba_chunk_scan_combined(x, dt, A, B, C, chunk_size, ..., group=group,
                                                   return_final_states=True)

Each rank passes its contiguous shard of x, dt, B, C (and z, seq_idx) along the sequence; group rank
order is sequence order and shard lengths may differ (zero included). docs/distributed.md has the
usage, the algebra, what is exchanged and what it costs. In short, per rank r, per (batch row, head):

    forward   1. the op on the shard from a zero state: y0 and the end state S_r (the whole shard);
                 the shard's decay a_r = exp(sum A d) (0 if a sequence starts inside it)
              2. ONE all_gather of (S_r, a_r, first and last sequence id, status)
              3. the entry state h_r, the scan h <- a_k h + S_k over the earlier ranks' pairs in
                 closed form (h <- S_k where rank k's first token starts a new sequence), and the
                 final state the same way over all ranks; rank 0 runs step 1 from initial_states,
                 so its S_0 is already its true end state
              4. the op again over the prefix of the shard that h_r still reaches (until its decay
                 underflows fp32, or the first sequence ends), from h_r, per head (per group of
                 heads when G > 1) in a few calls; those tokens of y replaced
    backward  1. the entry state's gradient G_r from the prefix's outputs (the prefix graph)
              2. ONE all_gather of (G_r, this rank's final-state gradient, status)
              3. the end state's gradient, the reverse scan mu <- a_k mu + G_k in closed form
              4. the whole shard's graph from (dy, mu): every local input's gradient
One host sync per direction: the statuses (and in the forward the prefix lengths, which set the
rerun's shapes).

Step 4 of the forward is why there is no second full pass: the entry state's weight at token t is
exp(g_t), g_t the sum of A d over the shard's tokens up to t, and once g_t < -110 that weight is below
fp32's smallest subnormal (2^-149 = e^-103.3); the kernels' own exp2 returns 0 there. With Mamba-2's
decays (A d about -1e-3 to -1 per token) the prefix is tens to thousands of tokens of a shard of a
million; only heads that barely decay over the whole shard make it the whole shard (then the cost is
that of two passes, and the answer is still exact).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch
import torch.distributed as dist
from torch import Tensor

from ._ops import _dt_limit_bounds, _expect_scan_tensors
from ._ops import mamba_chunk_scan_combined as _op_scan

__all__ = ["mamba_chunk_scan_combined"]

_NAME = "mamba2ssd.distributed.mamba_chunk_scan_combined"

# Below this cumulative log decay the entry state's weight exp(g) is under 2^-158, past fp32's
# smallest subnormal (e^-103.3): the tokens beyond it get nothing from the entry state that fp32 holds.
_CUTOFF = -110.0


def mamba_chunk_scan_combined(
    x: Tensor,
    dt: Tensor,
    A: Tensor,
    B: Tensor,
    C: Tensor,
    chunk_size: int,
    D: Tensor | None = None,
    z: Tensor | None = None,
    dt_bias: Tensor | None = None,
    initial_states: Tensor | None = None,
    seq_idx: Tensor | None = None,
    cu_seqlens: Tensor | None = None,
    dt_softplus: bool = False,
    dt_limit: tuple[float, float] = (0.0, float("inf")),
    return_final_states: bool = False,
    return_varlen_states: bool = False,
    *,
    cuda_path: str = "auto",
    group: dist.ProcessGroup | None = None,
):
    """mamba2ssd.mamba_chunk_scan_combined over a sequence sharded across the ranks of `group`.

    Every rank of the group must call it (it is a collective), with the same b, H, P, G, N, dtypes,
    chunk_size and options. Per rank:
        x [b, L_r, H, P], dt [b, L_r, H], B, C [b, L_r, G, N], z like x, seq_idx [b, L_r]: this
            rank's contiguous shard of the sequence; group rank 0 holds its start, rank R-1 its end.
            L_r may differ between ranks, and may be 0. seq_idx is the slice of the whole
            sequence's seq_idx (the same ids, not renumbered per shard): packed sequences may cross
            shard edges, and a sequence that starts at a shard's first token is seen as one.
        A, D, dt_bias: the same on every rank.
        initial_states [b, H, P, N]: the state before the sequence's first token; read on group
            rank 0 only (pass it everywhere or on rank 0 alone; elsewhere it is ignored).
    Returns y (this rank's shard of the output) and, with return_final_states, the state after the
    last token of the whole sequence, the same on every rank. cu_seqlens and varlen states are
    refused (use seq_idx).

    Gradients (once the op has a backward): the backward is a collective too; A, D and dt_bias get
    each rank's share only, to be summed over the group (as a data-parallel wrapper over the group
    does); initial_states gets its gradient on rank 0.
    """
    _expect_scan_tensors(_NAME, x, dt, A, B, C, D, z, dt_bias, initial_states, seq_idx, cu_seqlens)
    dt_limit = _dt_limit_bounds(_NAME, dt_limit)
    if cu_seqlens is not None or return_varlen_states:
        raise ValueError(
            f"{_NAME}: cu_seqlens and return_varlen_states are not supported across ranks; mark "
            "packed sequences with seq_idx (each rank its shard of the global seq_idx)")
    y, final_states = _context_parallel_scan(
        x, dt, A, B, C, chunk_size, D=D, z=z, dt_bias=dt_bias, initial_states=initial_states,
        seq_idx=seq_idx, dt_softplus=dt_softplus, dt_limit=dt_limit, cuda_path=cuda_path, group=group)
    return (y, final_states) if return_final_states else y


# --- the local scan ----------------------------------------------------------------------------

# A local scan: (x, dt, A, B, C, chunk_size, D, z, dt_bias, initial_states, seq_idx, dt_softplus,
# dt_limit, cuda_path, return_final_states) -> (y, final_states or None). The op by default; the
# tests pass a differentiable float64 recurrence to check the distributed backward without it.
LocalScan = Callable[..., tuple]


def _op_local(x, dt, A, B, C, chunk_size, D, z, dt_bias, initial_states, seq_idx, dt_softplus, dt_limit,
              cuda_path, return_final_states):
    out = _op_scan(x, dt, A, B, C, chunk_size, D=D, z=z, dt_bias=dt_bias, initial_states=initial_states,
                   seq_idx=seq_idx, dt_softplus=dt_softplus, dt_limit=dt_limit,
                   return_final_states=return_final_states, cuda_path=cuda_path)
    return out if return_final_states else (out, None)


# --- pieces shared by both directions --------------------------------------------------------

@dataclass
class _Spec:
    """The call's settings that are not tensors of the autograd graph."""
    chunk_size: int
    seq_idx: Tensor | None
    dt_softplus: bool
    dt_limit: tuple[float, float]
    cuda_path: str
    group: dist.ProcessGroup | None
    rank: int
    world: int
    local: LocalScan
    building: bool = False  # whether a backward may follow: grad mode on and an input requiring grad


def _dt_processed(dt: Tensor, dt_bias: Tensor | None, softplus: bool, limit) -> Tensor:
    """The contract's step sizes d [b, L, H], in fp32 as the kernels compute them (fp64 for fp64 dt)."""
    d = dt.to(torch.float64 if dt.dtype == torch.float64 else torch.float32)
    if dt_bias is not None:
        d = d + dt_bias.to(d.dtype)
    if softplus:
        d = torch.where(d <= 20.0, torch.log1p(torch.exp(d)), d)
    return d.clamp(float(limit[0]), float(limit[1]))


def _gather(payload: Tensor, spec: _Spec) -> Tensor:
    """ONE all_gather of this rank's flat payload; [world, n], row k from group rank k."""
    out = payload.new_empty(spec.world * payload.numel())
    dist.all_gather_into_tensor(out, payload, group=spec.group)
    return out.view(spec.world, -1)


def _raise_if_failed(status: Tensor, spec: _Spec, error: BaseException | None, what: str):
    """After an exchange: a failure on any rank is raised on every rank (instead of a hang in the
    next collective). The failing rank re-raises its own error."""
    failed = [k for k, s in enumerate(status.tolist()) if s != 0.0]
    if error is not None:
        raise error
    if failed:
        raise RuntimeError(f"{_NAME}: the {what} failed on group rank(s) {failed}; see the error there")


def _int64_slots(dtype: torch.dtype) -> int:
    return 8 // torch.empty(0, dtype=dtype).element_size()


# How much work one more call of the op counts as, in head-tokens, when the prefix reruns are split
# into calls (_buckets): about its launch overhead on a GPU (64K head-tokens of the headline shape's
# forward take about 15 us on an H200: 121 us for 4 x 16K tokens x 8 heads). Tune on the multi-GPU run.
_CALL_COST = 1 << 16


def _reach(A: Tensor, d: Tensor, ids: Tensor | None) -> Tensor:
    """[b, H] number of leading tokens of the shard that an entry state reaches, per batch row and
    head: up to the last token whose cumulative log decay g_t is >= _CUTOFF, within the first
    sequence. Local: computed before the exchange, masked by the rows that continue after it."""
    b, L, H = d.shape
    # [b, L, H]: the weight of the entry state at t is exp(g_t). Summed in fp64: over a million
    # tokens an fp32 running sum could drift by more than the cut-off's margin.
    g = torch.cumsum(A * d, dim=1, dtype=torch.float64)
    alive = g >= _CUTOFF
    # The last alive token + 1 (g need not be monotonic if some A d > 0).
    reach = torch.where(alive.any(1), L - torch.flip(alive, [1]).int().argmax(1), 0)  # [b, H]
    if ids is not None and L > 1:
        changes = ids[:, 1:] != ids[:, :-1]
        first_restart = torch.where(changes.any(1), changes.int().argmax(1) + 1, L)  # [b]
        reach = torch.minimum(reach, first_restart[:, None])
    return reach


def _links(rows_ids: Tensor, present: Tensor) -> tuple[Tensor, Tensor]:
    """From every rank's (first id, last id) [R, b, 2] and whether it takes part [R] (on the
    device): cont [R, b], whether rank r's first token continues the sequence of the last token
    before it (the contract compares token 0 with id 0), and through [R, b], whether a state passes
    rank r (cont, and no sequence starts inside it; a rank without tokens passes it unchanged)."""
    R = rows_ids.shape[0]
    first, last = rows_ids[:, :, 0], rows_ids[:, :, 1]
    index = torch.arange(R, device=present.device)
    latest = torch.cummax(torch.where(present, index, -1), 0).values  # last taking part at or before r
    before = torch.cat([latest.new_full((1,), -1), latest[:-1]])       # ... strictly before r
    prev_last = torch.where(before[:, None] >= 0, last[before.clamp(min=0)], 0)
    cont = (first == prev_last) & present[:, None]
    through = (cont & (first == last)) | ~present[:, None]
    return cont, through


def _chain(X: Tensor, a: Tensor, keep: Tensor, reverse: bool) -> Tensor:
    """sum_k (product of a_j over the ranks j between k and the target) * (X_k where every such
    j passes the state (keep), else 0), the target after the last X (forward) or before the first
    (reverse). X [K, b, H, P, N]; a [K - 1, b, H], keep [K - 1, b], of the ranks in between, in
    sequence order. The masking is a where, not a product with 0: a NaN cut off by a reset stays out."""
    ones = a.new_ones((1, *a.shape[1:]))
    trues = keep.new_ones((1, *keep.shape[1:]))
    if reverse:  # the target before X_0: products over the ranks from the target to k
        w = torch.cumprod(torch.cat([ones, a]), 0)
        k = torch.cumprod(torch.cat([trues, keep]).int(), 0).bool()
    else:  # the target after X_{K-1}: products over the ranks from k to the target
        w = torch.flip(torch.cumprod(torch.flip(torch.cat([a, ones]), [0]), 0), [0])
        k = torch.flip(torch.cumprod(torch.flip(torch.cat([keep, trues]), [0]).int(), 0), [0]).bool()
    return torch.einsum("kbh,kbhpn->bhpn", w, torch.where(k[:, :, None, None, None], X, torch.zeros_like(X)))


def _buckets(unit_reach: list[int], heads_per_unit: int) -> list[tuple[int, list[int]]]:
    """Split the units (heads, or groups of heads) into calls of the op: (length, units) each, the
    units of a call rerun up to the longest reach among them. Minimizes the work (head-tokens) plus
    _CALL_COST per call over splits of the units sorted by reach (an O(U^2) dynamic program, U <= H)."""
    order = sorted(((t, u) for u, t in enumerate(unit_reach) if t > 0), reverse=True)
    n = len(order)
    best, cut = [0] + [float("inf")] * n, [0] * (n + 1)
    for j in range(1, n + 1):  # the first j units, the last call holding order[i:j]
        for i in range(j):
            cost = best[i] + _CALL_COST + (j - i) * heads_per_unit * order[i][0]
            if cost < best[j]:
                best[j], cut[j] = cost, i
    calls, j = [], n
    while j > 0:
        i = cut[j]
        calls.append((order[i][0], sorted(u for _, u in order[i:j])))
        j = i
    return calls[::-1]


def _read_heads(t: Tensor, T: int, heads: Tensor | None) -> Tensor:
    """t[:, :T, heads] of a [b, L, H, ...] tensor (a view when heads is None: every head)."""
    return t[:, :T] if heads is None else t[:, :T].index_select(2, heads.to(t.device))


def _write_heads(t: Tensor, T: int, heads: Tensor | None, value: Tensor):
    """t[:, :T, heads] = value, in place."""
    if heads is None:
        t[:, :T] = value
    else:
        t[:, :T].index_copy_(2, heads.to(t.device), value)


def _unit_heads(units: list[int], H: int, G: int) -> Tensor | None:
    per_unit = 1 if G == 1 else H // G
    if len(units) * per_unit == H:
        return None
    return torch.tensor([u * per_unit + j for u in units for j in range(per_unit)], dtype=torch.int64)


def _prefix_run(spec, args, h_in: Tensor, T: int, heads: Tensor | None, units: list[int], G: int, opts) -> Tensor:
    """The op over the first T tokens of `heads` (None: every head) from the entry state h_in."""
    local_ids = None if spec.seq_idx is None else spec.seq_idx[:, :T] - spec.seq_idx[:, :1]

    def tokens(t):  # [b, L, H, ...] -> the first T tokens of the heads
        return None if t is None else _read_heads(t, T, heads)

    def per_head(t):  # [H, ...] -> the heads
        return t if t is None or heads is None else t.index_select(0, heads.to(t.device))

    B, C = args["B"][:, :T], args["C"][:, :T]
    if heads is not None and G > 1:  # whole groups of heads: B and C of those groups
        groups = torch.tensor(units, dtype=torch.int64, device=B.device)
        B, C = B.index_select(2, groups), C.index_select(2, groups)
    h = h_in if heads is None else h_in.index_select(1, heads.to(h_in.device))
    y, _ = spec.local(tokens(args["x"]), tokens(args["dt"]), per_head(args["A"]), B, C, D=per_head(args["D"]),
                      z=tokens(args["z"]), dt_bias=per_head(args["dt_bias"]), initial_states=h, seq_idx=local_ids,
                      return_final_states=False, **opts)
    return y


# --- the autograd function -----------------------------------------------------------------------

_TENSOR_ARGS = ("x", "dt", "A", "B", "C", "D", "z", "dt_bias", "initial_states")


class _ContextParallelScan(torch.autograd.Function):
    """Both directions of the sharded scan. Inside, the two local pieces (the whole shard from a
    zero state; the prefix from the entry state) are recorded as graphs of their own on detached
    leaves, so that the backward can run them one at a time with an exchange in between."""

    @staticmethod
    def forward(ctx, spec: _Spec, x, dt, A, B, C, D, z, dt_bias, initial_states):
        # Not ctx.needs_input_grad: it says True under no_grad too, where recording graphs would
        # only cost memory and a copy of y.
        building = spec.building
        args = dict(zip(_TENSOR_ARGS, (x, dt, A, B, C, D, z, dt_bias, initial_states)))
        if spec.rank != 0:
            args["initial_states"] = None  # read on rank 0 only
        if building:
            args = {k: (None if t is None else t.detach().requires_grad_(t.requires_grad))
                    for k, t in args.items()}
        b, L, H, P = x.shape
        N = B.shape[3]
        state_dtype = torch.float64 if x.dtype == torch.float64 else torch.float32
        opts = dict(chunk_size=spec.chunk_size, dt_softplus=spec.dt_softplus, dt_limit=spec.dt_limit,
                    cuda_path=spec.cuda_path)

        # 1. The whole shard from a zero state (rank 0: from initial_states), its end state S,
        #    decay a and the reach of an entry state per (row, head). A failure here is reported
        #    through the exchange, so no rank hangs in it.
        error, y0, S, reach = None, None, None, None
        a = x.new_ones((b, H), dtype=state_dtype)  # an empty shard passes the state unchanged
        first_last = torch.zeros(b, 2, dtype=torch.int64, device=x.device)
        try:
            ids = None if spec.seq_idx is None else spec.seq_idx.to(torch.int64)
            if ids is not None and L > 0:
                # On x's device: the payload is built outside this guard (a seq_idx elsewhere is
                # refused by the op, here, and reported through the exchange).
                first_last = torch.stack([ids[:, 0], ids[:, -1]], 1).to(x.device).contiguous()
            with torch.set_grad_enabled(building):
                if L > 0:
                    y0, S = spec.local(**{k: args[k] for k in ("x", "dt", "A", "B", "C", "D", "z", "dt_bias")},
                                       initial_states=args["initial_states"], seq_idx=spec.seq_idx,
                                       return_final_states=True, **opts)
                    S = S.to(state_dtype)
                    if spec.rank != 0:  # rank 0's S is its true end state already: nothing enters it
                        d = _dt_processed(args["dt"], args["dt_bias"], spec.dt_softplus, spec.dt_limit)
                        A_d = args["A"].to(d.dtype) * d  # [b, L, H]
                        a = torch.exp(A_d.sum(1, dtype=torch.float64)).to(state_dtype)
                        if ids is not None and L > 1:
                            restarts = (ids[:, 1:] != ids[:, :-1]).any(1)  # a sequence starts inside
                            a = torch.where(restarts[:, None], torch.zeros_like(a), a)
                        reach = _reach(args["A"].detach().to(d.dtype), d.detach(), ids)
                else:
                    y0 = x.new_empty((b, 0, H, P))
                    h0 = args["initial_states"]
                    S = h0.to(state_dtype) if h0 is not None else x.new_zeros((b, H, P, N), dtype=state_dtype)
        except Exception as e:  # noqa: BLE001 (re-raised after the exchange)
            error = e

        # 2. The exchange: S, a, first and last sequence id, whether this rank takes part in the
        #    chain (an empty shard other than rank 0 passes the state through), status.
        k = _int64_slots(state_dtype)
        ok = error is None
        present = 1.0 if (L > 0 or spec.rank == 0) else 0.0
        payload = torch.cat([
            S.detach().reshape(-1) if ok else x.new_zeros(b * H * P * N, dtype=state_dtype),
            a.detach().reshape(-1) if ok else x.new_zeros(b * H, dtype=state_dtype),
            (first_last if ok else torch.zeros_like(first_last)).view(state_dtype).reshape(-1),
            # The flags by fills: a tensor from a Python list would be a host-to-device copy.
            x.new_full((1,), present, dtype=state_dtype),
            x.new_full((1,), 0.0 if ok else 1.0, dtype=state_dtype),
        ])
        rows = _gather(payload, spec)
        ns, na = b * H * P * N, b * H
        all_S = rows[:, :ns].view(spec.world, b, H, P, N)
        all_a = rows[:, ns:ns + na].view(spec.world, b, H)
        all_ids = rows[:, ns + na:ns + na + 2 * b * k].contiguous().view(torch.int64).view(spec.world, b, 2)
        cont, through = _links(all_ids, rows[:, -2] != 0)

        # 3. The entry state of this rank and the final state, from the pairs of the ranks before
        #    it and of all ranks (on every rank: the final state needs no broadcast). Enqueued
        #    before the one host sync, which brings the status and the prefix lengths.
        r = spec.rank
        entry = (_chain(all_S[:r], all_a[1:r], through[1:r], reverse=False) if r > 0
                 else torch.zeros_like(all_S[0]))
        final_states = _chain(all_S, all_a[1:], through[1:], reverse=False)
        G = B.shape[2]
        per_unit = 1 if G == 1 else H // G  # heads (G == 1) or groups of heads (B, C are per group)
        unit_reach = torch.zeros(H // per_unit, dtype=torch.int64, device=x.device)
        if reach is not None:
            unit_reach = torch.where(cont[r][:, None], reach, 0).max(0).values.view(-1, per_unit).max(1).values
        host = torch.cat([rows[:, -1].to(torch.int64), unit_reach]).cpu()  # the one host sync
        _raise_if_failed(host[:spec.world], spec, error, "local forward")

        # 4. The prefix of this shard that the entry state reaches, run again from it: per head
        #    (per group of heads when G > 1), in a few calls.
        buckets = [(T, units, _unit_heads(units, H, G)) for T, units in _buckets(host[spec.world:].tolist(), per_unit)]
        h_in, y_pre = None, []
        if buckets:
            h_in = torch.where(cont[r, :, None, None, None], entry, torch.zeros_like(entry))
            h_in = h_in.detach().requires_grad_(building)
            with torch.set_grad_enabled(building):
                for T, units, heads in buckets:
                    y_pre.append(_prefix_run(spec, args, h_in, T, heads, units, G, opts))
        if building:
            y = y0.detach().clone()
            ctx.spec, ctx.args, ctx.buckets = spec, args, buckets
            ctx.y0, ctx.S, ctx.a, ctx.y_pre, ctx.h_in = y0, S, a, y_pre, h_in
            ctx.entry = torch.where(through[r, :, None, None, None], entry, torch.zeros_like(entry))
            ctx.all_a, ctx.cont, ctx.through = all_a, cont, through
        else:
            y = y0  # this call's own tensor, not saved by any graph: written in place
        for (T, _, heads), y_b in zip(buckets, y_pre):
            _write_heads(y, T, heads, y_b.detach())
        return y, final_states

    @staticmethod
    def backward(ctx, dy, d_final):
        spec, args, buckets = ctx.spec, ctx.args, ctx.buckets
        leaves = [args[k] for k in _TENSOR_ARGS]
        wanted = [i for i, t in enumerate(leaves) if t is not None and t.requires_grad]
        grads: list[Tensor | None] = [None] * len(leaves)

        def accumulate(results):
            for i, g in zip(wanted, results):
                if g is not None:
                    grads[i] = g if grads[i] is None else grads[i] + g

        # 1. The entry state's gradient G from the prefix's outputs; a failure is reported through
        #    the exchange, so no rank hangs in it.
        error = None
        G = torch.zeros_like(d_final)
        try:
            if buckets:
                res = torch.autograd.grad(ctx.y_pre, [ctx.h_in] + [leaves[i] for i in wanted],
                                          [_read_heads(dy, T, heads) for T, _, heads in buckets], allow_unused=True)
                G = res[0] if res[0] is not None else G
                accumulate(res[1:])
        except Exception as e:  # noqa: BLE001 (re-raised after the exchange)
            error = e

        # 2. The exchange: G, this rank's gradient of the final state (every rank returned it, so
        #    its gradient is the sum over the ranks), status.
        n = G.numel()
        payload = torch.cat([G.detach().reshape(-1).to(d_final.dtype), d_final.reshape(-1),
                             d_final.new_full((1,), 0.0 if error is None else 1.0)])
        rows = _gather(payload, spec)
        _raise_if_failed(rows[:, -1], spec, error, "local backward")
        all_G = rows[:, :n].view(spec.world, *G.shape)
        mu = rows[:, n:2 * n].sum(0).view(G.shape)  # the final state's gradient

        # 3. The reverse scan from the last rank down to this one, in closed form: mu = dL/d(this
        #    rank's end state) = sum over the later ranks k of (product of the decays of the ranks
        #    between) * G_k (where rank k's first token continues the sequence), plus the final
        #    state's gradient through every later rank.
        r = spec.rank
        X = torch.cat([torch.where(ctx.cont[r + 1:, :, None, None, None], all_G[r + 1:], torch.zeros_like(all_G[r + 1:])),
                       mu[None]])
        mu = _chain(X, ctx.all_a[r + 1:], ctx.through[r + 1:], reverse=True)

        # 4. The whole shard's graph: y0 beyond the prefix, the end state S (mu), and the decay a,
        #    which scales the entry state into this rank's end state (rank 0 has none).
        pieces = [(ctx.S, mu.to(ctx.S.dtype))]
        if ctx.y0.shape[1] > 0:
            dy0 = dy
            if buckets:
                dy0 = dy.clone()
                for T, _, heads in buckets:  # that part of y came from the prefix's graph (step 1)
                    _write_heads(dy0, T, heads, torch.zeros_like(_read_heads(dy0, T, heads)))
            pieces.append((ctx.y0, dy0))
        if ctx.a is not None:
            pieces.append((ctx.a, (mu * ctx.entry).sum((-1, -2)).to(ctx.a.dtype)))
        pieces = [(o, g) for o, g in pieces if o.requires_grad]
        if pieces and wanted:
            accumulate(torch.autograd.grad([o for o, _ in pieces], [leaves[i] for i in wanted],
                                           [g for _, g in pieces], allow_unused=True))
        return (None, *grads)


def _context_parallel_scan(x, dt, A, B, C, chunk_size, *, D=None, z=None, dt_bias=None, initial_states=None,
                           seq_idx=None, dt_softplus=False, dt_limit=(0.0, float("inf")), cuda_path="auto",
                           group=None, local: LocalScan | None = None):
    """(y, final_states) of the sharded scan; `local` replaces the op (tests)."""
    if not dist.is_available() or not dist.is_initialized():
        raise RuntimeError(f"{_NAME}: torch.distributed is not initialized (call init_process_group first)")
    if x.dim() != 4 or B.dim() != 4:
        # The exchange is sized from these shapes: refused here, before any collective.
        raise ValueError(f"{_NAME}: x and B must be 4-d tensors [batch, seqlen, heads, headdim] and "
                         f"[batch, seqlen, groups, dstate], got shapes {tuple(x.shape)} and {tuple(B.shape)}")
    spec = _Spec(chunk_size=chunk_size, seq_idx=seq_idx, dt_softplus=dt_softplus, dt_limit=tuple(dt_limit),
                 cuda_path=cuda_path, group=group, rank=dist.get_rank(group), world=dist.get_world_size(group),
                 local=local or _op_local)
    if spec.rank < 0:
        raise ValueError(f"{_NAME}: this process is not a member of the group it was given")
    if spec.world == 1:  # nothing to exchange: the local scan itself (and its own autograd)
        return spec.local(x, dt, A, B, C, chunk_size, D=D, z=z, dt_bias=dt_bias, initial_states=initial_states,
                          seq_idx=seq_idx, dt_softplus=dt_softplus, dt_limit=tuple(dt_limit), cuda_path=cuda_path,
                          return_final_states=True)
    tensors = (x, dt, A, B, C, D, z, dt_bias, initial_states)
    spec.building = torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in tensors)
    return _ContextParallelScan.apply(spec, *tensors)
