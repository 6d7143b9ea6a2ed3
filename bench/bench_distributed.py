#!/usr/bin/env python3
"""Scaling of mamba2ssd.distributed (context parallelism) over the GPUs of one host: time and parallel
efficiency at fixed total length (strong scaling) and at fixed length per GPU (weak scaling).

    torchrun --nproc_per_node=8 bench/bench_distributed.py            # NCCL, rows for 1, 2, 4, 8 GPUs
    torchrun --nproc_per_node=2 bench/bench_distributed.py --device cpu --per-gpu 4096 --total 8192 \\
        --heads 2 --iters 2                                            # gloo smoke run, no GPU

One launch measures every group size n in --sizes that fits (a power of two up to the world size),
each on the first n ranks (a subgroup; the other ranks wait), so the rows of one table come from
one process set. Per row: the distributed forward on batch 1, the headline head configuration (H 8,
P 64, N 128, G 1, bf16, chunk 128), the benchmark's inputs (dt = softplus(N(-3, 1)), A in [-16, -1],
D per head; --slow-decay: A = -1e-4, so that every rank reruns its whole shard: the worst case).
Timed: barrier, synchronize, the call, synchronize; the row's time is the slowest rank's, median of
--iters after --warmup. Efficiency: strong t1 / (n t(n)), weak t1 / t(n), t1 being the plain op
(mamba2ssd.mamba_chunk_scan_combined, no exchange) on one GPU over the one-GPU row's length: what a
user would run without context parallelism, so the efficiency includes every overhead of it.

Also per row, from the group's last rank: its prefix rerun length (tokens of its shard that the entry
state reaches) and the time of the plain op on its shard, so the overhead splits into the exchange,
the scan and the prefix. No numbers are written anywhere by this script: paste what a real run
prints into docs/benchmarks.md (with the machine, date and commit). --json prints one object per row.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import statistics
import time

import torch
import torch.distributed as dist

import mamba2ssd
import mamba2ssd.distributed as cp


def parse():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
    p.add_argument("--total", type=int, default=1 << 23, help="tokens of the fixed-total rows (default 8M)")
    p.add_argument("--per-gpu", type=int, default=1 << 20, help="tokens per rank of the fixed-per-GPU rows (1M)")
    p.add_argument("--sizes", default="1,2,4,8", help="group sizes to measure (those up to the world size)")
    p.add_argument("--heads", type=int, default=8)
    p.add_argument("--headdim", type=int, default=64)
    p.add_argument("--dstate", type=int, default=128)
    p.add_argument("--groups", type=int, default=1)
    p.add_argument("--chunk", type=int, default=128)
    p.add_argument("--dtype", choices=["bf16", "fp16", "fp32"], default="bf16")
    p.add_argument("--slow-decay", action="store_true", help="A = -1e-4: the entry state reaches whole shards")
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--iters", type=int, default=20)
    p.add_argument("--backward", action="store_true",
                   help="time forward + backward (needs the op's backward; x, B, C, dt require grad)")
    p.add_argument("--compare-prefix", action="store_true",
                   help="rank 0 alone: the op over a whole --per-gpu shard, the op again over it from an entry "
                        "state (the prefix rerun at its worst), and the same correction in torch ops")
    p.add_argument("--json", action="store_true")
    return p.parse_args()


def inputs(L, args, device, seed):
    # Drawn on the device: the fixed-total row on one GPU holds 8M tokens (x alone 8 GiB in bf16).
    g = torch.Generator(device=device).manual_seed(seed)
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}[args.dtype]
    H, P, N, G = args.heads, args.headdim, args.dstate, args.groups

    def randn(*shape, dtype=torch.float32):
        return torch.randn(*shape, generator=g, device=device, dtype=dtype)

    kw = dict(x=randn(1, L, H, P, dtype=dtype), dt=randn(1, L, H) - 3.0, B=randn(1, L, G, N, dtype=dtype),
              C=randn(1, L, G, N, dtype=dtype), D=randn(H), dt_softplus=True)
    kw["A"] = (torch.full((H,), -1e-4, device=device) if args.slow_decay
               else -(1.0 + 15.0 * torch.rand(H, generator=g, device=device)))
    return kw


def timed(fn, group, device, args):
    """Median over --iters of the slowest rank's time of fn(), in seconds."""
    times = []
    for i in range(args.warmup + args.iters):
        dist.barrier(group=group)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        t0 = time.perf_counter()
        fn()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        t = torch.tensor([time.perf_counter() - t0], dtype=torch.float64, device=device)
        dist.all_reduce(t, op=dist.ReduceOp.MAX, group=group)
        if i >= args.warmup:
            times.append(t.item())
    return statistics.median(times)


class PrefixRecorder:
    """The op as distributed.py's local scan, recording the prefix reruns' lengths."""

    def __init__(self):
        self.lengths = []

    def __call__(self, x, *a, return_final_states, **kw):
        if not return_final_states:
            self.lengths.append(x.shape[1])
        return cp._op_local(x, *a, return_final_states=return_final_states, **kw)


