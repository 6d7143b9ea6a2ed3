// The packed prefill's device side inside the forward's walks (docs/serving.md, "CUDA packed
// prefill"): the padded layout's steps, and the requests' states at the walks' edges (the chunk walk
// of chunk_states_sm80 and the Hopper walks). The requests run chunk-aligned: request s takes
// ceil(len_s / chunk) chunks of its own (PaddedChunk), its last one padded with tokens that change
// no state, so the state at the end of each chunk is one request's, and a walk needs only to
//   enter a request's first chunk from its slot's state (or zero: a new request, a pad), and
//   store the state after a request's last chunk into its slot, and after every k-th token (the
//   intermediate states, k a multiple of the chunk) into that boundary's intermediate slot.
// Slot entries are never read on the host: one outside [0, nslots) counts as pad_slot_id.
#pragma once

#include "cuda/common/chunk_cumsum.cuh"
#include "cuda/fwd/args.cuh"
#include "cuda/tile/mma.cuh"

namespace mamba2ssd::cuda {

// Step s of kTokens tokens of the padded layout (kSteps steps a chunk; the Hopper walks): its tokens
// in the caller's rows [t0, t0 + rows) of request req. A step past its request's tokens (the second
// half of a short last chunk, or a chunk past the last request) has rows 0 and t0 = L, a tile wholly
// past the tensors, which TMA fills with zeros.
struct PrefillStep {
  int64_t t0;
  int rows;
  int32_t req;
};
template <int kTokens, int kSteps>
__device__ __forceinline__ PrefillStep prefill_step(const ScanArgs& a, int64_t s) {
  const PaddedChunk pc = a.scan.padded[s / kSteps];
  const int offset = static_cast<int>(s % kSteps) * kTokens;
  const int rows = pc.rows - offset < 0 ? 0 : pc.rows - offset < kTokens ? pc.rows - offset : kTokens;
  return {rows > 0 ? pc.start + offset : a.geo.seqlen, rows, pc.req};
}

// Whether padded chunk pc is its request's first (then the walks enter it from the request's slot).
__device__ __forceinline__ bool starts_request(const FwdArgs& a, const PaddedChunk& pc) {
  return pc.req >= 0 && pc.start == packed_tokens(a.seqs, a.geo.seqlen, pc.req).start;
}

// The state entering request req's first chunk, for head h: its slot's state, or zero (a new
// request, a pad). for_each(f) calls f(value, p, n) for the walk's state elements inside the head
// dim and the state size (p and n the head's).
template <typename ForEach>
__device__ __forceinline__ void enter_request(const FwdArgs& a, int64_t req, int64_t h, ForEach&& for_each) {
  const PrefillCache& cache = a.prefill;
  const int64_t slot = cache.index(cache.slots[req]);
  const bool read = slot >= 0 && cache.reads(req);
  for_each([&](float& v, int p, int n) { v = read ? cache.load(slot, h, p, n) : 0.0f; });
}

// After the walk's tokens of request req up to packed token `end` (exclusive): its final state into
// its slot at the request's end, its intermediate state at a boundary of every k tokens (both, to
// two slots, when the request's length is a multiple of k). A pad stores nothing.
template <typename ForEach>
__device__ __forceinline__ void store_request_states(const FwdArgs& a, int64_t req, int64_t end, int64_t h,
                                                     ForEach&& for_each) {
  const PrefillCache& cache = a.prefill;
  const int64_t slot = cache.index(cache.slots[req]);
  if (slot < 0) return;
  const TokenRange r = packed_tokens(a.seqs, a.geo.seqlen, req);
  auto store = [&](int64_t to) { for_each([&](float& v, int p, int n) { cache.store(to, h, p, n, v); }); };
  if (end == r.end) store(slot);
  const int64_t done = end - r.start, m = cache.every > 0 && done % cache.every == 0 ? done / cache.every : 0;
  if (m > 0 && m <= cache.max_intermediate) {
    const int64_t to = cache.index(cache.intermediate_slots[req * cache.max_intermediate + m - 1]);
    if (to >= 0) store(to);
  }
}

// chunk_states_walk's edges for the prefill (NoChunkEdges' interface): chunk by chunk. The walk
// visits its state as (fragment, element, p, n); the request edges take (value, p, n).
struct PrefillEdges {
  __device__ int64_t chunks(const FwdArgs& a) const { return *a.scan.padded_count; }

  template <typename ForEachElement>
  __device__ void enter(const FwdArgs& a, int64_t c, int64_t h, ForEachElement&& for_each_element) const {
    const PaddedChunk pc = a.scan.padded[c];
    if (starts_request(a, pc)) enter_request(a, pc.req, h, values(for_each_element));
  }

  template <typename ForEachElement>
  __device__ void exit(const FwdArgs& a, int64_t c, int64_t h, ForEachElement&& for_each_element) const {
    const PaddedChunk pc = a.scan.padded[c];
    store_request_states(a, pc.req, pc.start + pc.rows, h, values(for_each_element));
  }

 private:
  template <typename ForEachElement>
  static __device__ auto values(ForEachElement& for_each_element) {
    return [&](auto&& f) { for_each_element([&](tile::FragC& frag, int e, int p, int n) { f(frag.v[e], p, n); }); };
  }
};

}  // namespace mamba2ssd::cuda
