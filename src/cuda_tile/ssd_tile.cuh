// The seed's three kernels in CUDA Tile C++ (issue 7): chunk_cumsum, fwd_pass_state, compute_out.
//
// A tile kernel describes what one block does with whole tiles; the compiler picks the threads,
// shared memory, copies and tensor-core instructions. Kernels are launched <<<grid, 1>>>.
// Tile kernels take only scalars and pointers (no structs), hence the long parameter lists.
//
// Workspace (floats and ints, [batch, head, token]-major, tokens padded to whole chunks of Q):
//   dt     [b, H, Lpad]          dt after bias, softplus and clamp (0 on padding)
//   g      [b, H, Lpad]          within-chunk inclusive cumsum of A * dt, times log2(e)
//   seq    [b, Lpad]             sequence id per token (0 without seq_idx; padding repeats the last)
//   states [b, nchunks, H, P, N] state entering each chunk (fp32)
// The math is docs/ssd-math.md's chunked form; every exponential is an exp2 of a value <= 0.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_tf32.h>
#include <cuda_tile.h>

#include <cstdint>

namespace mamba2ssd::cuda_tile {

namespace ct = ::cuda::tiles;
using namespace ct::literals;

constexpr float kLog2e = 1.4426950408889634f;

// Tensor-core operand type of a storage type: 16-bit types as they are; fp32 as TF32 (without the
// cast, fp32 x fp32 mma compiles to FFMA, not to tensor cores).
template <typename T>
struct MmaType {
  using type = T;
};
template <>
struct MmaType<float> {
  using type = __nv_tf32;
};

template <typename T, typename Tile>
__tile__ auto mma_operand(Tile t) {
  return ct::element_cast<typename MmaType<T>::type>(ct::element_cast<T>(t));
}

// A [rows, cols] matrix whose rows are row_stride elements apart (columns contiguous), cut into
// R x K tiles. load_masked pads what lies outside [rows, cols] with zeros; store_masked writes only
// what lies inside.
template <int R, int K, typename E>
__tile__ auto matrix_view(E* base, int64_t rows, int64_t cols, int64_t row_stride) {
  using Extents = ct::extents<int64_t, ct::dynamic_extent, ct::dynamic_extent>;
  using Strides = ct::extents<int64_t, ct::dynamic_extent, 1>;
  return ct::partition_view{
      ct::tensor_span{base, ct::layout_strided_mapping{Extents{rows, cols}, Strides{row_stride}}},
      ct::shape<R, K>{}};
}

// A contiguous vector of n elements cut into tiles of Q.
template <int Q, typename E>
__tile__ auto vector_view(E* base, int64_t n) {
  return ct::partition_view{ct::tensor_span{base, ct::extents<int64_t, ct::dynamic_extent>{n}},
                            ct::shape<Q>{}};
}

// Column [Q, 1] and row [1, Q] forms of a vector, for broadcasting.
template <int Q, typename Tile>
__tile__ auto as_column(Tile t) {
  return ct::reshape(t, ct::shape<Q, 1>{});
}
template <int Q, typename Tile>
__tile__ auto as_row(Tile t) {
  return ct::reshape(t, ct::shape<1, Q>{});
}

// ---------------------------------------------------------------------------------------------
// Kernel 1, chunk_cumsum. One block per (chunk, head, batch row): the chunk's dt after
// preprocessing (d = dt + bias; softplus; clamp; 0 past the end) and g = cumsum(A d) log2(e).
// The head-0 block of each chunk also writes the chunk's sequence ids.
// Grid: (nchunks, H, b).
template <typename DT, int Q>
__tile_global__ void chunk_cumsum_tile(const DT* dt, int64_t dt_s0, int64_t dt_s1, int64_t dt_s2,
                                       const float* A, const float* dt_bias, int softplus, float dt_min,
                                       float dt_max, const int32_t* seq_idx, int64_t seq_s0, int64_t seq_s1,
                                       int64_t seqlen, int64_t nheads, int64_t lpad, float* ws_dt,
                                       float* ws_g, int32_t* ws_seq) {
  using TokQ = ct::tile<int64_t, ct::shape<Q>>;
  using FQ = ct::tile<float, ct::shape<Q>>;
  using IQ = ct::tile<int32_t, ct::shape<Q>>;
  const int64_t c = ct::bid().x, h = ct::bid().y, b = ct::bid().z;

  const TokQ t = ct::iota<TokQ>() + c * Q;  // token indices of the chunk
  const auto valid = t < seqlen;
  const DT* row = dt + b * dt_s0 + h * dt_s2;
  FQ d = ct::element_cast<float>(ct::load_masked(row + t * dt_s1, valid));

  float bias = 0.0f;
  if (dt_bias != nullptr) bias = dt_bias[h];
  d = d + bias;
  if (softplus != 0) {
    // softplus(d) = log1p(exp(d)) for d <= 20, else d. log1p(u) = log(w) u / (w - 1) with
    // w = 1 + u rounded, exact to a few ulps (and u itself where w rounds to 1).
    const FQ u = ct::exp(d);
    const FQ w = u + 1.0f;
    const FQ log1p_u = ct::select(w == 1.0f, u, ct::log(w) * (u / (w - 1.0f)));
    d = ct::select(d <= 20.0f, log1p_u, d);
  }
  d = ct::select(d < dt_min, ct::full<FQ>(dt_min), ct::select(d > dt_max, ct::full<FQ>(dt_max), d));
  d = ct::select(valid, d, ct::zeros<FQ>());  // padding: dt = 0, no effect on anything

  const FQ g = ct::partial_sum(d * (A[h] * kLog2e), 0_ic);
  const int64_t tok = (b * nheads + h) * lpad;
  vector_view<Q>(ws_dt + tok, lpad).store(d, c);
  vector_view<Q>(ws_g + tok, lpad).store(g, c);

  if (h == 0) {
    IQ s = ct::zeros<IQ>();
    if (seq_idx != nullptr) {
      const TokQ last_real = ct::min(t, seqlen - 1);  // padding belongs to the last token's sequence
      s = ct::load(seq_idx + b * seq_s0 + last_real * seq_s1);
    }
    vector_view<Q>(ws_seq + b * lpad, lpad).store(s, c);
  }
}

// ---------------------------------------------------------------------------------------------
// Kernel 2, fwd_pass_state. One block per (TP x TN tile of the state, head, batch row) walks the
// chunks in order; for each it stores the state entering the chunk, then applies the jump
//   h <- decay h + X^T (B * w),   w_j = dt_j exp2(g_last - g_j)   (one mma, K = Q)
// Tokens of an earlier sequence than the chunk's last token get w = 0, and decay = 0 when a
// sequence starts inside the chunk (else exp2(g_last)).
// Grid: (P / TP * ceil(N / TN), H, b).
template <typename T, int Q, int TP, int TN>
__tile_global__ void fwd_pass_state_tile(const T* x, int64_t x_s0, int64_t x_s1, int64_t x_s2,
                                         const T* B, int64_t B_s0, int64_t B_s1, int64_t B_s2,
                                         const float* init, int64_t init_s0, int64_t init_s1, int64_t init_s2,
                                         float* fin, int64_t fin_s0, int64_t fin_s1, int64_t fin_s2,
                                         const float* ws_dt, const float* ws_g, const int32_t* ws_seq,
                                         float* ws_states, int64_t seqlen, int64_t nheads, int64_t headdim,
                                         int64_t dstate, int64_t heads_per_group, int64_t nchunks,
                                         int64_t lpad) {
  using FQ = ct::tile<float, ct::shape<Q>>;
  using IQ = ct::tile<int32_t, ct::shape<Q>>;
  using TokQ = ct::tile<int64_t, ct::shape<Q>>;
  using QxTP = ct::tile<float, ct::shape<Q, TP>>;
  using QxTN = ct::tile<float, ct::shape<Q, TN>>;
  using State = ct::tile<float, ct::shape<TP, TN>>;
  const int64_t n_tiles = (dstate + TN - 1) / TN;
  const int64_t pt = ct::bid().x / n_tiles, nt = ct::bid().x % n_tiles;
  const int64_t h = ct::bid().y, b = ct::bid().z;
  const int64_t grp = h / heads_per_group;
  const int64_t tok = (b * nheads + h) * lpad;

  const auto xv = matrix_view<Q, TP>(x + b * x_s0 + h * x_s2, seqlen, headdim, x_s1);
  const auto bv = matrix_view<Q, TN>(B + b * B_s0 + grp * B_s2, seqlen, dstate, B_s1);
  const auto gv = vector_view<Q>(ws_g + tok, lpad);
  const auto dtv = vector_view<Q>(ws_dt + tok, lpad);
  const auto seqv = vector_view<Q>(ws_seq + b * lpad, lpad);

  State state = ct::zeros<State>();
  if (init != nullptr)
    state = matrix_view<TP, TN>(init + b * init_s0 + h * init_s1, headdim, dstate, init_s2).load_masked(pt, nt);

  int32_t seq_prev = 0;
  for (int64_t c = 0; c < nchunks; ++c) {
    // The state entering chunk c, for compute_out.
    float* entering = ws_states + ((b * nchunks + c) * nheads + h) * headdim * dstate;
    matrix_view<TP, TN>(entering, headdim, dstate, dstate).store_masked(state, pt, nt);

    const FQ g = gv.load(c);
    const FQ dt = dtv.load(c);
    const IQ seq = seqv.load(c);
    const float g_last = ws_g[tok + c * Q + Q - 1];
    const int32_t seq_last = ws_seq[b * lpad + c * Q + Q - 1];
    const float decay = seq_last == seq_prev ? ct::exp2(g_last) : 0.0f;
    const FQ w = ct::select(seq == seq_last, dt * ct::exp2(g_last - g), ct::zeros<FQ>());

    // Rows past L are zeroed by select as well as by the masked loads: on the H200, lengths that end
    // inside a chunk gave a non-finite final state for the last batch row (NaN read past the end
    // of x, times w = 0), so the padding of these loads is not trusted.
    const auto valid = as_column<Q>(ct::iota<TokQ>() + c * Q < seqlen);  // [Q, 1]
    const auto xt = ct::select(valid, ct::element_cast<float>(xv.load_masked(c, pt)), ct::zeros<QxTP>());
    const auto bw = ct::select(valid, ct::element_cast<float>(bv.load_masked(c, nt)) * as_column<Q>(w),
                               ct::zeros<QxTN>());
    state = ct::mma(mma_operand<T>(ct::transpose(xt)), mma_operand<T>(bw), state * decay);
    seq_prev = seq_last;
  }

  if (fin != nullptr)
    matrix_view<TP, TN>(fin + b * fin_s0 + h * fin_s1, headdim, dstate, fin_s2).store_masked(state, pt, nt);
}

// ---------------------------------------------------------------------------------------------
// Kernel 3, compute_out. One block per (chunk, head, batch row); with h the state entering the chunk
//   Y = exp2(g) * (C h^T) + ((C B^T) * exp2(g_i - g_j) * dt_j * [j <= i, same sequence]) X + D X
//   y = Y * silu(z)
// C B^T and C h^T accumulate over N in blocks of NB (zero padded past N). The causal mask comes
// from indices (iota), and masked entries are zeroed before exp2, so only values <= 0 reach it.
// Grid: (nchunks, H, b).
template <typename T, int Q, int P, int NB>
__tile_global__ void compute_out_tile(const T* x, int64_t x_s0, int64_t x_s1, int64_t x_s2,
                                      const T* z, int64_t z_s0, int64_t z_s1, int64_t z_s2,
                                      T* y, int64_t y_s0, int64_t y_s1, int64_t y_s2,
                                      const T* B, int64_t B_s0, int64_t B_s1, int64_t B_s2,
                                      const T* C, int64_t C_s0, int64_t C_s1, int64_t C_s2,
                                      const float* D, int D_layout, const float* ws_dt, const float* ws_g,
                                      const int32_t* ws_seq, const float* ws_states, int64_t seqlen,
                                      int64_t nheads, int64_t dstate, int64_t heads_per_group, int64_t nchunks,
                                      int64_t lpad) {
  using FQ = ct::tile<float, ct::shape<Q>>;
  using IQ = ct::tile<int32_t, ct::shape<Q>>;
  using FP = ct::tile<float, ct::shape<P>>;
  using IP = ct::tile<int32_t, ct::shape<P>>;
  using QxQ = ct::tile<float, ct::shape<Q, Q>>;
  using QxP = ct::tile<float, ct::shape<Q, P>>;
  const int64_t c = ct::bid().x, h = ct::bid().y, b = ct::bid().z;
  const int64_t grp = h / heads_per_group;
  const int64_t tok = (b * nheads + h) * lpad;

  // C B^T and C h^T over N.
  const auto cv = matrix_view<Q, NB>(C + b * C_s0 + grp * C_s2, seqlen, dstate, C_s1);
  const auto bv = matrix_view<Q, NB>(B + b * B_s0 + grp * B_s2, seqlen, dstate, B_s1);
  const auto hv = matrix_view<P, NB>(ws_states + ((b * nchunks + c) * nheads + h) * P * dstate, P, dstate, dstate);
  QxQ cb = ct::zeros<QxQ>();
  QxP y_acc = ct::zeros<QxP>();
  const int64_t nblocks = (dstate + NB - 1) / NB;
  for (int64_t k = 0; k < nblocks; ++k) {
    const auto ct_ = mma_operand<T>(cv.load_masked(c, k));  // [Q, NB]
    const auto bt = mma_operand<T>(bv.load_masked(c, k));   // [Q, NB]
    const auto ht = mma_operand<T>(hv.load_masked(0, k));   // [P, NB], fp32 state rounded to T
    cb = ct::mma(ct_, ct::transpose(bt), cb);
    y_acc = ct::mma(ct_, ct::transpose(ht), y_acc);
  }

  const FQ g = vector_view<Q>(ws_g + tok, lpad).load(c);
  const FQ dt = vector_view<Q>(ws_dt + tok, lpad).load(c);
  const IQ seq = vector_view<Q>(ws_seq + b * lpad, lpad).load(c);
  const int32_t seq_prev = c > 0 ? ws_seq[b * lpad + c * Q - 1] : 0;

  // Inter-chunk term: rows still in the sequence the entering state belongs to.
  const FQ row_decay = ct::select(seq == seq_prev, ct::exp2(g), ct::zeros<FQ>());
  y_acc = y_acc * as_column<Q>(row_decay);

  // Intra-chunk weights: causal (j <= i) and within one sequence, masked before the exp2.
  const IQ idx = ct::iota<IQ>();
  const auto keep = (as_row<Q>(idx) <= as_column<Q>(idx)) && (as_row<Q>(seq) == as_column<Q>(seq));  // [Q, Q]
  const QxQ gap = ct::select(keep, as_column<Q>(g) - as_row<Q>(g), ct::zeros<QxQ>());
  const QxQ weights = ct::select(keep, cb * ct::exp2(gap) * as_row<Q>(dt), ct::zeros<QxQ>());

  const auto xv = matrix_view<Q, P>(x + b * x_s0 + h * x_s2, seqlen, P, x_s1);
  const auto xt = xv.load_masked(c, 0);  // [Q, P]
  y_acc = ct::mma(mma_operand<T>(weights), mma_operand<T>(xt), y_acc);

  // Skip connection and gate.
  const QxP xf = ct::element_cast<float>(xt);
  if (D_layout == 1) {
    y_acc = y_acc + xf * D[h];
  } else if (D_layout == 2) {
    const FP d = ct::load(D + h * P + ct::iota<IP>());
    y_acc = y_acc + xf * as_row<P>(d);
  }
  if (z != nullptr) {
    const QxP zf = ct::element_cast<float>(matrix_view<Q, P>(z + b * z_s0 + h * z_s2, seqlen, P, z_s1).load_masked(c, 0));
    y_acc = y_acc * (zf / (1.0f + ct::exp(-zf)));
  }
  matrix_view<Q, P>(y + b * y_s0 + h * y_s2, seqlen, P, y_s1).store_masked(ct::element_cast<T>(y_acc), c, 0);
}

}  // namespace mamba2ssd::cuda_tile
