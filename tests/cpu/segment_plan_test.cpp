// The Hopper walks' segment counts, a host computation that needs no GPU: the packed prefill's
// cap (at most two segment blocks per multiprocessor), the forward's choice and the backward's, for
// the H200's 132 multiprocessors. The expected counts are the ones the H200 sweeps measured best or
// kept (docs/perf-log.md, "Prefill p3", "Backward b10"); a change of the model that moves them must
// say why there.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>

#include "mamba2ssd/mamba2ssd.h"
#ifdef MAMBA2SSD_HAVE_CUDA
#include "cuda/bwd/path.h"
#include "cuda/fwd/paths.h"
#endif

namespace mamba2ssd {
namespace {

#ifdef MAMBA2SSD_HAVE_CUDA
constexpr int kSms = 132;

cuda::DeviceInfo h200() {
  cuda::DeviceInfo d;
  d.sm_count = kSms, d.major = 9, d.minor = 0;
  return d;
}

ForwardParams shape(int64_t batch, int64_t seqlen, int64_t heads, int64_t headdim, int64_t dstate) {
  ForwardParams p;
  p.batch = batch, p.seqlen = seqlen, p.nheads = heads, p.headdim = headdim, p.dstate = dstate;
  return p;
}

// The plan prefill_cuda makes for `nseqs` requests packed into `tokens` (one row).
cuda::FwdPlan prefill_plan(int64_t tokens, int64_t nseqs, int64_t heads, int64_t headdim, int64_t dstate) {
  ForwardParams p = shape(1, tokens, heads, headdim, dstate);
  p.nseqs = nseqs;
  return cuda::sm90_prefill_plan(p, h200(), tokens / 128 + nseqs);
}

TEST(SegmentPlan, PrefillTakesTheMeasuredCounts) {
  // 80 heads of head dim 64 are 80 blocks a segment: three fill the 264 slots once.
  const cuda::FwdPlan doc = prefill_plan(65536, 13, 80, 64, 128);  // doc 64K: 1.29 ms (23 segments 1.50)
  EXPECT_FALSE(doc.request_segments);  // (a segment per request: 1.48 ms, "Prefill p4")
  EXPECT_EQ(doc.nsegs, 3);
  EXPECT_EQ(prefill_plan(8192, 8, 32, 64, 128).nsegs, 8);  // 8 x 1024 at H 32: unchanged, the best
}

// Many short requests: segments of whole requests (docs/perf-log.md, "Prefill p4": a segment per
// request against the plan's segments over the padded chunks; "Prefill p7": fewer segments, each of
// several requests; CLI, us).
TEST(SegmentPlan, PrefillTakesSegmentsOfWholeRequests) {
  struct Mix {
    int64_t tokens, nseqs, heads, headdim, dstate, segments;
  };
  for (const Mix& m : {Mix{16384, 41, 80, 64, 128, 22},    // chat 16K: 341.8 -> 333.8 (41 segments: 346.6)
                       Mix{32768, 77, 40, 128, 256, 22},   // chat 32K, P 128 N 256: 1.34 -> 1.25 ms (77: 1.31)
                       Mix{4096, 16, 80, 64, 128, 11}}) {  // 16 x 256: 96.5 -> 101.8, a loss (16: 99.8)
    const cuda::FwdPlan plan = prefill_plan(m.tokens, m.nseqs, m.heads, m.headdim, m.dstate);
    EXPECT_TRUE(plan.request_segments) << m.nseqs << " requests of " << m.tokens << " tokens";
    EXPECT_EQ(plan.nsegs, m.segments) << m.nseqs << " requests of " << m.tokens << " tokens";
    EXPECT_EQ(plan.seg_ends + plan.seg_entries + plan.seg_decay, 0u) << "no first pass, no entries";
  }
  // Too few (request, head) blocks for two waves: the segments over the padded chunks.
  EXPECT_FALSE(prefill_plan(8192, 8, 32, 64, 128).request_segments);
  EXPECT_FALSE(prefill_plan(1024, 1, 80, 64, 128).request_segments);
}

// Segments of whole requests: at least a wave of blocks (or one a request), never more segments than
// requests, and the requests' grid (segments on y) within 65535 however many requests there are.
TEST(SegmentPlan, PrefillSegmentsOfRequestsStayInRange) {
  for (int64_t heads : {1, 8, 40, 80, 300})
    for (int64_t headdim : {64, 128})
      for (int64_t dstate : {128, 256})
        for (int64_t nseqs : {64, 1000, 100000, 1000000}) {
          const int64_t tokens = nseqs * 300;
          const cuda::FwdPlan plan = prefill_plan(tokens, nseqs, heads, headdim, dstate);
          if (!plan.request_segments) continue;
          const int64_t blocks = heads * plan.ptiles, slots = kSms * (dstate > 128 ? 1 : 2);
          EXPECT_LE(plan.nsegs, std::min<int64_t>(nseqs, 65535)) << heads << " heads, " << nseqs << " requests";
          EXPECT_GE(plan.nsegs, std::min<int64_t>(nseqs, (slots + blocks - 1) / blocks))
              << heads << " heads, " << nseqs << " requests: less than a wave of blocks";
        }
}

TEST(SegmentPlan, PrefillStaysWithinTwoSegmentBlocksPerMultiprocessor) {
  for (int64_t heads : {1, 3, 8, 24, 32, 64, 80, 128, 264, 300})
    for (int64_t headdim : {32, 64, 80, 128})
      for (int64_t dstate : {64, 128, 256})
        for (int64_t tokens : {64, 1024, 16384, 262144}) {
          const cuda::FwdPlan plan = prefill_plan(tokens, 1, heads, headdim, dstate);
          const int64_t blocks = heads * plan.ptiles;
          EXPECT_GE(plan.nsegs, 1);
          EXPECT_LE(plan.nsegs * blocks, std::max<int64_t>(2 * kSms, blocks))
              << "H " << heads << ", P " << headdim << ", N " << dstate << ", " << tokens << " tokens: "
              << plan.nsegs << " segments";
          if (plan.request_segments) continue;  // (one request: its own segment)
          EXPECT_EQ(plan.nsegs, (plan.nchunks + plan.seg_chunks - 1) / plan.seg_chunks) << "no empty segments";
        }
}

TEST(SegmentPlan, ForwardKeepsItsChoice) {
  // The headline shape ran as 8 segments of 16 chunks in every H200 run (125-126 us).
  const cuda::FwdPlan plan = cuda::kSm90Path.plan(shape(4, 16384, 8, 64, 128), h200());
  EXPECT_EQ(plan.nsegs, 8);
  EXPECT_EQ(plan.seg_chunks, 16);
}

// The segments' states priced in DRAM's traffic (docs/perf-log.md, v18): `run --segments K`, the
// forward alone, median of 50, on an H100 (fifty-second session).
TEST(SegmentPlan, ForwardPricesTheSegmentStates) {
  auto forward_segments = [](int64_t batch, int64_t seqlen, int64_t heads, int64_t headdim, int64_t dstate) {
    return cuda::kSm90Path.plan(shape(batch, seqlen, heads, headdim, dstate), h200()).nsegs;
  };
  // 128 KB states: 333.3 us (1: 343.5, 2: 325.6, 8: 408.8, 32 (the count before): 845.0)
  EXPECT_EQ(forward_segments(4, 4096, 20, 128, 256), 4);
  // 154.1 us, the fastest of 1, 2, 3, 4, 6 and 13 (13, the count before: 196.5)
  EXPECT_EQ(forward_segments(1, 8192, 80, 64, 128), 3);
}

// A block's fixed cost and the second pass priced (kSm90FwdSegments): the forward's forced-segment
// sweep on an H100 (docs/perf-log.md, v19; `run --segments K`, median of 40, us; the count before in
// parentheses, then the others swept).
TEST(SegmentPlan, ForwardTakesTheSweptCounts) {
  auto segments = [](int64_t batch, int64_t seqlen, int64_t heads, int64_t headdim, int64_t dstate) {
    return cuda::kSm90Path.plan(shape(batch, seqlen, heads, headdim, dstate), h200()).nsegs;
  };
  EXPECT_EQ(segments(1, 16384, 80, 64, 128), 3);   // 281.8 (13: 326.2; 4: 334.4, 6: 308.8)
  EXPECT_EQ(segments(2, 8192, 80, 64, 128), 3);    // 304.4 (8: 338.3; 1: 313.0, 4: 320.7)
  EXPECT_EQ(segments(4, 8192, 40, 64, 128), 3);    // 306.9 (8: 338.5; 1: 312.0, 4: 321.9)
  EXPECT_EQ(segments(2, 4096, 48, 64, 128), 2);    // 117.2 (8: 131.0; 1: 160.1, 4: 131.0)
  EXPECT_EQ(segments(1, 8192, 48, 128, 128), 5);   // 197.8 (8: 210.9; 2: 214.2, 3: 228.9)
  EXPECT_EQ(segments(1, 16384, 40, 64, 256), 3);   // 286.1 (13: 324.1; 4: 378.3, 8: 348.1)
  EXPECT_EQ(segments(4, 4096, 80, 64, 128), 4);    // 323.6, kept (1: 316.1, 2: 316.8)
  EXPECT_EQ(segments(2, 4096, 80, 128, 128), 4);   // 326.5, kept (1: 319.6, 2: 316.0)
  EXPECT_EQ(segments(4, 16384, 8, 64, 128), 8);    // 135.0, kept (4: 211.7, 13: 164.6, 16: 152.4)
  EXPECT_EQ(segments(1, 32768, 24, 64, 128), 11);  // 180.7, kept (8: 217.8, 13: 272.9, 16: 233.9)
}

// The backward's Hopper walks (both directions at once, chunks of 64): `run --backward --segments K`,
// the backward alone, median of 20 (twenty-second session, runs 1 and 4).
TEST(SegmentPlan, BackwardTakesTheMeasuredCounts) {
  auto backward_plan = [](int64_t batch, int64_t seqlen, int64_t heads) {
    ForwardParams p = shape(batch, seqlen, heads, 64, 128);
    p.dtype = DType::kBF16;
    return cuda::walks_sm90_plan(p, h200());
  };
  EXPECT_EQ(backward_plan(4, 16384, 8).nsegs, 4);  // headline: 693.8 us (2: 779.0, 3: 713.5, 8: 711.6)
  EXPECT_EQ(backward_plan(4, 4096, 8).nsegs, 4);   // 209.7 us (1: 227.7, 3: 215.6, 8: 226.6)
  // 80 heads: one segment's storing walk is bound by DRAM, so more segments only add the end pass.
  EXPECT_EQ(backward_plan(1, 8192, 80).nsegs, 1);  // 730.6 us (3: 804.5, 4: 813.2, 8: 851.0)
  EXPECT_EQ(backward_plan(8, 2048, 80).nsegs, 1);  // 2.7B: 1280 blocks, five waves of them (as before)
  // Small calls, the segments' states priced (perf-log v18, an H100; the count before and its time in
  // parentheses):
  EXPECT_EQ(backward_plan(1, 1024, 24).nsegs, 4);  // 87.2 us (16: 123.2)
  EXPECT_EQ(backward_plan(1, 1024, 48).nsegs, 2);  // 136.8 us (8: 171.7)
  EXPECT_EQ(backward_plan(1, 2048, 24).nsegs, 4);  // 119.9 us (11: 137.1)
  EXPECT_EQ(backward_plan(2, 8192, 24).nsegs, 5);  // 576.8 us (8: 593.5)
}

// With the states the forward saved, the adjoint walks alone: its segments alone fill the
// multiprocessors the two directions filled, so at least as many of them (the model's choice,
// choose_segments with the one direction's blocks and bytes; measured in perf-log b17: the
// headline's 8 the fastest of 1, 2, 4 and 8, while b 1, L 8192, H 80 takes 13 where 4 ran 26 us
// faster).
TEST(SegmentPlan, BackwardWithSavedStatesWalksTheAdjointAlone) {
  alignas(16) static char stand_in[16];
  auto plans = [](int64_t batch, int64_t seqlen, int64_t heads) {
    ForwardParams p = shape(batch, seqlen, heads, 64, 128);
    p.dtype = DType::kBF16;
    const cuda::FwdPlan both = cuda::walks_sm90_plan(p, h200());
    p.saved_states = stand_in;  // (the plan reads no memory)
    return std::pair{both.nsegs, cuda::walks_sm90_plan(p, h200()).nsegs};
  };
  for (auto [batch, seqlen, heads] :
       {std::tuple{4, 16384, 8}, std::tuple{4, 4096, 8}, std::tuple{1, 2048, 24}, std::tuple{1, 8192, 80},
        std::tuple{8, 2048, 80}}) {
    const auto [both, adjoint] = plans(batch, seqlen, heads);
    EXPECT_GE(adjoint, both) << batch << " x " << seqlen << ", H " << heads;
  }
  EXPECT_GT(plans(4, 16384, 8).second, plans(4, 16384, 8).first);  // the headline: more segments than 4
  // ... but no more than one wave of the adjoint's blocks (two a multiprocessor): at 80 heads of one
  // batch row, 3 segments (the model alone gave 13, 4-7% slower on an H100).
  for (int64_t seqlen : {8192, 16384}) EXPECT_EQ(plans(1, seqlen, 80).second, 3) << seqlen;
  EXPECT_EQ(plans(2, 8192, 24).second, 5);
}
#else
TEST(SegmentPlan, NeedsTheCudaBackend) { GTEST_SKIP() << "built without the CUDA backend: no segment plans"; }
#endif

}  // namespace
}  // namespace mamba2ssd
