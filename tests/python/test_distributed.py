"""Context parallelism (mamba2ssd.distributed) on the CPU: four processes joined by gloo, one
sequence sharded across 2, 3 or 4 of them (process subgroups of the four), each result compared with
the single-process op on the whole sequence and with the fp64 oracle.

The four workers are started once per module (spawned, each on a free port's rendezvous, one thread
each) and take one case at a time; a case that does not finish within TIMEOUT seconds (a hang in a
collective) fails its test and the workers are started again for the next one.

MAMBA2SSD_TEST_CP_BACKEND=nccl runs the same tests on four GPUs (one per worker; skipped with
fewer), the references still on the CPU.

The backward's plumbing (the exchange of the entry-state gradients, the reverse scan, the pieces'
graphs) is checked now, with a differentiable float64 torch recurrence in place of the op; with the
op itself once it has a backward (skipped until then), and its absence must give a clear error.
"""

from __future__ import annotations

import datetime
import os
import queue
import socket
import traceback

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

import mamba2ssd
import mamba2ssd.distributed as cp
from problems import assert_close, make_problem, oracle, rel_l2

WORLD = 4
TIMEOUT = 60.0  # seconds per case; the cases take well under one
STARTUP = 120.0  # more for the first case: four processes importing torch and meeting
BACKEND = os.environ.get("MAMBA2SSD_TEST_CP_BACKEND", "gloo")
if BACKEND == "nccl" and torch.cuda.device_count() < WORLD:
    pytest.skip(f"MAMBA2SSD_TEST_CP_BACKEND=nccl needs {WORLD} GPUs, found {torch.cuda.device_count()}",
                allow_module_level=True)
# The process groups a case may run on, by name: group rank order is sequence order.
MEMBERS = {"1": [0], "2": [0, 1], "3": [0, 1, 2], "4": [0, 1, 2, 3], "pair_a": [0, 1], "pair_b": [2, 3]}
SHARDED = ("x", "dt", "B", "C", "z", "seq_idx")  # [b, L, ...]: each rank gets its slice of L


# --- a differentiable float64 recurrence (the contract, token by token) -------------------------

