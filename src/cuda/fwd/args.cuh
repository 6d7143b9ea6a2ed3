// The forward's kernel arguments, layered on ScanArgs (common/scan_args.cuh): the tensors of the
// call, the workspace of the path, and, for the sm_90 kernels, the TMA maps. Built once per call on
// the host (make_fwd_args) and passed by value.
#pragma once

#include <cuda.h>  // CUtensorMap

#include <cstdint>

#include "common/segment_entry.h"
#include "cuda/common/scan_args.cuh"
#include "cuda/fwd/plan.h"
#include "cuda/tile/copy.cuh"

namespace mamba2ssd::cuda {

// The forward's tensors besides dt (device pointers, element strides as in ForwardParams).
struct FwdTensors {
  const void* x;  Strides4 x_stride;  // [b, L, H, P]
  const void* B;  Strides4 B_stride;  // [b, L, G, N]
  const void* C;  Strides4 C_stride;  // [b, L, G, N]
  DLayout D_layout;
  const float* D;                     // [H] or [H, P]
  const void* z;  Strides4 z_stride;  // [b, L, H, P] or null
  const float* initial_states;  Strides4 initial_states_stride;  // [b, H, P, N] or null
  void* y;  Strides4 y_stride;                                     // [b, L, H, P]
  float* final_states;  Strides4 final_states_stride;              // [b, H, P, N] or null
  float* varlen_states;  Strides4 varlen_states_stride;            // [S, H, P, N] or null
  // 16-byte alignment of each staged tensor (base pointer and every stride), for the kernels that
  // stage with cp.async (the sm_90 kernels' TMA needs it of x, B, C and y: see hopper_path.cu).
  bool x_aligned, B_aligned, C_aligned;
  // y and z allow two adjacent elements in one access (aligned base and even strides).
  bool y_pairs, z_pairs;
};

// The fused walks' segments: each walks seg_chunks chunks; the first pass leaves each segment's
// end state (from zero) and decay, segment_entries the state entering each. States are [P][kN]
// (fused_state_cols columns, zeros past dstate).
struct Segments {
  int64_t count, chunks;
  int64_t ptiles;  // blocks per (segment, head, batch row), each with kWalkPCols head-dim columns
  float* ends;     // [b, count, H, P, kN] end state of each segment but the last, from zero
  float* entries;  // [b, count, H, P, kN] state entering each segment
  float* decay;    // [b, count, H] decay across each segment but the last (zero if a sequence starts in it)
};

// The packed prefill's cache and slots (PrefillParams; src/cuda/prefill): the walks enter each
// request from its slot and store its states there (request_edges.cuh). state null elsewhere.
struct PrefillCache {
  void* state;
  Strides4 stride;  // [nslots, H, P, N]
  DType dtype;      // fp32, bf16 or fp16
  bool pairs;       // two adjacent elements of a row in one access (pair_aligned)
  int64_t nslots;
  const int32_t* slots;              // [S]
  const uint8_t* has_initial_state;  // [S] or null (every request reads its slot)
  int32_t pad_slot_id;
  int64_t every;                      // k: an intermediate state every k tokens, or 0
  const int32_t* intermediate_slots;  // [S, max_intermediate]
  int64_t max_intermediate;
  // Walk segments of whole requests (FwdPlan::request_segments), from padded_chunks_kernel: the
  // first padded chunk of each request, then the count of chunks that hold requests ([S + 1]); the
  // first request of each segment, then S ([segments + 1]). Else null.
  const int64_t* request_chunks;
  const int32_t* request_groups;

  // A slot entry as a cache index, or -1 (read and store nothing): pad_slot_id, or an entry outside
  // the cache, which the GPU cannot report without a sync (mamba2ssd.h, "Slots").
  __device__ int64_t index(int32_t v) const { return v == pad_slot_id || v < 0 || v >= nslots ? -1 : v; }
  __device__ bool reads(int64_t s) const { return !has_initial_state || has_initial_state[s]; }
  // Calls f(head) with head h's state in the slot: head.load(p, n, v0, v1) reads elements (p, n)
  // and (p, n + 1) as floats, head.store(p, n, v0, v1) writes them, head.store(p, n, v) writes one;
  // the dtype, whether a pair is one access (pairs), and the (slot, head) offset are chosen once
  // around all of f's accesses. Per element, the dtype choice put each conversion right behind its
  // load (a block entering a request waited one memory latency per state element), and the choices
  // and four-stride offsets made the walks long enough to stall on instruction fetch
  // (docs/perf-log.md, "Prefill p5"); the pair choice per pair doubled the walk's branches ("Prefill
  // p7"). kPaired: the caller runs only caches that allow pairs (the hopper path: one form of f).
  template <bool kPaired = false, typename F>
  __device__ void with_head(int64_t slot, int64_t h, F&& f) const {
    const int64_t at = slot * stride.s0 + h * stride.s1;
    switch (dtype) {
      case DType::kBF16: return with_pairs<kPaired>(static_cast<__nv_bfloat16*>(state) + at, f);
      case DType::kF16: return with_pairs<kPaired>(static_cast<__half*>(state) + at, f);
      default: return with_pairs<kPaired>(static_cast<float*>(state) + at, f);
    }
  }

