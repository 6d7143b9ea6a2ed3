// The packed prefill's device side beyond the forward's kernels (docs/serving.md, "CUDA packed
// prefill"): the padded layout's chunk map, the requests' states at the chunk walk's edges, and the
// slots of empty requests. The requests run chunk-aligned: request s takes ceil(len_s / chunk)
// chunks of its own (PaddedChunk), its last one padded with tokens that change no state, so the
// state at the end of each chunk is one request's, and the walk of chunk_states_sm80 needs only to
//   enter a request's first chunk from its slot's state (or zero: a new request, a pad), and
//   store the state after a request's last chunk into its slot, and after every k-th token (the
//   intermediate states, k a multiple of the chunk) into that boundary's intermediate slot.
// Slot entries are never read on the host: one outside [0, nslots) counts as pad_slot_id.
#pragma once

#include <cub/block/block_scan.cuh>

#include "cuda/common/chunk_cumsum.cuh"
#include "cuda/fwd/args.cuh"
#include "cuda/tile/mma.cuh"
#include "cuda/tile/types.cuh"

namespace mamba2ssd::cuda {

// The cache and the slot arrays (PrefillParams), on the device.
struct PrefillCache {
  void* state;
  Strides4 stride;  // [nslots, H, P, N]
  DType dtype;      // fp32, bf16 or fp16
  int64_t nslots;
  const int32_t* slots;              // [S]
  const uint8_t* has_initial_state;  // [S] or null (every request reads its slot)
  int32_t pad_slot_id;
  int64_t every;                      // k: an intermediate state every k tokens, or 0
  const int32_t* intermediate_slots;  // [S, max_intermediate]
  int64_t max_intermediate;

  // A slot entry as a cache index, or -1 (read and store nothing): pad_slot_id, or an entry outside
  // the cache, which the GPU cannot report without a sync (mamba2ssd.h, "Slots").
  __device__ int64_t index(int32_t v) const { return v == pad_slot_id || v < 0 || v >= nslots ? -1 : v; }
  __device__ bool reads(int64_t s) const { return !has_initial_state || has_initial_state[s]; }

  __device__ int64_t offset(int64_t slot, int64_t h, int64_t p, int64_t n) const {
    return slot * stride.s0 + h * stride.s1 + p * stride.s2 + n;
  }
  __device__ float load(int64_t slot, int64_t h, int64_t p, int64_t n) const {
    const int64_t i = offset(slot, h, p, n);
    switch (dtype) {
      case DType::kBF16: return tile::to_float(static_cast<const __nv_bfloat16*>(state)[i]);
      case DType::kF16: return tile::to_float(static_cast<const __half*>(state)[i]);
      default: return static_cast<const float*>(state)[i];
    }
  }
  __device__ void store(int64_t slot, int64_t h, int64_t p, int64_t n, float v) const {
    const int64_t i = offset(slot, h, p, n);
    switch (dtype) {
      case DType::kBF16: static_cast<__nv_bfloat16*>(state)[i] = tile::from_float<__nv_bfloat16>(v); break;
      case DType::kF16: static_cast<__half*>(state)[i] = tile::from_float<__half>(v); break;
      default: static_cast<float*>(state)[i] = v; break;
    }
  }
};

// The chunk map: padded[c] for every chunk the workspace holds, and how many hold requests (count).
// One block: the requests' chunk counts, scanned a block of requests at a time; each thread then
// writes its request's entries. A request's tokens come from packed_tokens (clamped to [0, L]), and
// chunks past the map's end are dropped, so hostile cu_seqlens cannot write outside it.
constexpr int kPaddedChunksThreads = 256;
struct PaddedChunksArgs {
  SeqInputs seqs;
  int64_t seqlen, chunk, nchunks;
  PaddedChunk* padded;  // [nchunks]
  int64_t* count;
};
__global__ void __launch_bounds__(kPaddedChunksThreads) padded_chunks_kernel(PaddedChunksArgs a) {
  using Scan = cub::BlockScan<int64_t, kPaddedChunksThreads>;
  __shared__ typename Scan::TempStorage scan;
  int64_t base = 0;  // chunks of the requests before this block of them
  for (int64_t s0 = 0; s0 < a.seqs.nseqs; s0 += kPaddedChunksThreads) {
    const int64_t s = s0 + threadIdx.x;
    const TokenRange r = s < a.seqs.nseqs ? packed_tokens(a.seqs, a.seqlen, s) : TokenRange{0, 0};
    const int64_t len = r.end - r.start, n = (len + a.chunk - 1) / a.chunk;
    int64_t first = 0, total = 0;
    Scan(scan).ExclusiveSum(n, first, total);
    first += base;
    for (int64_t j = 0; j < n && first + j < a.nchunks; ++j) {
      const int64_t rows = len - j * a.chunk < a.chunk ? len - j * a.chunk : a.chunk;
      a.padded[first + j] = {r.start + j * a.chunk, static_cast<int32_t>(rows), static_cast<int32_t>(s)};
    }
    base += total;
    __syncthreads();  // the scan's storage is reused
  }
  const int64_t used = base < a.nchunks ? base : a.nchunks;
  for (int64_t c = used + threadIdx.x; c < a.nchunks; c += kPaddedChunksThreads) a.padded[c] = {0, 0, -1};
  if (threadIdx.x == 0) *a.count = used;
}

// chunk_states_walk's edges for the prefill (NoChunkEdges' interface).
struct PrefillEdges {
  PrefillCache cache;
  const PaddedChunk* padded;
  const int64_t* count;  // padded_chunks_kernel's
  SeqInputs seqs;
  int64_t seqlen;

