// The chaining of segment states between the fused walks' two passes (segment_entries.cuh), as a
// host and device function so that its rule is tested on the host (tests/cpu/segment_entry_test.cpp):
//   entry_{s+1} = decay_s entry_s + end_s
// where the first pass leaves decay_s = kSegmentCut if a sequence (a request, in the prefill) starts
// in segment s: the entry does not reach the segment's end at all. A marker, not a decay of 0, so
// that the entry is dropped instead of multiplied by 0 (NaN for a non-finite entry, which would
// carry one sequence's NaN into the next), while a decay that underflows to 0 inside one sequence
// still multiplies and keeps a NaN where the contract has it.
#pragma once

#include <cmath>

#include "common/dt.h"  // M2_HD

namespace mamba2ssd {

constexpr float kSegmentCut = -1.0f;

// One state element of entry_{s+1}; one FMA, as the plain formula compiles to, where no sequence
// starts in the segment.
M2_HD float next_segment_entry(float decay, float entry, float end) {
  const bool cut = decay == kSegmentCut;
  return fmaf(cut ? 0.0f : decay, cut ? 0.0f : entry, end);
}

}  // namespace mamba2ssd
