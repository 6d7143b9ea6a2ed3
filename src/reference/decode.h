// The fp64 oracle of the decode step (include/mamba2ssd/mamba2ssd.h, "Decode"): the recurrence token
// by token in double, for a slice of the requests and heads. The ground truth of the decode tests
// (CPU and GPU), the CLI's checks and the `reference` backend.
#pragma once

#include <cstdint>
#include <vector>

#include "mamba2ssd/mamba2ssd.h"

namespace mamba2ssd::reference {

// Requests [batch_begin, batch_end) and heads [head_begin, head_end); -1: to the end.
struct DecodeSlice {
  int64_t batch_begin = 0, batch_end = -1;
  int64_t head_begin = 0, head_end = -1;
};

// The oracle's answer for the slice (nb requests, nh heads, all T tokens).
struct DecodeResult {
  DecodeSlice slice;  // resolved: no -1 left
  int64_t nb = 0, ntokens = 0, nh = 0, headdim = 0, dstate = 0;
  std::vector<double> out;        // [nb, T, nh, P]; zeros for a skipped request
  std::vector<double> states;     // [nb, T, nh, P, N]: the state after each token (unrounded)
  std::vector<int32_t> read;      // [nb]: the slot each request reads, -1: skipped
  std::vector<int32_t> dst;       // [nb, T]: where the state after token t is stored, -1: nowhere

  int64_t out_at(int64_t b, int64_t t, int64_t h, int64_t p) const { return ((b * ntokens + t) * nh + h) * headdim + p; }
  int64_t state_at(int64_t b, int64_t t, int64_t h) const { return ((b * ntokens + t) * nh + h) * headdim * dstate; }
};

// Runs the recurrence on host memory. p must be valid (validate(p)); nothing of p is written. Slot
// entries that are pads or outside the cache are skipped, the CUDA backend's rule (the host
// backends refuse the latter before calling this). Every request reads the cache as it was before
// the call.
DecodeResult run_decode(const DecodeParams& p, DecodeSlice slice = {});

}  // namespace mamba2ssd::reference