  __device__ int64_t chunks(int64_t) const { return *count; }

  template <typename ForEach>
  __device__ void enter(int64_t c, int64_t h, ForEach&& for_each) const {
    const PaddedChunk pc = padded[c];
    if (pc.start != packed_tokens(seqs, seqlen, pc.req).start) return;  // not the request's first chunk
    const int64_t slot = cache.index(cache.slots[pc.req]);
    const bool read = slot >= 0 && cache.reads(pc.req);
    for_each([&](tile::FragC& f, int e, int p, int n) { f.v[e] = read ? cache.load(slot, h, p, n) : 0.0f; });
  }

  template <typename ForEach>
  __device__ void exit(int64_t c, int64_t h, ForEach&& for_each) const {
    const PaddedChunk pc = padded[c];
    const int64_t slot = cache.index(cache.slots[pc.req]);
    if (slot < 0) return;  // a pad stores nothing, intermediate states included
    const TokenRange r = packed_tokens(seqs, seqlen, pc.req);
    auto store = [&](int64_t to) {
      for_each([&](tile::FragC& f, int e, int p, int n) { cache.store(to, h, p, n, f.v[e]); });
    };
    const int64_t end = pc.start + pc.rows, done = end - r.start;  // the request's tokens so far
    if (end == r.end) store(slot);
    if (cache.every > 0 && done % cache.every == 0 && done / cache.every <= cache.max_intermediate) {
      const int64_t to = cache.index(cache.intermediate_slots[pc.req * cache.max_intermediate + done / cache.every - 1]);
      if (to >= 0) store(to);
    }
  }
};

// A request of no tokens has no chunk: its slot gets its starting state here (zero for a new
// request; a slot it reads keeps its state). One block per request, nothing for the others.
struct EmptyRequestsArgs {
  PrefillCache cache;
  SeqInputs seqs;
  int64_t seqlen, nheads, headdim, dstate;
};
__global__ void __launch_bounds__(256) empty_requests_kernel(EmptyRequestsArgs a) {
  const int64_t s = blockIdx.x;
  const TokenRange r = packed_tokens(a.seqs, a.seqlen, s);
  const int64_t slot = a.cache.index(a.cache.slots[s]);
  if (r.end > r.start || slot < 0 || a.cache.reads(s)) return;
  const int64_t n = a.nheads * a.headdim * a.dstate;
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x)
    a.cache.store(slot, i / (a.headdim * a.dstate), i / a.dstate % a.headdim, i % a.dstate, 0.0f);
}

}  // namespace mamba2ssd::cuda