 private:
  template <typename T, bool kPairs>
  struct Head {
    T* base;
    int64_t row;
    __device__ T* at(int p, int n) const { return base + p * row + n; }
    __device__ void load(int p, int n, float& v0, float& v1) const {
      float v[2];
      tile::load_pair(at(p, n), kPairs, v);
      v0 = v[0], v1 = v[1];
    }
    __device__ void store(int p, int n, float v0, float v1) const { tile::store_pair(at(p, n), kPairs, {v0, v1}); }
    __device__ void store(int p, int n, float v) const { *at(p, n) = tile::from_float<T>(v); }
  };
  template <bool kPaired, typename T, typename F>
  __device__ void with_pairs(T* base, F& f) const {
    if constexpr (kPaired) f(Head<T, true>{base, stride.s2});
    else if (pairs) f(Head<T, true>{base, stride.s2});
    else f(Head<T, false>{base, stride.s2});
  }
};

struct FwdArgs : ScanArgs {
  FwdTensors io;
  float* chunk_states;  // three-kernel path: [b, nchunks, H, P, N] state entering each chunk
  Segments seg;
  PrefillCache prefill;
  void* saved_states;  // [b, ceil(L / 64), H, P, N] of T: the state entering each 64-token step, or null
};

// The sm_90 kernels' arguments: TMA maps of x, B, C and y for boxes of one column block (64
// columns) x tile::tma::kBoxRows tokens, and (where the walk saves them) of saved_states seen as
// [b x steps, P, H, N], so that a step's and head's 64 x N state is one row tile of boxes. Kernels
// take them as __grid_constant__, so the maps stay in parameter space.
struct Sm90FwdArgs : FwdArgs {
  CUtensorMap x_map, B_map, C_map, y_map;
  CUtensorMap saved_map;
};

// Offset of the state entering chunk c of (b, h) in chunk_states.
__device__ __forceinline__ int64_t chunk_state_index(const FwdArgs& a, int64_t b, int64_t c, int64_t h) {
  return ((b * a.scan.nchunks + c) * a.geo.nheads + h) * a.geo.headdim * a.geo.dstate;
}

// Segment s's state in a [b, nsegs, H, P, kN] array (Segments::ends, Segments::entries).
template <int kN>
__device__ __forceinline__ float* seg_state(float* base, const FwdArgs& a, int64_t b, int64_t s, int64_t h) {
  return base + ((b * a.seg.count + s) * a.geo.nheads + h) * a.geo.headdim * kN;
}

// A fused walk's block: its segment, and the first of its kWalkPCols head-dim columns (p_base). The
// blocks of one segment's column tiles are neighbours in the grid's x, so that their reads of the
// same B and C rows meet in L2.
struct WalkBlock {
  int64_t seg;
  int p_base;
};
__device__ __forceinline__ WalkBlock walk_block(const FwdArgs& a, unsigned x) {
  const unsigned tiles = static_cast<unsigned>(a.seg.ptiles);  // (a 32-bit division: the grid's x is)
  return {static_cast<int64_t>(x / tiles), static_cast<int>(x % tiles) * kWalkPCols};
}

// The decay across segment s (what the first pass leaves segment_entries besides the end state), or
// kSegmentCut where a sequence starts in it (common/segment_entry.h says why a marker).
__device__ __forceinline__ float& seg_decay(const FwdArgs& a, int64_t b, int64_t s, int64_t h) {
  return a.seg.decay[(b * a.seg.count + s) * a.geo.nheads + h];
}

// Whether a tensor of `dtype` (last dimension contiguous) allows two adjacent elements of a row in
// one access: an aligned base and even strides.
inline bool pair_aligned(const void* ptr, const Strides4& s, DType dtype) {
  const auto e = static_cast<uintptr_t>(dtype_size(dtype));
  return reinterpret_cast<uintptr_t>(ptr) % (2 * e) == 0 && s.s0 % 2 == 0 && s.s1 % 2 == 0 && s.s2 % 2 == 0;
}

// The arguments of one call on a plan, its workspace carved.
inline FwdArgs make_fwd_args(const ForwardParams& p, const FwdPlan& plan, void* workspace) {
  auto aligned4 = [&](const void* ptr, const Strides4& s) {
    const int64_t e = static_cast<int64_t>(dtype_size(p.dtype));
    return tile::aligned16(ptr, s.s0, e) && tile::aligned16(ptr, s.s1, e) && tile::aligned16(ptr, s.s2, e);
  };
  const FwdWorkspace ws = carve(plan, workspace);
  FwdArgs a{};
  a.geo = {p.batch, p.seqlen, p.nheads, p.headdim, p.ngroups, p.dstate};
  a.dt_in = {p.dt, p.dt_stride, p.dt_dtype, p.A, p.dt_bias, p.dt_softplus, p.dt_min, p.dt_max};
  a.seqs = {p.seq_idx, p.seq_idx_stride, p.cu_seqlens, p.nseqs};
  a.scan = {ws.dt, ws.g, ws.seq, plan.nchunks, plan.lpad, p.seq_idx || p.cu_seqlens, ws.carry, nullptr, nullptr};
  a.io = {p.x, p.x_stride, p.B, p.B_stride, p.C, p.C_stride, p.D_layout, p.D, p.z, p.z_stride,
          p.initial_states, p.initial_states_stride, p.y, p.y_stride, p.final_states, p.final_states_stride,
          p.varlen_states, p.varlen_states_stride,
          aligned4(p.x, p.x_stride), aligned4(p.B, p.B_stride), aligned4(p.C, p.C_stride),
          pair_aligned(p.y, p.y_stride, p.dtype), p.z && pair_aligned(p.z, p.z_stride, p.dtype)};
  a.chunk_states = ws.chunk_states;
  a.seg = {plan.nsegs, plan.seg_chunks, plan.ptiles, ws.seg_ends, ws.seg_entries, ws.seg_decay};
  a.saved_states = p.saved_states;
  return a;
}

}  // namespace mamba2ssd::cuda