def compare_prefix(args, device):
    """How to get y from the entry state, at the worst case (the state reaches the whole shard):
    the op again from it (what distributed.py does), or y0 + exp(g_t) C_t . h (gated by silu(z)) in
    torch ops. Printed as times and fractions of the op's whole-shard time."""
    L = args.per_gpu
    kw = inputs(L, args, device, seed=7)
    kw["z"] = torch.randn_like(kw["x"])
    h = torch.randn(1, args.heads, args.headdim, args.dstate, device=device)
    chunk = args.chunk
    group = dist.new_group([0])

    def op():
        return mamba2ssd.mamba_chunk_scan_combined(**kw, chunk_size=chunk)

    def rerun():
        return mamba2ssd.mamba_chunk_scan_combined(**kw, chunk_size=chunk, initial_states=h)

    y0 = op()
    per_group = args.heads // args.groups

    def correction():
        d = torch.nn.functional.softplus(kw["dt"].float())
        g = torch.cumsum(kw["A"] * d, 1)  # [1, L, H]
        Ch = torch.einsum("blgn,bghpn->blghp", kw["C"].float(),
                          h.view(1, args.groups, per_group, args.headdim, args.dstate)).flatten(2, 3)
        zf = kw["z"].float()
        return (y0.float() + torch.exp(g)[..., None] * Ch * (zf * torch.sigmoid(zf))).to(y0.dtype)

    with torch.no_grad():
        t_op, t_rerun, t_corr = (timed(f, group, device, args) for f in (op, rerun, correction))
    print(f"# compare-prefix, {L} tokens, z on: op {1e3 * t_op:.3f} ms; op again from the entry state "
          f"{1e3 * t_rerun:.3f} ms ({t_rerun / t_op:.2f}); torch-op correction {1e3 * t_corr:.3f} ms "
          f"({t_corr / t_op:.2f})")


def main():
    args = parse()
    backend = "nccl" if args.device == "cuda" else "gloo"
    dist.init_process_group(backend)
    rank, world = dist.get_rank(), dist.get_world_size()
    if args.device == "cuda":
        local = int(os.environ.get("LOCAL_RANK", rank))
        torch.cuda.set_device(local)
        device = torch.device("cuda", local)
    else:
        device = torch.device("cpu")
    sizes = [n for n in map(int, args.sizes.split(",")) if n <= world]
    if not sizes or sizes[0] != 1:
        raise SystemExit("bench_distributed: --sizes must start with 1 (the one-GPU baseline)")
    groups = {n: dist.new_group(list(range(n))) for n in sizes}  # every rank creates every group
    chunk = args.chunk
    state_bytes = 4 * args.heads * args.headdim * args.dstate

    if args.compare_prefix:
        if rank == 0:
            compare_prefix(args, device)
        else:
            dist.new_group([0])  # every rank creates every group
        dist.barrier()

    if rank == 0 and not args.json:
        name = torch.cuda.get_device_name(device) if args.device == "cuda" else "CPU"
        print(f"# mamba2ssd {mamba2ssd.__version__} distributed scaling, {world} x {name}, backend {backend}, "
              f"torch {torch.__version__}, {datetime.datetime.now(datetime.timezone.utc):%Y-%m-%dT%H:%M}Z")
        print(f"# {'forward + backward' if args.backward else 'forward'}, b 1, H {args.heads}, P {args.headdim}, "
              f"N {args.dstate}, G {args.groups}, {args.dtype}, chunk {chunk}, "
              f"{'A = -1e-4 (slow decay)' if args.slow_decay else 'A in [-16, -1]'}; exchange per rank: "
              f"forward {state_bytes + 4 * args.heads + 24} B, backward {2 * state_bytes + 4} B")
        print("| mode | GPUs | tokens/GPU | total tokens | time ms | op alone ms (last rank) | prefix tokens (last rank) | efficiency vs the op on 1 GPU |")
        print("|---|---|---|---|---|---|---|---|")

    for mode in ("fixed total", "fixed per GPU"):
        base = None
        for n in sizes:
            L_rank = args.total // n if mode == "fixed total" else args.per_gpu
            row = None
            if rank < n:
                group = groups[n]
                kw = inputs(L_rank, args, device, seed=1000 * n + rank)
                recorder = PrefixRecorder()
                if args.backward:
                    for name in ("x", "dt", "B", "C"):
                        kw[name].requires_grad_(True)
                    dy = torch.randn_like(kw["x"])

                    def dist_step():
                        y, _ = cp._context_parallel_scan(**kw, chunk_size=chunk, group=group, local=recorder)
                        y.backward(dy)

                    def op_step():
                        mamba2ssd.mamba_chunk_scan_combined(**kw, chunk_size=chunk).backward(dy)

                    t, t_op = timed(dist_step, group, device, args), timed(op_step, group, device, args)
                else:
                    with torch.no_grad():
                        t = timed(lambda: cp._context_parallel_scan(**kw, chunk_size=chunk, group=group,
                                                                    local=recorder), group, device, args)
                        t_op = timed(lambda: mamba2ssd.mamba_chunk_scan_combined(**kw, chunk_size=chunk),
                                     group, device, args)
                prefix = recorder.lengths[-1] if recorder.lengths else 0
                del kw
                if rank == n - 1:
                    row = dict(mode=mode, gpus=n, tokens_per_gpu=L_rank, total=L_rank * n, time_ms=1e3 * t,
                               op_ms=1e3 * t_op, prefix=prefix)
            # The last rank of the group holds the row; every rank gets it (rank 0 prints it).
            box = [row]
            dist.broadcast_object_list(box, src=n - 1)
            row = box[0]
            if base is None:
                base = row["op_ms"]  # the plain op on one GPU (sizes start at 1)
            row["efficiency"] = base / (n * row["time_ms"]) if mode == "fixed total" else base / row["time_ms"]
            if rank == 0:
                if args.json:
                    print(json.dumps(row))
                else:
                    print(f"| {mode} | {n} | {row['tokens_per_gpu']} | {row['total']} | {row['time_ms']:.3f} | "
                          f"{row['op_ms']:.3f} | {row['prefix']} | {100 * row['efficiency']:.1f}% |")
            dist.barrier()
            if args.device == "cuda":
                torch.cuda.empty_cache()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
