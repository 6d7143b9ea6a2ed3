"""Smoke test of an installed mamba2ssd package, run by scripts/package_test.sh in a fresh virtual
environment on the wheel it built: the import comes from that environment, build_info() is complete
and names the expected version, and one small CPU forward (fp32, 2 x 100 tokens, 4 heads in 2
groups, head dim 32, state 16, D, dt_bias, softplus, final states) matches a plain PyTorch run of
the contract's recurrence (docs/contract.md) in fp64.

    python scripts/package_smoke.py [EXPECTED_VERSION]
"""

import os
import sys

import torch
import torch.nn.functional as F

import mamba2ssd


def recurrence(x, dt, A, B, C, D, dt_bias):
    """The contract's recurrence token by token in fp64: y [b, L, H, P] and the final state [b, H, P, N]."""
    x, dt, A, B, C, D, dt_bias = (t.double() for t in (x, dt, A, B, C, D, dt_bias))
    b, L, H, P = x.shape
    G, N = B.shape[2], B.shape[3]
    B = B.repeat_interleave(H // G, dim=2)  # head h reads group h // (H / G)
    C = C.repeat_interleave(H // G, dim=2)
    d = F.softplus(dt + dt_bias)  # [b, L, H]; softplus is linear above 20, as in the contract
    h = x.new_zeros(b, H, P, N)
    y = torch.empty_like(x)
    for t in range(L):
        decay = torch.exp(A * d[:, t])  # [b, H]
        h = decay[:, :, None, None] * h + d[:, t, :, None, None] * x[:, t, :, :, None] * B[:, t, :, None, :]
        y[:, t] = (h * C[:, t, :, None, :]).sum(-1) + D[None, :, None] * x[:, t]
    return y, h


def rel_l2(out, ref):
    return ((out.double() - ref).norm() / ref.norm()).item()


def main():
    expected_version = sys.argv[1] if len(sys.argv) > 1 else None
    where = os.path.realpath(mamba2ssd.__file__)
    print(f"package_smoke: mamba2ssd {mamba2ssd.__version__} from {where}")
    info = mamba2ssd.build_info()
    print(f"package_smoke: build_info() = {info}")

    failures = []
    if not where.startswith(os.path.realpath(sys.prefix) + os.sep):
        failures.append(f"imported from {where}, outside this environment ({sys.prefix})")
    keys = {"version", "cuda", "cuda_version", "gpu_targets", "cuda_tile", "torch_version"}
    if set(info) != keys:
        failures.append(f"build_info() has keys {sorted(info)}, expected {sorted(keys)}")
    if expected_version and (info.get("version") != expected_version or mamba2ssd.__version__ != expected_version):
        failures.append(f"version {info.get('version')} (__version__ {mamba2ssd.__version__}), expected {expected_version}")
    if info.get("cuda") and not (info.get("cuda_version") and info.get("gpu_targets")):
        failures.append("a CUDA build without its CUDA version or GPU targets")
    built_with = info.get("torch_version", "").split(".")[:2]
    if built_with != torch.__version__.split("+")[0].split(".")[:2]:
        failures.append(f"compiled against torch {info.get('torch_version')}, running torch {torch.__version__}")

    torch.manual_seed(0)
    b, L, H, P, G, N = 2, 100, 4, 32, 2, 16
    x = torch.randn(b, L, H, P)
    dt = torch.rand(b, L, H) * 0.2 - 3.0  # softplus(dt + dt_bias) about 0.05 to 0.1
    A = -torch.rand(H) - 0.5
    B = torch.randn(b, L, G, N)
    C = torch.randn(b, L, G, N)
    D = torch.randn(H)
    dt_bias = torch.rand(H) * 0.5
    y, final_states = mamba2ssd.mamba_chunk_scan_combined(x, dt, A, B, C, 64, D=D, dt_bias=dt_bias, dt_softplus=True,
                                                          return_final_states=True)
    y_ref, h_ref = recurrence(x, dt, A, B, C, D, dt_bias)
    tolerance = mamba2ssd.tolerance(torch.float32)
    ey, eh = rel_l2(y, y_ref), rel_l2(final_states, h_ref)
    verdict = "PASS" if ey <= tolerance and eh <= tolerance else "FAIL"
    print(f"package_smoke: cpu forward against the PyTorch recurrence: rel. L2 error y {ey:.2e}, "
          f"final states {eh:.2e} (tolerance {tolerance:.0e}): {verdict}")
    if verdict != "PASS":
        failures.append("the CPU forward is off the recurrence")

    for failure in failures:
        print(f"package_smoke: FAIL: {failure}", file=sys.stderr)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
