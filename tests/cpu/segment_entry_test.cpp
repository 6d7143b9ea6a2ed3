// The chaining of segment states between the fused walks' passes (common/segment_entry.h; the
// device runs the same function in segment_entries.cuh): the entry survives a segment by its decay,
// even a decay that underflowed to 0, except where a sequence starts in the segment (kSegmentCut),
// where it is dropped and a non-finite entry stays behind.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>

#include "common/segment_entry.h"

namespace mamba2ssd {
namespace {

constexpr float kNaN = std::numeric_limits<float>::quiet_NaN(), kInf = std::numeric_limits<float>::infinity();

TEST(SegmentEntry, DecaysTheEntryIntoTheSegmentsEnd) {
  EXPECT_EQ(next_segment_entry(0.5f, 3.0f, 1.0f), 2.5f);
  EXPECT_EQ(next_segment_entry(1.0f, -2.0f, 0.25f), -1.75f);
  // One rounding, as the FMA the kernel had: 1/3 * 3 - 1 is 0 in two roundings, 2.98e-8 in one.
  EXPECT_EQ(next_segment_entry(1.0f / 3.0f, 3.0f, -1.0f), std::fma(1.0f / 3.0f, 3.0f, -1.0f));
}

TEST(SegmentEntry, ASequenceStartDropsTheEntry) {
  for (float entry : {2.0f, kNaN, kInf, -kInf}) {
    EXPECT_EQ(next_segment_entry(kSegmentCut, entry, 0.75f), 0.75f) << entry;
    EXPECT_TRUE(std::isnan(next_segment_entry(kSegmentCut, entry, kNaN))) << "the segment's own NaN stays";
  }
}

TEST(SegmentEntry, AnUnderflowedDecayKeepsANonFiniteEntry) {
  // Inside one sequence a decay may round to 0 in fp32 where the fp64 contract's is tiny but not 0:
  // NaN * tiny is NaN there, so the entry's NaN must stay (a 0 decay multiplies, it does not cut).
  EXPECT_TRUE(std::isnan(next_segment_entry(0.0f, kNaN, 1.0f)));
  EXPECT_TRUE(std::isnan(next_segment_entry(0.0f, kInf, 1.0f)));
  EXPECT_EQ(next_segment_entry(0.0f, 5.0f, 1.0f), 1.0f);
  EXPECT_TRUE(std::isnan(next_segment_entry(kNaN, 5.0f, 1.0f))) << "a NaN decay";
}

}  // namespace
}  // namespace mamba2ssd
