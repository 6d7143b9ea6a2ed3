// forward_cpu's scan as the other CPU entry points use it: the packed prefill runs the same walk over
// its requests, each starting from and ending in a slot of its state cache.
#pragma once

#include <cstdint>

#include "mamba2ssd/mamba2ssd.h"

namespace mamba2ssd::cpu {

// Per packed sequence s (cu_seqlens): the slot of a [nslots, H, P, N] cache its state starts from
// (read[s], or -1: zero) and the slot its state after its last token is stored to (write[s], or -1:
// none). A sequence of no tokens stores its starting state (so only a zero start writes anything).
// With every > 0, also the state after token m * every of sequence s (m = 1 .. max_boundaries,
// counted from its first token) to slot boundary[s * max_boundaries + m - 1], or nowhere (-1).
struct SequenceStates {
  void* cache;
  Strides4 stride;
  DType dtype;
  const int32_t* read;
  const int32_t* write;
  int64_t every = 0;
  const int32_t* boundary = nullptr;
  int64_t max_boundaries = 0;
};

// The scan of forward_cpu on a validated call in host memory whose contents were checked. With seqs
// (a packed call without seq_idx: the sequences are cu_seqlens'), each sequence starts from and
// stores to its slots instead of from zero. Items touch only their (head, 32 dims) of each slot, so
// the caller must make sure no two stores (final or boundary) go to one slot, nor one to a slot a
// sequence reads.
void scan_forward(const ForwardParams& p, const SequenceStates* seqs, int num_threads);

}  // namespace mamba2ssd::cpu
