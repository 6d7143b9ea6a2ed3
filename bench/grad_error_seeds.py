"""dA's error against the float64 oracle, ours and mamba_ssm on the same inputs, over several seeds of
one of bench.py's rows (its input distribution and its check slice): one draw of dA's error moves a
lot (docs/perf-log.md, "Backward b9"), so compare the two over draws. Needs a GPU, the package and
the peers (scripts/get_peers.sh). Usage: python3 bench/grad_error_seeds.py [seeds, 8] [row name, 4K]"""
import os
import sys

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import bench  # noqa: E402  (this folder's bench.py: rows, inputs, oracle)

sys.path.insert(0, os.path.join(HERE, "..", ".peers"))  # the peers, as bench.py finds them
sys.path.append(os.path.join(HERE, "..", ".peers", "_deps"))
nseeds = int(sys.argv[1]) if len(sys.argv) > 1 else 8
name = sys.argv[2] if len(sys.argv) > 2 else "4K"
row = next((r for r in bench.SHAPES if r.name == name), None)
if row is None:
    sys.exit(f"grad_error_seeds: unknown row {name!r}; choose among {[r.name for r in bench.SHAPES]}")
b, L, H, P, N, G = row.shape
fns = {i: bench.peer_fn(i) for i in ("ours", "mamba_ssm")}
print("seed  " + "  ".join(f"{i:>9s} dA" for i in fns) + "   | worst other grad: " + "  ".join(fns))
tot = {i: [] for i in fns}
for seed in range(nseeds):
    s = bench.make_inputs(row, 7000 + seed, "cuda")
    p = bench.make_params(row, 7900 + seed, "cuda")
    gen = torch.Generator(device="cuda").manual_seed(7500 + seed)
    s["dout"] = bench.slice_dout(row.shape, torch.randn(b, L, H, P, generator=gen, device="cuda").bfloat16())
    grads = {}
    for impl, fn in fns.items():
        leaves, step = bench.make_step(impl, fn, [s], p["A"], p["D"], row.chunk)
        grads[impl] = dict(zip(bench.GRADS, step(0)))
    errs = bench.slice_grad_errors(row.shape, s, p["A"], p["D"], s["dout"], grads)
    for i in fns:
        tot[i].append(errs[i]["A"])
    print(f"{seed:4d}  " + "  ".join(f"{errs[i]['A']:12.2e}" for i in fns) + "   | " +
          "  ".join(f"{max(v for k, v in errs[i].items() if k != 'A'):.2e}" for i in fns), flush=True)
for i, v in tot.items():
    v = sorted(v)
    print(f"{i}: dA error median {v[len(v) // 2]:.2e}, max {v[-1]:.2e}, geometric mean "
          f"{torch.tensor(v).log().mean().exp().item():.2e}")
