// chunk_cumsum, the first kernel of every path: per token and head, dt after preprocessing and the
// within-chunk inclusive cumulative sum g of A * dt (times log2(e), so later kernels use exp2). With
// packed sequences it also writes each token's sequence id (and, for varlen states on the fused
// walks, each chunk's carried sequence). One block per (chunk, kCumsumHeads heads, batch row): dt is
// [batch, token, head], so the block reads the chunk's rows of its heads (adjacent heads: coalesced
// loads, all issued before any is used), turns them into per-head runs through shared memory, and
// each warp scans one head's chunk and stores it in 16-byte pieces ([batch, head, token]).
#pragma once

#include "common/dt.h"
#include "cuda/common/grid_dependency.cuh"
#include "cuda/common/launch.h"
#include "cuda/common/math.cuh"
#include "cuda/common/scan_args.cuh"
#include "cuda/tile/mma.cuh"

namespace mamba2ssd::cuda {

constexpr int kCumsumHeads = 8;  // heads of a chunk_cumsum block, one warp each
constexpr int kCumsumThreads = kCumsumHeads * 32;

// The packed sequence holding token t: the index s in [0, S-1] with cu_seqlens[s] <= t <
// cu_seqlens[s + 1]. Safe whatever the contents (the launch path never reads them on the host): the
// search reads cu_seqlens[1 .. S-1] only, since its bounds, not the values read, move each probe
// (any contents end it in at most log2(S) + 1 steps, with an index in [0, S-1]).
__device__ __forceinline__ int64_t packed_sequence(const SeqInputs& s, int64_t t) {
  int64_t lo = 0, hi = s.nseqs - 1;  // largest s in [0, S-1] with cu_seqlens[s] <= t
  while (lo < hi) {
    const int64_t mid = (lo + hi + 1) / 2;
    if (s.cu_seqlens[mid] <= t) lo = mid;
    else hi = mid - 1;
  }
  return lo;
}

// Sequence id of token t: seq_idx, or the packed sequence holding it. An id is only ever compared
// with another id, never used as an address: hostile contents can change where the state resets,
// nothing else (docs/reliability.md, "Device contents").
__device__ __forceinline__ int32_t sequence_id(const SeqInputs& s, int64_t b, int64_t t) {
  if (s.seq_idx) return s.seq_idx[b * s.seq_idx_stride.s0 + t * s.seq_idx_stride.s1];
  return static_cast<int32_t>(packed_sequence(s, t));
}

// The id chunk_cumsum stores for token t (ChunkScan::seq), which every later kernel compares for
// equality, with 0 standing for the id before token 0. The contract resets the state at token 0
// whenever the first id is not 0, so a row whose first id f is not 0 has its ids moved to
// id - f + 1 (wrapping): equal ids stay equal, and non-decreasing ids then never equal the 0 before
// token 0 (a row of -1s then 0s would otherwise hand the initial state to its 0s).
__device__ __forceinline__ int32_t stored_sequence_id(const SeqInputs& s, int64_t b, int64_t t) {
  const int32_t id = sequence_id(s, b, t);
  if (!s.seq_idx) return id;  // packed indices: the first is 0
  const int32_t first = s.seq_idx[b * s.seq_idx_stride.s0];
  return first == 0 ? id : static_cast<int32_t>(static_cast<uint32_t>(id) - static_cast<uint32_t>(first) + 1u);
}

// Packed sequence s's tokens [start, end), clamped to 0 <= start <= end <= L: the offsets that
// become token indices (varlen states), safe for any contents of cu_seqlens (decreasing, negative,
// past the end, 2^62); an empty or inverted sequence is empty (docs/reliability.md).
struct TokenRange {
  int64_t start, end;
};
__device__ __forceinline__ TokenRange packed_tokens(const SeqInputs& s, int64_t seqlen, int64_t i) {
  const int64_t start = max(int64_t{0}, min(s.cu_seqlens[i], seqlen));
  return {start, max(start, min(s.cu_seqlens[i + 1], seqlen))};
}

// Varlen states on the fused walks (ChunkScan::carry): the packed sequence whose last token e lies
// in chunk c and whose final state therefore starts from the state entering c (the ids of e and of
// the token before the chunk agree; before the first chunk the id is 0, as in the walks), or -1.
// Valid input has at most one: the sequence running into the chunk. The walk stores its entering
// state into that sequence's varlen_states entry and varlen_states_sm80 finishes the entry; both
// go by this one answer, so the kernel reads only entries the walk wrote, whatever cu_seqlens holds.
template <int kChunk>
__device__ int32_t carried_sequence(const ScanArgs& a, int64_t c) {
  const int64_t t0 = c * kChunk;
  const int64_t s = packed_sequence(a.seqs, t0 > 0 ? t0 - 1 : 0);
  const TokenRange r = packed_tokens(a.seqs, a.geo.seqlen, s);
  const int64_t e = r.end - 1;
  if (r.end == r.start || e < t0 || e >= t0 + kChunk) return -1;
  const int32_t id_before = t0 > 0 ? stored_sequence_id(a.seqs, 0, t0 - 1) : 0;
  return stored_sequence_id(a.seqs, 0, e) == id_before ? static_cast<int32_t>(s) : -1;
}

template <int kChunk, typename DtT>
__global__ void __launch_bounds__(kCumsumThreads) chunk_cumsum_kernel(ScanArgs a) {
  constexpr int kPerLane = kChunk / 32, kLd = kChunk + 4;  // kLd: the transposing writes hit 32 banks
  constexpr int kLoads = kChunk * kCumsumHeads / kCumsumThreads;
  __shared__ __align__(16) float s_dt[kCumsumHeads * kLd];  // [head][token]
  start_next_kernel();  // the Hopper path's next kernel sets up while this one runs, then waits
  const Geometry& geo = a.geo;
  const DtInputs& in = a.dt_in;
  const int64_t c = blockIdx.x, h0 = static_cast<int64_t>(blockIdx.y) * kCumsumHeads, b = blockIdx.z;
  const int64_t t0 = c * kChunk;

  if (a.scan.resets && blockIdx.y == 0)
    for (int i = threadIdx.x; i < kChunk; i += kCumsumThreads)
      a.scan.seq[b * a.scan.lpad + t0 + i] = stored_sequence_id(a.seqs, b, t0 + i < geo.seqlen ? t0 + i : geo.seqlen - 1);
  if (a.scan.carry && blockIdx.y == 0 && b == 0 && threadIdx.x == 0) a.scan.carry[c] = carried_sequence<kChunk>(a, c);

  // Element i of the block's [token][head] rows: head i % kCumsumHeads of token i / kCumsumHeads.
  // A thread keeps one head (kCumsumThreads is a multiple of kCumsumHeads) and takes every
  // (kCumsumThreads / kCumsumHeads)-th token.
  static_assert(kCumsumThreads % kCumsumHeads == 0, "a thread's elements share a head");
  const int hh = threadIdx.x % kCumsumHeads, tt = threadIdx.x / kCumsumHeads;
  constexpr int kTokenStride = kCumsumThreads / kCumsumHeads;
  const bool head_in = h0 + hh < geo.nheads;
  const DtT* dt = static_cast<const DtT*>(in.dt) + b * in.dt_stride.s0 + (h0 + hh) * in.dt_stride.s2;
  // The chunk's tokens in the caller's rows (the packed prefill's padded chunks start elsewhere).
  const ChunkTokens tokens = chunk_tokens<kChunk>(a, c);
  float raw[kLoads];
#pragma unroll
  for (int k = 0; k < kLoads; ++k) {
    const int j = tt + k * kTokenStride;
    raw[k] = 0.0f;
    if (head_in && j < tokens.rows) raw[k] = tile::to_float(dt[(tokens.t0 + j) * in.dt_stride.s1]);
  }
  const float bias = head_in && in.dt_bias ? in.dt_bias[h0 + hh] : 0.0f;
#pragma unroll
  for (int k = 0; k < kLoads; ++k) {
    const int j = tt + k * kTokenStride;
    s_dt[hh * kLd + j] = head_in && j < tokens.rows
                             ? preprocess_dt(raw[k], bias, in.dt_softplus, in.dt_min, in.dt_max)
                             : 0.0f;  // padding: no effect
  }
  __syncthreads();

  const int64_t h = h0 + tile::warp_id();
  if (h >= geo.nheads) return;
  const int lane = tile::lane_id();
  const float* d = s_dt + tile::warp_id() * kLd + kPerLane * lane;
  const float a_log2 = in.A[h] * kLog2e;
  float g[kPerLane];
#pragma unroll
  for (int e = 0; e < kPerLane; ++e) g[e] = (e ? g[e - 1] : 0.0f) + a_log2 * d[e];
  float incl = g[kPerLane - 1];  // the lanes' totals, scanned
#pragma unroll
  for (int o = 1; o < 32; o *= 2) {
    const float u = __shfl_up_sync(0xffffffffu, incl, o);
    if (lane >= o) incl += u;
  }
  const float before = incl - g[kPerLane - 1];
  float* out_dt = a.scan.dt + token_index(a, b, h, t0 + kPerLane * lane);
  float* out_g = a.scan.g + token_index(a, b, h, t0 + kPerLane * lane);
  static_assert(kPerLane == 2 || kPerLane == 4, "chunks of 64 or 128 tokens");
  if constexpr (kPerLane == 4) {
    *reinterpret_cast<float4*>(out_dt) = {d[0], d[1], d[2], d[3]};
    *reinterpret_cast<float4*>(out_g) = {before + g[0], before + g[1], before + g[2], before + g[3]};
  } else {
    *reinterpret_cast<float2*>(out_dt) = {d[0], d[1]};
    *reinterpret_cast<float2*>(out_g) = {before + g[0], before + g[1]};
  }
}

}  // namespace mamba2ssd::cuda

namespace mamba2ssd::cuda {

// chunk_cumsum for chunks of kChunk tokens, as the first kernel of a path (never behind another).
template <int kChunk>
void launch_chunk_cumsum(const ScanArgs& a, cudaStream_t stream) {
  const dim3 grid(static_cast<unsigned>(a.scan.nchunks),
                  static_cast<unsigned>((a.geo.nheads + kCumsumHeads - 1) / kCumsumHeads),
                  static_cast<unsigned>(a.geo.batch));
  auto go = [&](auto kernel) { launch(kernel, "chunk_cumsum_kernel", grid, kCumsumThreads, 0, stream, a); };
  switch (a.dt_in.dt_dtype) {
    case DType::kF16: return go(chunk_cumsum_kernel<kChunk, __half>);
    case DType::kBF16: return go(chunk_cumsum_kernel<kChunk, __nv_bfloat16>);
    case DType::kF32: return go(chunk_cumsum_kernel<kChunk, float>);
    case DType::kF64: break;  // refused before any launch (refuse_f64, validate)
  }
}

}  // namespace mamba2ssd::cuda
