# decode_rows_kernel (src/cuda/decode/decode_rows_kernel.cuh) and its layout (decode_cuda.cu) emulated
# in numpy (the stream kernel shares the row layout and the token's math, decode_kernel.cuh):
# every block of the grid, every thread's row and chunks, idle lanes and chunks, the shuffle
# reduction over a row's lanes, the slot rule, T tokens with per-token stores; checked against the
# recurrence in fp64. It checks the algorithm and the index arithmetic, not CUDA (no races, no
# rounding to bf16: fp64 throughout). Written after an idle chunk (dstate 48: 12 chunks on 16 lane
# slots) was found adding its S C to the row's output: this run fails on that kernel.
# Run: python3 tests/gpu/emulate_decode_kernel.py   (needs numpy; a few seconds; ctest: decode_kernel_emulation)
import itertools
import sys

try:
    import numpy as np
except ImportError:  # ctest counts exit status 77 as skipped
    print("SKIPPED: numpy is not installed")
    sys.exit(77)

THREADS, CHUNKS = 128, 4


def layout(N, es):
    kV = 16 // es
    cpr = N // kV
    chunks = CHUNKS if cpr >= CHUNKS else 2
    L = 1
    while L * chunks < cpr:
        L *= 2
    tile_rows = (THREADS // 32) * (32 // L)
    return kV, chunks, L, tile_rows


def usable(slot, S, pad):
    return -1 if slot == pad or slot < 0 or slot >= S else slot


def kernel(state, x, dt, A, B, C, D, z, bias, read, dst, pad, es):
    """The kernel's program, block by block, thread by thread (threads of a block vectorized)."""
    S, H, P, N = state.shape
    b, T = x.shape[:2]
    G = B.shape[2]
    kV, chunks, L, tile_rows = layout(N, es)
    row_tiles = -(-P // tile_rows)
    cache = state.copy()
    out = np.full((b, T, H, P), np.nan)
    tid = np.arange(THREADS)
    lane, warp = tid % 32, tid // 32
    col = lane % L
    for bx, bi in itertools.product(range(H * row_tiles), range(b)):
        h, tile = bx // row_tiles, bx % row_tiles
        g = h // (H // G)
        row = tile * tile_rows + warp * (32 // L) + lane // L
        p = np.where(row < P, row, -1)
        n0 = np.stack([np.where((col + c * L) * kV < N, (col + c * L) * kV, -1) for c in range(chunks)], 1)
        r = usable(read[bi], S, pad)
        if r < 0:
            for t in range(T):
                for k in np.nonzero((col == 0) & (p >= 0))[0]:
                    out[bi, t, h, p[k]] = 0.0
            continue
        s = np.zeros((THREADS, chunks, kV))
        for k, c in itertools.product(range(THREADS), range(chunks)):
            if p[k] >= 0 and n0[k, c] >= 0:
                s[k, c] = state[r, h, p[k], n0[k, c]:n0[k, c] + kV]
        for t in range(T):
            sB, sC = B[bi, t, g].copy(), C[bi, t, g].copy()
            d = dt[bi, t, h] + bias[h]
            d = np.log1p(np.exp(d)) if d <= 20 else d
            decay = np.exp(A[h] * d)
            xv = np.where(p >= 0, x[bi, t, h, np.maximum(p, 0)], 0.0)
            dx = d * xv
            y = np.zeros(THREADS)
            for c in range(chunks):
                n = np.maximum(n0[:, c], 0)
                dxc = np.where(n0[:, c] >= 0, dx, 0.0)  # the kernel's idle-chunk rule
                Bc = np.stack([sB[n + i] for i in range(kV)], 1)
                Cc = np.stack([sC[n + i] for i in range(kV)], 1)
                s[:, c] = decay * s[:, c] + dxc[:, None] * Bc
                y += (s[:, c] * Cc).sum(1)
            # __shfl_xor_sync butterfly over each row's L lanes (within each warp)
            off = L // 2
            while off > 0:
                y = y + y[(warp * 32) + (lane ^ off)]
                off //= 2
            for k in np.nonzero((col == 0) & (p >= 0))[0]:
                v = y[k] + D[h] * xv[k]
                zz = z[bi, t, h, p[k]]
                out[bi, t, h, p[k]] = v * zz / (1 + np.exp(-zz))
            ds = usable(dst[bi][t], S, pad) if dst is not None else (r if t == T - 1 else -1)
            if ds >= 0:
                for k, c in itertools.product(range(THREADS), range(chunks)):
                    if p[k] >= 0 and n0[k, c] >= 0:
                        cache[ds, h, p[k], n0[k, c]:n0[k, c] + kV] = s[k, c]
    return out, cache


def reference(state, x, dt, A, B, C, D, z, bias, read, dst, pad):
    S, H, P, N = state.shape
    b, T = x.shape[:2]
    G = B.shape[2]
    cache = state.copy()
    out = np.zeros((b, T, H, P))
    for bi in range(b):
        r = usable(read[bi], S, pad)
        if r < 0:
            continue
        for h in range(H):
            g = h // (H // G)
            st = state[r, h].copy()
            for t in range(T):
                d = dt[bi, t, h] + bias[h]
                d = np.log1p(np.exp(d)) if d <= 20 else d
                st = np.exp(A[h] * d) * st + d * np.outer(x[bi, t, h], B[bi, t, g])
                y = st @ C[bi, t, g] + D[h] * x[bi, t, h]
                out[bi, t, h] = y * z[bi, t, h] / (1 + np.exp(-z[bi, t, h]))
                ds = usable(dst[bi][t], S, pad) if dst is not None else (r if t == T - 1 else -1)
                if ds >= 0:
                    cache[ds, h] = st
    return out, cache


def main():
    rng = np.random.default_rng(0)
    worst, cases = 0.0, 0
    for es, N, P, T, with_dst in itertools.product((4, 2), (16, 48, 80, 128, 144, 256), (32, 64), (1, 2),
                                                   (False, True)):
        b, H, G = 3, 2, 1
        S = b * (T + 1) + 2
        state = rng.standard_normal((S, H, P, N))
        x = rng.standard_normal((b, T, H, P))
        dt = rng.uniform(-4, 1, (b, T, H))
        A = -np.exp(rng.uniform(-1.4, 1.4, H))
        B, C = rng.standard_normal((b, T, G, N)), rng.standard_normal((b, T, G, N))
        D, bias = rng.uniform(0.5, 1.5, H), rng.uniform(-0.5, 0.5, H)
        z = rng.standard_normal((b, T, H, P))
        perm = rng.permutation(S)
        read = [int(perm[0]), -1, S + 5]  # a slot, a pad, one outside the cache (skipped)
        dst = [[int(v) for v in perm[1 + i * T:1 + (i + 1) * T]] for i in range(b)] if with_dst else None
        got = kernel(state, x, dt, A, B, C, D, z, bias, read, dst, -1, es)
        want = reference(state, x, dt, A, B, C, D, z, bias, read, dst, -1)
        for name, a, w in (("out", got[0], want[0]), ("state", got[1], want[1])):
            err = np.abs(a - w).max() if np.isfinite(a).all() else np.inf
            worst = max(worst, err)
            if not err < 1e-9:
                print(f"FAIL es {es} N {N} P {P} T {T} dst {with_dst}: {name} max error {err}")
                sys.exit(1)
        cases += 1
    print(f"{cases} layouts and slot cases: the emulated kernel matches the recurrence (max error {worst:.1e})")


if __name__ == "__main__":
    main()
