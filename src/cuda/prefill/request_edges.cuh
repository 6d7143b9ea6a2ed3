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

// A request as the walks' edges use it: its tokens and its slot (a cache index, -1 for a pad). Its
// loads are independent of each other: read together, one memory latency.
struct RequestSpan {
  int32_t req;
  TokenRange tokens;
  int64_t slot;
};
__device__ __forceinline__ RequestSpan request_span(const FwdArgs& a, int32_t req) {
  return {req, packed_tokens(a.seqs, a.geo.seqlen, req), a.prefill.index(a.prefill.slots[req])};
}

// A request of a walk over whole requests (FwdPlan::request_segments: a segment is a group of
// consecutive requests, request_groups): its span and its padded steps [first, last) of kTokens
// tokens (kSteps a chunk), which end at its last token's step (the empty second half of a short last
// chunk is not walked) and within its chunks of the map (request_chunks: hostile lengths cannot walk
// past them). The walk goes request after request, each from its first step. (Steps are 32-bit:
// the plan takes this form below 2^30 chunks; registers are the walks' scarcest resource.)
template <int kTokens, int kSteps>
struct WalkedRequest {
  RequestSpan span;
  int32_t first, last;

  // The first request from req on, before end, that has a step; past the last, first = last = `done`.
  static __device__ WalkedRequest from(const FwdArgs& a, int32_t req, int32_t end, int32_t done) {
    for (; req < end; ++req) {
      const int64_t* chunks = a.prefill.request_chunks + req;
      const RequestSpan span = request_span(a, req);
      const int64_t first = kSteps * chunks[0], steps = (span.tokens.end - span.tokens.start + kTokens - 1) / kTokens;
      const int64_t last = first + steps < kSteps * chunks[1] ? first + steps : kSteps * chunks[1];
      if (last > first) return {span, static_cast<int32_t>(first), static_cast<int32_t>(last)};
    }
    return {{end, {0, 0}, -1}, done, done};
  }
  // Padded step s of this request: prefill_step's answer, from the span instead of the chunk map.
  __device__ PrefillStep step(int64_t s, int64_t seqlen) const {
    const int64_t t0 = span.tokens.start + (s - first) * kTokens, left = span.tokens.end - t0;
    const int rows = left <= 0 ? 0 : left < kTokens ? static_cast<int>(left) : kTokens;
    return {rows > 0 ? t0 : seqlen, rows, span.req};
  }
};

// The state entering request span's first chunk, for head h: its slot's state, or zero (a new
// request, a pad). for_each_pair(f) calls f(v0, v1, p, n) for the walk's state elements (p, n) and
// (p, n + 1), n even, inside the head dim and the state size (a multiple of 16; p and n the
// head's): a pair is one load where the cache allows it (always, kPaired: PrefillCache::with_head).
template <bool kPaired = false, typename ForEachPair>
__device__ __forceinline__ void enter_request(const FwdArgs& a, const RequestSpan& span, int64_t h,
                                              ForEachPair&& for_each_pair) {
  const bool read = span.slot >= 0 && a.prefill.reads(span.req);
  a.prefill.with_head<kPaired>(read ? span.slot : 0, h, [&](auto head) {
    for_each_pair([&](float& v0, float& v1, int p, int n) {
      if (read) head.load(p, n, v0, v1);
      else v0 = v1 = 0.0f;
    });
  });
}