def torch_scan(x, dt, A, B, C, chunk_size, D=None, z=None, dt_bias=None, initial_states=None, seq_idx=None,
               dt_softplus=False, dt_limit=(0.0, float("inf")), cuda_path="auto", return_final_states=False):
    """The contract's recurrence in plain torch ops, differentiable in every input; the local scan
    that stands in for the op in the backward tests, and their single-process reference."""
    b, L, H, P = x.shape
    G = B.shape[2]
    Bh, Ch = B.repeat_interleave(H // G, 2), C.repeat_interleave(H // G, 2)
    d = dt if dt_bias is None else dt + dt_bias
    if dt_softplus:
        d = torch.where(d <= 20.0, torch.log1p(torch.exp(d)), d)
    d = d.clamp(float(dt_limit[0]), float(dt_limit[1]))
    decay = torch.exp(A * d)
    ids = torch.zeros(b, L, dtype=torch.int64, device=x.device) if seq_idx is None else seq_idx.to(torch.int64)
    restart = ids != torch.cat([torch.zeros(b, 1, dtype=torch.int64, device=x.device), ids[:, :-1]], 1)
    h = initial_states if initial_states is not None else x.new_zeros(b, H, P, Bh.shape[3])
    ys = []
    for t in range(L):
        h = torch.where(restart[:, t, None, None, None], torch.zeros_like(h), h)
        h = decay[:, t, :, None, None] * h + (d[:, t, :, None, None] * x[:, t, :, :, None]) * Bh[:, t, :, None, :]
        yt = (h * Ch[:, t, :, None, :]).sum(-1)
        if D is not None:
            yt = yt + (D[None, :, None] if D.dim() == 1 else D[None]) * x[:, t]
        if z is not None:
            yt = yt * (z[:, t] * torch.sigmoid(z[:, t]))
        ys.append(yt)
    y = torch.stack(ys, 1) if ys else x.new_zeros(b, 0, H, P)
    return y, (h if return_final_states else None)


# --- the workers ---------------------------------------------------------------------------------

def _shard(kw, bounds, i, device="cpu"):
    lo, hi = bounds[i], bounds[i + 1]
    kw = {k: (v[:, lo:hi] if k in SHARDED and v is not None else v) for k, v in kw.items()}
    return {k: (v.to(device) if isinstance(v, torch.Tensor) else v) for k, v in kw.items()}


def _device():
    return torch.device("cuda", torch.cuda.current_device()) if BACKEND == "nccl" else torch.device("cpu")


def _cpu(t):
    return None if t is None else t.detach().cpu()


class _Recorder:
    """The op as the local scan, recording the length of every prefix run again from an entry
    state (the calls that do not ask for the final state)."""

    def __init__(self):
        self.prefix_lengths = []
        self.grad_modes = []  # whether each call records a graph

    def __call__(self, x, *args, return_final_states, **kw):
        self.grad_modes.append(torch.is_grad_enabled())
        if not return_final_states:
            self.prefix_lengths.append(x.shape[1])
        return cp._op_local(x, *args, return_final_states=return_final_states, **kw)


_DEFAULT_CALL_COST = cp._CALL_COST


def _forward_case(rank, members, task):
    i = members.index(rank)
    kw = _shard(task["kw"], task["bounds"], i, _device())
    if task.get("break_rank") == i:
        kw["dt"] = kw["dt"].to(torch.int32)  # the op refuses it on this rank only
    recorder = _Recorder()
    y, final_states = cp._context_parallel_scan(**kw, group=task["group_obj"], local=recorder)
    if task.get("public"):  # the public function gives the same
        y2, fs2 = cp.mamba_chunk_scan_combined(**kw, group=task["group_obj"], return_final_states=True)
        assert torch.equal(y2, y) and torch.equal(fs2, final_states)
        # and so does the forward that records graphs for a backward (inputs requiring grad)
        kw_grad = {k: (v.detach().clone().requires_grad_(True) if k in ("x", "B") else v) for k, v in kw.items()}
        y3, fs3 = cp.mamba_chunk_scan_combined(**kw_grad, group=task["group_obj"], return_final_states=True)
        assert y3.requires_grad and torch.equal(y3.detach(), y) and torch.equal(fs3.detach(), final_states)
        with torch.no_grad():  # inputs that require grad under no_grad: the plain path, no graphs
            grad_modes = _Recorder()
            y4, _ = cp._context_parallel_scan(**kw_grad, group=task["group_obj"], local=grad_modes)
        assert not y4.requires_grad and torch.equal(y4, y) and not any(grad_modes.grad_modes)
    return {"y": _cpu(y), "final_states": _cpu(final_states), "prefix_lengths": recorder.prefix_lengths}


def _backward_case(rank, members, task):
    i = members.index(rank)
    kw = _shard(task["kw"], task["bounds"], i, _device())
    for name in task["grad"]:
        kw[name] = kw[name].detach().clone().requires_grad_(True)
    local = torch_scan if task.get("local") == "torch" else None
    y, final_states = cp._context_parallel_scan(**kw, group=task["group_obj"], local=local)
    lo, hi = task["bounds"][i], task["bounds"][i + 1]
    # Every rank's loss uses the final state with a weight of its own: its gradient is their sum.
    w_y, w_final = task["w_y"][:, lo:hi].to(y.device), task["w_final"][i].to(y.device)
    loss = (y * w_y).sum() + (final_states * w_final).sum()
    loss.backward()
    return {name: _cpu(kw[name].grad) for name in task["grad"]}


def _worker(rank, port, tasks, results):
    torch.set_num_threads(1)  # four processes on a small CI machine
    if BACKEND == "nccl":
        torch.cuda.set_device(rank)
    dist.init_process_group(BACKEND, init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=WORLD,
                            timeout=datetime.timedelta(seconds=TIMEOUT))
    groups = {}
    for name, ranks in MEMBERS.items():  # every rank creates every group, in the same order
        groups[name] = dist.new_group(ranks)
    while (task := tasks.get()) is not None:
        try:
            out = {}
            for part in task["parts"]:  # several parts: disjoint groups at once
                members = MEMBERS[part["group"]]
                if rank in members:
                    part = dict(part, group_obj=groups[part["group"]])
                    case = _backward_case if "grad" in part else _forward_case
                    # call_cost: how readily the prefix reruns split into calls per head.
                    cp._CALL_COST = part.get("call_cost", _DEFAULT_CALL_COST)
                    try:
                        out = case(rank, members, part)
                    finally:
                        cp._CALL_COST = _DEFAULT_CALL_COST
            results.put((rank, "ok", out))
        except Exception as e:  # noqa: BLE001 (sent to the test)
            results.put((rank, "error", f"{type(e).__name__}: {e}\n{traceback.format_exc()}"))
    dist.destroy_process_group()


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class World:
    """The four worker processes; run() hands one task to each and returns their replies by rank."""

    def __init__(self):
        ctx = mp.get_context("spawn")
        self.results = ctx.Queue()
        self.tasks = [ctx.Queue() for _ in range(WORLD)]
        port = _free_port()
        self.procs = [ctx.Process(target=_worker, args=(r, port, self.tasks[r], self.results), daemon=True)
                      for r in range(WORLD)]
        for p in self.procs:
            p.start()
        self.broken = False
        self.started = False

    def run(self, *parts):
        for q in self.tasks:
            q.put({"parts": parts})
        replies = {}
        timeout = TIMEOUT if self.started else TIMEOUT + STARTUP
        try:
            while len(replies) < WORLD:
                rank, status, out = self.results.get(timeout=timeout)
                replies[rank] = (status, out)
        except queue.Empty:
            self.broken = True
            pytest.fail(f"timed out after {timeout} s (a hang in a collective?); replies from ranks {sorted(replies)}")
        self.started = True
        return replies

    def close(self):
        for q in self.tasks:
            q.put(None)
        for p in self.procs:
            p.join(timeout=10)
            if p.is_alive():
                p.kill()  # only the processes this fixture started


@pytest.fixture(scope="module")
def world_holder():
    holder = {}
    yield holder
    if "world" in holder:
        holder["world"].close()


@pytest.fixture
def world(world_holder):
    if "world" not in world_holder or world_holder["world"].broken:
        if "world" in world_holder:
            world_holder["world"].close()
        world_holder["world"] = World()
    return world_holder["world"]


def _ok(replies, ranks):
    for r in ranks:
        status, out = replies[r]
        assert status == "ok", f"rank {r}:\n{out}"
    return [replies[r][1] for r in ranks]


# --- forward ------------------------------------------------------------------------------------

def check_forward(world, kw, bounds, group, factor=1.0, **task):
    """The sharded run of kw against the op on the whole sequence and the oracle; returns the
    replies of the group's ranks in group order."""
    members = MEMBERS[group]
    assert bounds[0] == 0 and bounds[-1] == kw["x"].shape[1] and len(bounds) == len(members) + 1
    outs = _ok(world.run({"group": group, "kw": kw, "bounds": bounds, "public": True, **task}), members)
    y = torch.cat([o["y"] for o in outs], 1)
    final_states = outs[0]["final_states"]
    for o in outs:  # the same final state on every rank, bit for bit (one scan over the same pairs)
        assert torch.equal(o["final_states"], final_states)
    y_one, final_one = mamba2ssd.mamba_chunk_scan_combined(**kw, return_final_states=True)
    y_ref, final_ref, _ = oracle(kw)
    dtype = kw["x"].dtype
    assert y.dtype == dtype
    assert_close(y, y_ref, dtype, "y", factor)
    assert_close(final_states, final_ref, dtype, "final_states", factor)
    # The sharded run against the single-process run: the same function, rounded differently.
    tol = mamba2ssd.tolerance(dtype) * factor
    assert rel_l2(y, y_one.double()) <= tol and rel_l2(final_states, final_one.double()) <= tol
    return outs


@pytest.mark.parametrize("group,bounds", [
    ("2", [0, 80, 160]),
    ("2", [0, 17, 160]),
    ("3", [0, 64, 100, 160]),
    ("3", [0, 1, 150, 160]),
    ("4", [0, 40, 80, 120, 160]),
    ("4", [0, 70, 71, 130, 160]),
], ids=lambda v: v if isinstance(v, str) else "-".join(map(str, v)))
def test_forward_shards(world, group, bounds):
    kw = make_problem(b=2, L=160, D="head", dt_bias=True, dt_softplus=True, initial_states=True, seed=1)
    outs = check_forward(world, kw, bounds, group)
    # Rank 0 starts from initial_states in its own pass; every other rank reruns its prefix.
    assert outs[0]["prefix_lengths"] == []
    assert all(len(o["prefix_lengths"]) == 1 for o in outs[1:])


def test_forward_one_rank_is_the_op(world):
    kw = make_problem(b=2, L=100, initial_states=True, seqlens=[60, 40], seq_idx=True, seed=16)
    (out,) = check_forward(world, kw, [0, 100], "1")
    y_one, final_one = mamba2ssd.mamba_chunk_scan_combined(**kw, return_final_states=True)
    assert torch.equal(out["y"], y_one) and torch.equal(out["final_states"], final_one)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_forward_features(world, dtype):
    # z, D per (head, dim), groups of heads sharing B and C, dt limits, no initial state.
    kw = make_problem(b=2, L=150, H=4, G=2, D="dim", z=True, dt_bias=True, dt_softplus=True,
                      dt_limit=(0.01, 0.08), dtype=dtype, chunk_size=64, seed=2)
    outs = check_forward(world, kw, [0, 33, 90, 150], "3")
    assert outs[1]["prefix_lengths"] == [57] and outs[2]["prefix_lengths"] == [60]


@pytest.mark.parametrize("seqlens,bounds", [
    ([50, 70, 40], [0, 40, 100, 160]),        # both sequences cross a shard edge
    ([30, 100, 30], [0, 45, 90, 130, 160]),   # a shard entirely inside the middle sequence
    ([40, 40, 40, 40], [0, 40, 80, 120, 160]),  # sequences start exactly at shard edges
    ([10, 20, 5, 60, 65], [0, 50, 100, 160]),  # several resets inside shards
], ids=["cross", "inside", "aligned", "many"])
def test_forward_packed(world, seqlens, bounds):
    kw = make_problem(b=2, L=160, seqlens=seqlens, seq_idx=True, initial_states=True, z=True, D="head", seed=3)
    outs = check_forward(world, kw, bounds, str(len(bounds) - 1))
    if seqlens == [40, 40, 40, 40]:
        # Every shard starts a sequence: the entry state reaches nothing, no prefix is rerun.
        assert all(o["prefix_lengths"] == [] for o in outs)


def test_forward_ids_that_return(world):
    # The recurrence restarts wherever the id changes, also back to an earlier id: rank 1's shard
    # starts and ends with id 0 but has two resets inside, so no state passes through it.
    kw = make_problem(b=1, L=90, initial_states=True, seed=17)
    kw["seq_idx"] = torch.tensor([[0] * 40 + [1] * 10 + [0] * 40], dtype=torch.int32)
    check_forward(world, kw, [0, 30, 60, 90], "3")


def test_forward_shard_inside_one_sequence_passes_state_through(world):
    # Ranks 1 and 2 hold tokens of the first sequence only; rank 3 starts the second one.
    kw = make_problem(b=1, L=160, seqlens=[130, 30], seq_idx=True, initial_states=True, seed=4)
    check_forward(world, kw, [0, 50, 90, 130, 160], "4")


def test_forward_fast_decay_reruns_a_short_prefix(world):
    # Decays of -0.5 to -4 per token: the entry state's weight underflows fp32 after at most a few
    # hundred tokens, so the prefix that is run again stops well before the shard's end.
    kw = make_problem(b=1, L=600, H=2, G=1, N=16, initial_states=True, seed=5)
    kw["A"] = -torch.tensor([20.0, 40.0])
    kw["dt"] = 0.025 + 0.075 * torch.rand(kw["dt"].shape, generator=torch.Generator().manual_seed(6))
    outs = check_forward(world, kw, [0, 300, 600], "2")
    (length,) = outs[1]["prefix_lengths"]  # one call: splitting would save less than a call costs
    assert 0 < length < 300


@pytest.mark.parametrize("G", [1, 2])
def test_forward_prefix_per_head(world, G):
    # One slow head (group) and fast ones; with calls free, the reruns split: the fast heads'
    # (groups') prefix ends early, the slow one's runs to the shard's end.
    kw = make_problem(b=2, L=400, H=4, G=G, N=16, z=True, D="dim", seqlens=[250, 150], seq_idx=True,
                      initial_states=True, seed=13)
    kw["A"] = -torch.tensor([0.5, 40.0, 30.0, 0.4]) if G == 1 else -torch.tensor([40.0, 30.0, 0.5, 0.4])
    kw["dt"] = 0.025 + 0.075 * torch.rand(kw["dt"].shape, generator=torch.Generator().manual_seed(14))
    outs = check_forward(world, kw, [0, 120, 290, 400], "3", call_cost=0)
    for o in outs[1:]:
        assert len(o["prefix_lengths"]) >= 2 and min(o["prefix_lengths"]) < max(o["prefix_lengths"])


def test_forward_nan_stays_before_a_reset(world):
    # A NaN in rank 0's first sequence reaches the rest of that sequence (on rank 1 too), and nothing
    # after the reset inside rank 1: the chain is cut there, not multiplied by a zero decay.
    kw = make_problem(b=1, L=120, seqlens=[50, 70], seq_idx=True, seed=15)
    kw["x"][0, 5, 0, 0] = float("nan")
    replies = _ok(world.run({"group": "3", "kw": kw, "bounds": [0, 30, 60, 120]}), [0, 1, 2])
    y = torch.cat([o["y"] for o in replies], 1).double()
    y_ref, final_ref, _ = oracle(kw)
    assert torch.equal(torch.isfinite(y), torch.isfinite(y_ref))
    assert not torch.isfinite(y_ref[0, 5:50, 0, 0]).any() and torch.isfinite(y_ref[0, 50:]).all()
    finite = torch.isfinite(y_ref)
    assert rel_l2(y[finite], y_ref[finite]) <= mamba2ssd.tolerance(torch.float32)
    assert torch.isfinite(replies[2]["final_states"]).all()


def test_forward_empty_shards(world):
    kw = make_problem(b=2, L=100, initial_states=True, D="head", seed=7)
    check_forward(world, kw, [0, 0, 60, 60, 100], "4")      # rank 0 empty: its initial state passes on
    check_forward(world, kw, [0, 100, 100], "2")           # the last rank empty


def test_forward_disjoint_groups_at_once(world):
    # Two sequences, each across its own pair of ranks, in the same step.
    kw_a = make_problem(b=1, L=100, initial_states=True, seed=8)
    kw_b = make_problem(b=1, L=120, z=True, seed=9)
    replies = world.run({"group": "pair_a", "kw": kw_a, "bounds": [0, 30, 100]},
                        {"group": "pair_b", "kw": kw_b, "bounds": [0, 70, 120]})
    for kw, ranks in ((kw_a, [0, 1]), (kw_b, [2, 3])):
        outs = _ok(replies, ranks)
        y_ref, final_ref, _ = oracle(kw)
        assert_close(torch.cat([o["y"] for o in outs], 1), y_ref, torch.float32)
        assert_close(outs[1]["final_states"], final_ref, torch.float32, "final_states")


def test_independent_shards_would_fail(world):
    # The check has teeth: each shard run alone (no exchange) is far outside the tolerance.
    kw = make_problem(b=2, L=160, initial_states=True, seed=11)
    bounds = [0, 40, 80, 120, 160]
    y_ref, _, _ = oracle(kw)
    alone = torch.cat([mamba2ssd.mamba_chunk_scan_combined(**_shard(kw, bounds, i)) for i in range(4)], 1)
    assert rel_l2(alone, y_ref) > 100 * mamba2ssd.tolerance(torch.float32)
    check_forward(world, kw, bounds, "4")


def test_failure_on_one_rank_raises_everywhere(world):
    kw = make_problem(b=1, L=90, seed=12)
    replies = world.run({"group": "3", "kw": kw, "bounds": [0, 30, 60, 90], "break_rank": 1})
    assert replies[1][0] == "error" and "dt must be a floating-point tensor" in replies[1][1]
    for r in (0, 2):
        assert replies[r][0] == "error" and "failed on group rank(s) [1]" in replies[r][1]
    assert replies[3][0] == "ok"  # not in the group
    # The workers are still in step: the next case runs.
    check_forward(world, kw, [0, 30, 60, 90], "3")


def test_prefix_calls_split_by_cost(monkeypatch):
    # Units (heads) by reach: one call while a call costs more than the work it saves, and calls
    # that follow the reaches once calls are free; units that reach nothing are not run.
    monkeypatch.setattr(cp, "_CALL_COST", 1000)
    assert cp._buckets([100, 0, 50, 100], 1) == [(100, [0, 2, 3])]
    monkeypatch.setattr(cp, "_CALL_COST", 0)
    assert cp._buckets([100, 0, 50, 100], 1) == [(100, [0, 3]), (50, [2])]
    monkeypatch.setattr(cp, "_CALL_COST", 40)  # saving 50 head-tokens is worth one more call
    assert cp._buckets([100, 50], 1) == [(100, [0]), (50, [1])]
    assert cp._buckets([100, 50], 2) == [(100, [0]), (50, [1])]  # groups of 2 heads: saving 100
    monkeypatch.setattr(cp, "_CALL_COST", 60)
    assert cp._buckets([100, 50], 1) == [(100, [0, 1])]
    assert cp._buckets([0, 0], 1) == []


def test_refusals_before_any_collective():
    kw = make_problem(b=1, L=32, seqlens=[16, 16], cu_seqlens=True)
    with pytest.raises(ValueError, match="cu_seqlens and return_varlen_states are not supported"):
        cp.mamba_chunk_scan_combined(**kw)
    kw.pop("cu_seqlens")
    with pytest.raises(ValueError, match="not supported across ranks"):
        cp.mamba_chunk_scan_combined(**kw, return_varlen_states=True)
    if not dist.is_initialized():
        with pytest.raises(RuntimeError, match="torch.distributed is not initialized"):
            cp.mamba_chunk_scan_combined(**kw)
    # Arguments of the wrong kind, named as the op names them.
    with pytest.raises(TypeError, match=r"distributed.mamba_chunk_scan_combined: dt_limit must be a pair"):
        cp.mamba_chunk_scan_combined(**kw, dt_limit=None)
    with pytest.raises(TypeError, match=r"distributed.mamba_chunk_scan_combined: x must be a torch.Tensor, got NoneType"):
        cp.mamba_chunk_scan_combined(**{**kw, "x": None})


# --- backward -----------------------------------------------------------------------------------

GRAD_INPUTS = ("x", "dt", "A", "B", "C", "D", "z", "dt_bias", "initial_states")


def _backward_problem(seed, seqlens=None, L=48, dtype=torch.float64):
    kw = make_problem(b=2, L=L, H=4, P=32, G=2, N=16, D="head", z=True, dt_bias=True, dt_softplus=True,
                      initial_states=True, seqlens=seqlens, seq_idx=seqlens is not None, seed=seed)
    kw = {k: (v.to(dtype) if isinstance(v, torch.Tensor) and v.is_floating_point() else v) for k, v in kw.items()}
    g = torch.Generator().manual_seed(seed + 100)
    w_y = torch.randn(kw["x"].shape, generator=g, dtype=torch.float64)
    w_final = torch.randn(4, *kw["initial_states"].shape, generator=g, dtype=torch.float64)
    return kw, w_y, w_final


def _reference_grads(kw, w_y, w_final, members):
    """Single-process autograd of the float64 recurrence, with the same loss summed over ranks."""
    ref = {k: (v.detach().double().clone().requires_grad_(True) if k in GRAD_INPUTS else v) for k, v in kw.items()}
    y, final_states = torch_scan(**ref, return_final_states=True)
    loss = (y * w_y).sum() + sum((final_states * w_final[i]).sum() for i in range(len(members)))
    loss.backward()
    return {k: ref[k].grad for k in GRAD_INPUTS}


def check_backward(world, kw, w_y, w_final, bounds, group, local, tol, **task):
    members = MEMBERS[group]
    outs = _ok(world.run({"group": group, "kw": kw, "bounds": bounds, "grad": GRAD_INPUTS, "local": local,
                          "w_y": w_y.to(kw["x"].dtype), "w_final": w_final, **task}), members)
    ref = _reference_grads(kw, w_y, w_final, members)
    for name in GRAD_INPUTS:
        grads = [o[name] for o in outs]
        if name in SHARDED:  # each rank's slice; an empty shard's may be None
            for i, g in enumerate(grads):
                assert g is not None or bounds[i] == bounds[i + 1], f"d{name}: None on group rank {i}"
            got = torch.cat([g for g in grads if g is not None], 1)
        elif name == "initial_states":
            got = grads[0]  # read on rank 0 only
            for g in grads[1:]:
                assert g is None or not g.any(), "initial_states got a gradient on a rank other than 0"
        else:
            got = sum(g for g in grads if g is not None)  # each rank's share (none from an empty shard)
        err = rel_l2(got, ref[name])
        assert err <= tol, f"d{name}: relative L2 error {err:.3g} > {tol:.3g}"


@pytest.mark.parametrize("group,bounds,seqlens", [
    ("2", [0, 20, 48], None),
    ("3", [0, 10, 30, 48], [12, 20, 16]),
    ("4", [0, 12, 24, 36, 48], [5, 30, 13]),   # rank 2 inside one sequence
    ("4", [0, 0, 20, 20, 48], [30, 18]),      # empty shards
    ("3", [0, 12, 32, 48], [12, 20, 16]),     # row 0 starts a sequence at each edge, row 1 does not
], ids=["2", "3-packed", "4-packed", "4-empty", "3-rows-differ"])
def test_backward_plumbing_with_a_torch_local_scan(world, group, bounds, seqlens):
    # The distributed backward (piece graphs, the exchange, the reverse scan, the sum of the
    # final-state gradients) with the float64 recurrence as the local scan: exact up to fp64 rounding.
    kw, w_y, w_final = _backward_problem(seed=20, seqlens=seqlens)
    check_backward(world, kw, w_y, w_final, bounds, group, local="torch", tol=1e-9)


def test_backward_plumbing_prefix_per_group(world):
    # Group 0's heads decay fast (their prefix reruns end after a few tokens), group 1's do not; with
    # calls free the reruns split by group, and the gradients still match.
    kw, w_y, w_final = _backward_problem(seed=23, seqlens=[30, 18])
    kw["A"] = -torch.tensor([400.0, 300.0, 0.5, 0.4], dtype=torch.float64)
    check_backward(world, kw, w_y, w_final, [0, 16, 32, 48], "3", local="torch", tol=1e-9, call_cost=0)


def test_backward_through_the_op(world):
    kw, w_y, w_final = _backward_problem(seed=21, seqlens=[20, 28], dtype=torch.float32)
    kw["chunk_size"] = 64
    check_backward(world, kw, w_y, w_final, [0, 15, 30, 48], "3", local=None,
                   tol=4 * mamba2ssd.tolerance(torch.float32))
