# The three tile kernels of src/cuda_tile/ssd_tile.cuh emulated in numpy (fp64): the same tile-level
# math, masks, padding and workspace layout, checked against the contract's sequential recurrence.
# This checks the algorithm (sequence resets, decays, padding), not the Tile C++ API or the GPU.
# Run: python3 tests/cuda_tile/emulate_kernels.py   (needs numpy; under a second)
import numpy as np
LOG2E = 1.4426950408889634

def reference(x, dt, A, B, C, D, z, bias, softplus, lo, hi, init, seq):
    b, L, H, P = x.shape; G, N = B.shape[2], B.shape[3]
    y = np.zeros_like(x); fin = np.zeros((b, H, P, N))
    for bi in range(b):
        for h in range(H):
            g = h // (H // G)
            st = init[bi, h].copy() if init is not None else np.zeros((P, N))
            for t in range(L):
                d = dt[bi, t, h] + bias[h]
                if softplus: d = np.log1p(np.exp(d)) if d <= 20 else d
                d = min(max(d, lo), hi)
                if seq is not None and seq[bi, t] != (0 if t == 0 else seq[bi, t - 1]): st[:] = 0
                st = np.exp(A[h] * d) * st + d * np.outer(x[bi, t, h], B[bi, t, g])
                yt = st @ C[bi, t, g]
                if D is not None: yt = yt + (D[h] if D.ndim == 1 else D[h]) * x[bi, t, h]
                if z is not None: zz = z[bi, t, h]; yt = yt * zz / (1 + np.exp(-zz))
                y[bi, t, h] = yt
            fin[bi, h] = st
    return y, fin

def tile_emul(x, dt, A, B, C, D, z, bias, softplus, lo, hi, init, seq, Q):
    b, L, H, P = x.shape; G, N = B.shape[2], B.shape[3]
    nch = (L + Q - 1) // Q; lpad = nch * Q
    ws_dt = np.zeros((b, H, lpad)); ws_g = np.zeros((b, H, lpad)); ws_seq = np.zeros((b, lpad), np.int64)
    # kernel 1
    for bi in range(b):
        for h in range(H):
            for c in range(nch):
                t = np.arange(Q) + c * Q; valid = t < L
                d = np.where(valid, dt[bi, np.minimum(t, L - 1), h], 0.0) + bias[h]
                if softplus:
                    u = np.exp(d); w = u + 1
                    l1p = np.where(w == 1, u, np.log(w) * (u / np.where(w == 1, 1, w - 1)))
                    d = np.where(d <= 20, l1p, d)
                d = np.where(d < lo, lo, np.where(d > hi, hi, d))
                d = np.where(valid, d, 0.0)
                ws_dt[bi, h, c*Q:(c+1)*Q] = d
                ws_g[bi, h, c*Q:(c+1)*Q] = np.cumsum(d * (A[h] * LOG2E))
                if h == 0:
                    ws_seq[bi, c*Q:(c+1)*Q] = seq[bi, np.minimum(t, L - 1)] if seq is not None else 0
    # zero-padded views
    def rows(a, c):  # a: [L, K] -> [Q, K] with zero padding
        out = np.zeros((Q,) + a.shape[1:]); n = max(0, min(Q, L - c * Q)); out[:n] = a[c*Q:c*Q+n]; return out
    states = np.zeros((b, nch, H, P, N)); fin = np.zeros((b, H, P, N))
    # kernel 2 (whole P x N instead of 32 x 64 pieces: same math per element)
    for bi in range(b):
        for h in range(H):
            grp = h // (H // G)
            st = init[bi, h].copy() if init is not None else np.zeros((P, N))
            seq_prev = 0
            for c in range(nch):
                states[bi, c, h] = st
                g = ws_g[bi, h, c*Q:(c+1)*Q]; d = ws_dt[bi, h, c*Q:(c+1)*Q]; s = ws_seq[bi, c*Q:(c+1)*Q]
                g_last = ws_g[bi, h, c*Q + Q - 1]; seq_last = ws_seq[bi, c*Q + Q - 1]
                decay = 2.0 ** g_last if seq_last == seq_prev else 0.0
                w = np.where(s == seq_last, d * 2.0 ** (g_last - g), 0.0)
                xt = rows(x[bi, :, h], c); bw = rows(B[bi, :, grp], c) * w[:, None]
                st = xt.T @ bw + st * decay
                seq_prev = seq_last
            fin[bi, h] = st
    # kernel 3
    y = np.zeros_like(x)
    for bi in range(b):
        for h in range(H):
            grp = h // (H // G)
            for c in range(nch):
                Ct = rows(C[bi, :, grp], c); Bt = rows(B[bi, :, grp], c); Ht = states[bi, c, h]
                cb = Ct @ Bt.T; yacc = Ct @ Ht.T
                g = ws_g[bi, h, c*Q:(c+1)*Q]; d = ws_dt[bi, h, c*Q:(c+1)*Q]; s = ws_seq[bi, c*Q:(c+1)*Q]
                seq_prev = ws_seq[bi, c*Q - 1] if c > 0 else 0
                yacc = yacc * np.where(s == seq_prev, 2.0 ** g, 0.0)[:, None]
                idx = np.arange(Q)
                keep = (idx[None, :] <= idx[:, None]) & (s[None, :] == s[:, None])
                gap = np.where(keep, g[:, None] - g[None, :], 0.0)
                wts = np.where(keep, cb * 2.0 ** gap * d[None, :], 0.0)
                xt = rows(x[bi, :, h], c)
                yacc = wts @ xt + yacc
                if D is not None: yacc = yacc + xt * (D[h] if D.ndim == 1 else D[h][None, :])
                if z is not None: zf = rows(z[bi, :, h], c); yacc = yacc * (zf / (1 + np.exp(-zf)))
                n = max(0, min(Q, L - c * Q)); y[bi, c*Q:c*Q+n, h] = yacc[:n]
    return y, fin