// After the walk's tokens of request span up to packed token `end` (exclusive): its final state into
// its slot at the request's end, its intermediate state at a boundary of every k tokens (both, to
// two slots, when the request's length is a multiple of k). A pad stores nothing. for_each_pair(f)
// calls f(v0, v1, p, n) for the state elements (p, n) and (p, n + 1), n even, inside the head dim
// and the state size (a multiple of 16), so that a pair is one store where the cache allows it
// (one store per element made the walks wait to issue them: docs/perf-log.md, "Prefill p6").
// defer_final: the walk did not enter this request itself (it started in an earlier segment, whose
// block reads its slot, perhaps later than this one ends it): the final state goes to defer(value,
// p, n) instead, and deferred_states_kernel stores it after the walk; a boundary naming the
// request's own slot is left to that store too.
struct NoDeferral {
  __device__ void operator()(float, int, int) const {}
};
template <bool kPaired = false, typename ForEachPair, typename Defer = NoDeferral>
__device__ __forceinline__ void store_request_states(const FwdArgs& a, const RequestSpan& span, int64_t end, int64_t h,
                                                     ForEachPair&& for_each_pair, bool defer_final = false,
                                                     Defer defer = {}) {
  const PrefillCache& cache = a.prefill;
  if (span.slot < 0) return;
  auto store = [&](int64_t to) {
    cache.template with_head<kPaired>(to, h, [&](auto head) {
      for_each_pair([&](float& v0, float& v1, int p, int n) { head.store(p, n, v0, v1); });
    });
  };
  if (end == span.tokens.end) {
    if (defer_final) {
      for_each_pair([&](float& v0, float& v1, int p, int n) {
        defer(v0, p, n);
        defer(v1, p, n + 1);
      });
    } else {
      store(span.slot);
    }
  }
  const int64_t done = end - span.tokens.start, m = cache.every > 0 && done % cache.every == 0 ? done / cache.every : 0;
  if (m > 0 && m <= cache.max_intermediate) {
    const int64_t to = cache.index(cache.intermediate_slots[span.req * cache.max_intermediate + m - 1]);
    if (to >= 0 && !(defer_final && to == span.slot)) store(to);
  }
}

// chunk_states_walk's edges for the prefill (NoChunkEdges' interface): chunk by chunk. The walk
// visits its state as (fragment, element, p, n); the request edges take pairs (v0, v1, p, n).
struct PrefillEdges {
  __device__ int64_t chunks(const FwdArgs& a) const { return *a.scan.padded_count; }

  template <typename ForEachElement>
  __device__ void enter(const FwdArgs& a, int64_t c, int64_t h, ForEachElement&& for_each_element) const {
    const PaddedChunk pc = a.scan.padded[c];
    if (starts_request(a, pc)) enter_request(a, request_span(a, pc.req), h, pairs(for_each_element));
  }

  template <typename ForEachElement>
  __device__ void exit(const FwdArgs& a, int64_t c, int64_t h, ForEachElement&& for_each_element) const {
    const PaddedChunk pc = a.scan.padded[c];
    store_request_states(a, request_span(a, pc.req), pc.start + pc.rows, h, pairs(for_each_element));
  }

 private:
  // A fragment's elements e and e + 1 (e even) are columns n and n + 1 of one row.
  template <typename ForEachElement>
  static __device__ auto pairs(ForEachElement& for_each_element) {
    return [&](auto&& f) {
      for_each_element([&](tile::FragC& frag, int e, int p, int n) {
        if (e % 2 == 0) f(frag.v[e], frag.v[e + 1], p, n);
      });
    };
  }
};

// The hopper walk's deferred final states (store_request_states' defer_final), after the walk: per
// (segment k, head), the request running into k's first chunk from an earlier segment, if it ends
// inside k, had its final state left in segment k's entry of seg.ends ([P][kN], free once the walk
// has started), which goes to its slot here. Decided from the chunk map alone, as the walk did.
constexpr int kDeferredStatesThreads = 256;
template <int kN>
__global__ void __launch_bounds__(kDeferredStatesThreads) deferred_states_kernel(FwdArgs a) {
  constexpr int64_t kChunk = 128;  // the hopper path's chunk (Sm90Step::kChunk)
  const int64_t k = blockIdx.x, h = blockIdx.y, c0 = k * a.seg.chunks;
  if (c0 >= *a.scan.padded_count) return;
  const PaddedChunk pc = a.scan.padded[c0];
  if (pc.req < 0 || starts_request(a, pc)) return;
  const RequestSpan span = request_span(a, pc.req);
  const int64_t c_last = c0 + (span.tokens.end - pc.start + kChunk - 1) / kChunk - 1;
  if (c_last >= c0 + a.seg.chunks || span.slot < 0) return;  // it ends in a later segment, or is a pad
  const float* state = seg_state<kN>(a.seg.ends, a, 0, k, h);
  const int P = static_cast<int>(a.geo.headdim), N = static_cast<int>(a.geo.dstate);
  a.prefill.with_head<true>(span.slot, h, [&](auto head) {  // (the hopper path's caches allow pairs)
    for (int i = static_cast<int>(threadIdx.x); i < P * N; i += kDeferredStatesThreads)
      head.store(i / N, i % N, state[i / N * kN + i % N]);
  });
}

}  // namespace mamba2ssd::cuda
