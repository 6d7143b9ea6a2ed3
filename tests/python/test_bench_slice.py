"""bench/bench.py's backward check (slice_dout, slice_grad_errors) on the CPU with small tensors: an
implementation that returns the oracle's own gradients scores at rounding level, one scaled by 1e-3
scores 1e-3 on those gradients, and one not zero outside the slice scores NaN."""
import math
import pathlib
import sys

import pytest

torch = pytest.importorskip("torch")
sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2] / "bench"))
import bench  # noqa: E402


def test_slice_grad_errors_score_the_slice_and_flag_leaks(monkeypatch):
    monkeypatch.setattr(bench, "ORACLE_TOKENS", 48)
    torch.manual_seed(0)
    shape = (2, 80, 4, 8, 16, 2)
    b, L, H, P, N, G = shape
    s = dict(x=torch.randn(b, L, H, P).bfloat16(), dt=torch.nn.functional.softplus(torch.randn(b, L, H) - 3),
             B=torch.randn(b, L, G, N).bfloat16(), C=torch.randn(b, L, G, N).bfloat16())
    A, D = -torch.rand(H) * 4 - 1, torch.randn(H)
    dout = bench.slice_dout(shape, torch.randn(b, L, H, P).bfloat16())
    heads, Lc, groups = bench.backward_slice(shape)
    assert heads == [0, H - 1] and Lc == 48 and groups == [0, 1]
    assert float(dout[1].abs().sum()) == 0 and float(dout[0, Lc:].abs().sum()) == 0
    assert float(dout[0, :Lc, 1:H - 1].abs().sum()) == 0 and float(dout[0, :Lc, heads].abs().sum()) > 0
    head_group = [groups.index(h // (H // G)) for h in heads]
    ref = bench.oracle_grads(s["x"][0, :Lc, heads], s["dt"][0, :Lc, heads], A[heads], s["B"][0, :Lc, groups],
                             s["C"][0, :Lc, groups], D[heads], dout[0, :Lc, heads], head_group)

    def grads(scale=1.0, leak=False):
        g = dict(x=torch.zeros(b, L, H, P), dt=torch.zeros(b, L, H), A=torch.zeros(H), B=torch.zeros(b, L, G, N),
                 C=torch.zeros(b, L, G, N), D=torch.zeros(H))
        g["x"][0, :Lc, heads] = ref["x"].float() * scale
        g["dt"][0, :Lc, heads] = ref["dt"].float()
        g["A"][heads] = ref["A"].float() * scale
        g["B"][0, :Lc, groups] = ref["B"].float()
        g["C"][0, :Lc, groups] = ref["C"].float()
        g["D"][heads] = ref["D"].float()
        if leak:
            g["B"][0, Lc, 0, 0] = 1.0
        return g

    errs = bench.slice_grad_errors(shape, s, A, D, dout, dict(exact=grads(), off=grads(1.001), leaky=grads(leak=True)))
    assert max(errs["exact"].values()) < 1e-6
    assert errs["off"]["x"] == pytest.approx(1e-3, rel=1e-2) and errs["off"]["A"] == pytest.approx(1e-3, rel=1e-2)
    assert errs["off"]["B"] < 1e-6
    assert all(math.isnan(v) for v in errs["leaky"].values())