rng = np.random.default_rng(0)
def case(b, L, H, P, N, G, Q, seqlens=None, D_per_dim=False, z=True, softplus=True, init=True, lo=0.001, hi=0.3):
    x = rng.normal(size=(b, L, H, P)); Bm = rng.normal(size=(b, L, G, N)); Cm = rng.normal(size=(b, L, G, N))
    dt = rng.uniform(-6, -1, size=(b, L, H)) if softplus else rng.uniform(0.002, 0.1, size=(b, L, H))
    A = -np.exp(rng.uniform(-1.4, 1.4, size=H)); bias = rng.uniform(-0.05, 0.05, size=H)
    D = rng.uniform(0.5, 1.5, size=(H, P) if D_per_dim else H)
    zz = rng.normal(size=(b, L, H, P)) if z else None
    ini = rng.normal(size=(b, H, P, N)) if init else None
    seq = None
    if seqlens is not None:
        seq = np.concatenate([np.full(n, i) for i, n in enumerate(seqlens)]).reshape(1, L).astype(np.int64)
    yr, fr = reference(x, dt, A, Bm, Cm, D, zz, bias, softplus, lo, hi, ini, seq)
    ye, fe = tile_emul(x, dt, A, Bm, Cm, D, zz, bias, softplus, lo, hi, ini, seq, Q)
    ey = np.linalg.norm(ye - yr) / np.linalg.norm(yr); ef = np.linalg.norm(fe - fr) / np.linalg.norm(fr)
    print(f"b{b} L{L} H{H} P{P} N{N} G{G} Q{Q} seqs={seqlens}: y rel {ey:.2e} final rel {ef:.2e}")
    assert ey < 1e-10 and ef < 1e-10

case(2, 150, 2, 8, 4, 1, 64)
case(1, 200, 2, 4, 4, 2, 64, D_per_dim=True)
case(1, 300, 2, 4, 4, 1, 64, seqlens=[50, 14, 64, 0, 1, 171])
case(1, 300, 2, 4, 4, 1, 128, seqlens=[0, 120, 180])
case(1, 129, 1, 4, 4, 1, 128, seqlens=[128, 1], softplus=False, z=False, init=True, lo=0.0, hi=np.inf)
print("emulation OK")
