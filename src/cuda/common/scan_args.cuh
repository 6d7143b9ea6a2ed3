// The bottom layer of every kernel's arguments: the sizes of the call, the dt inputs, the sequence
// boundaries, and the chunked time axis that chunk_cumsum fills and every later kernel reads (the
// forward's and, later, the backward's and the decode step's). A direction's arguments derive from
// ScanArgs (fwd/args.cuh), so the helpers here serve all of them.
#pragma once

#include <cstdint>

#include "mamba2ssd/mamba2ssd.h"

namespace mamba2ssd::cuda {

// Sizes: b batch, L tokens, H heads, P head dim, G groups, N state size.
struct Geometry {
  int64_t batch, seqlen, nheads, headdim, ngroups, dstate;
  // The group of B and C that head h reads.
  __host__ __device__ int64_t group_of(int64_t h) const { return h / (nheads / ngroups); }
};

// dt as the caller gives it, and what turns it into the step size d and the decay A d.
struct DtInputs {
  const void* dt;  // [b, L, H] of dt_dtype
  Strides3 dt_stride;
  DType dt_dtype;
  const float* A;        // [H]
  const float* dt_bias;  // [H] or null
  bool dt_softplus;
  float dt_min, dt_max;
};

// Packed sequences: seq_idx, or cu_seqlens alone (both null: one sequence per batch row).
struct SeqInputs {
  const int32_t* seq_idx;  // [b, L]
  Strides2 seq_idx_stride;
  const int64_t* cu_seqlens;  // [S + 1]
  int64_t nseqs;              // S
};

// The packed prefill's padded layout (src/cuda/prefill): chunk c of the kernels' chunks holds
// tokens [start, start + rows) of request `req` alone (rows <= the chunk; the rest of the chunk is
// padding: dt = 0 and x = B = C = 0, so it changes no state). Each request starts a chunk of its own,
// so the state at the end of a chunk is one request's. Chunks past the last request's: req -1, rows 0.
struct PaddedChunk {
  int64_t start;
  int32_t rows, req;
};

// chunk_cumsum's results, in [batch, head, token] order so that a chunk's values are one
// contiguous run; tokens padded to whole chunks (padding has dt = 0: no effect).
struct ChunkScan {
  float* dt;     // [b, H, lpad] dt after bias, softplus and clamp
  float* g;      // [b, H, lpad] within-chunk inclusive cumsum of A * dt, times log2(e)
  int32_t* seq;  // [b, lpad] sequence id per token (padding: the last token's); null without resets
  int64_t nchunks, lpad;  // chunks of the kernels' chunk length; nchunks * chunk
  bool resets;            // seq_idx or cu_seqlens given
  // Varlen states on the fused walks: per chunk, the packed sequence whose final state starts from
  // the state entering the chunk, or -1 (carried_sequence); null elsewhere.
  int32_t* carry;  // [nchunks]
  // The packed prefill: where each chunk's tokens are (PaddedChunk); null elsewhere (chunk c holds
  // tokens c * chunk ..). The sections above are then in padded coordinates (c * chunk + j).
  const PaddedChunk* padded;    // [nchunks]
  const int64_t* padded_count;  // the chunks that hold requests (the rest follow them, empty)
};

struct ScanArgs {
  Geometry geo;
  DtInputs dt_in;
  SeqInputs seqs;
  ChunkScan scan;
};

// The tokens of chunk c in the caller's rows: [t0, t0 + rows).
struct ChunkTokens {
  int64_t t0;
  int rows;
};
template <int kChunk>
__device__ __forceinline__ ChunkTokens chunk_tokens(const ScanArgs& a, int64_t c) {
  if (a.scan.padded) {
    const PaddedChunk pc = a.scan.padded[c];
    return {pc.start, pc.rows};
  }
  const int64_t t0 = c * kChunk;
  return {t0, static_cast<int>(a.geo.seqlen - t0 < kChunk ? a.geo.seqlen - t0 : kChunk)};
}

// Offset of (b, h, t) in ChunkScan's dt and g.
__device__ __forceinline__ int64_t token_index(const ScanArgs& a, int64_t b, int64_t h, int64_t t) {
  return (b * a.geo.nheads + h) * a.scan.lpad + t;
}

// Sequence id of token t of batch row b, as chunk_cumsum stored it.
__device__ __forceinline__ int32_t seq_of(const ScanArgs& a, int64_t b, int64_t t) {
  return a.scan.seq[b * a.scan.lpad + t];
}

}  // namespace mamba2ssd::cuda
