#include "cuda/fwd/plan.h"

#include <algorithm>
#include <atomic>
#include <cstdio>

#include "api/internal.h"

namespace mamba2ssd::cuda {
namespace {

std::atomic<int64_t> g_forced_segments{0};  // detail::set_fused_segments_for_testing

// Segments chosen ahead of time from the shape: `slots` blocks of the main kernel run at once, so
// minimize waves x (chunks per segment and a block's fixed cost), charging the extra pass that more
// than one segment needs (it re-reads x and B: about a third of the main pass, `second_pass`), plus
// the main pass's wait on DRAM where its bytes take longer (`floor` chunk steps) than its waves:
// there more segments shorten nothing.
// Each segment adds its blocks' states to DRAM's traffic (`state_steps` chunk steps a segment):
// stored by the first pass, read and stored again as entries, read by the walk. At state size 256
// and head dim 128 a state is 128 KB: b 4, L 4096, H 20 took 32 segments of one chunk, whose
// states moved 1.3 GB (docs/perf-log.md, v18).
int64_t choose_segments(int64_t blocks_per_segment, int64_t nchunks, int64_t slots, int64_t max_segments,
                        const SegmentModel& model, double state_steps) {
  int64_t best = 1;
  double best_cost = 0.0;
  for (int64_t segs = 1; segs <= max_segments && segs <= nchunks; ++segs) {
    const int64_t seg_chunks = (nchunks + segs - 1) / segs;
    if ((nchunks + seg_chunks - 1) / seg_chunks != segs) continue;  // no empty segments
    const int64_t waves = (blocks_per_segment * segs + slots - 1) / slots;
    const double latency = static_cast<double>(waves) * (static_cast<double>(seg_chunks) + model.block_steps);
    const double passes = segs > 1 ? model.second_pass : 1.0, states = segs > 1 ? segs * state_steps : 0.0;
    const double cost = latency * passes + std::max(0.0, model.floor - latency) + states;
    if (segs == 1 || cost < best_cost) best = segs, best_cost = cost;
  }
  return best;
}

}  // namespace

std::string FwdPlan::describe(std::size_t workspace) const {
  char buf[160];
  if (own_layout) {
    std::snprintf(buf, sizeof buf, "workspace %zu bytes", workspace);
  } else if (request_segments) {
    std::snprintf(buf, sizeof buf, "chunk %lld, %lld segment%s of whole requests, workspace %zu bytes",
                  static_cast<long long>(chunk), static_cast<long long>(nsegs), nsegs == 1 ? "" : "s", workspace);
  } else if (seg_chunks) {
    char tiles[48] = "";
    if (ptiles > 1) std::snprintf(tiles, sizeof tiles, ", head dim in %lld tiles of %d", static_cast<long long>(ptiles), kWalkPCols);
    std::snprintf(buf, sizeof buf, "chunk %lld, %lld segment%s of %lld chunks%s, workspace %zu bytes",
                  static_cast<long long>(chunk), static_cast<long long>(nsegs), nsegs == 1 ? "" : "s",
                  static_cast<long long>(seg_chunks), tiles, workspace);
  } else {
    std::snprintf(buf, sizeof buf, "chunk %lld, %lld chunks, workspace %zu bytes", static_cast<long long>(chunk),
                  static_cast<long long>(nchunks), workspace);
  }
  return buf;
}

FwdWorkspace carve(const FwdPlan& plan, void* workspace) {
  char* next = static_cast<char*>(workspace);
  auto take = [&next](std::size_t bytes) {
    char* at = next;
    next += bytes;
    return bytes ? at : nullptr;
  };
  FwdWorkspace w{};
  w.dt = reinterpret_cast<float*>(take(plan.dt));
  w.g = reinterpret_cast<float*>(take(plan.g));
  w.seq = reinterpret_cast<int32_t*>(take(plan.seq));
  w.chunk_states = reinterpret_cast<float*>(take(plan.chunk_states));
  w.seg_ends = reinterpret_cast<float*>(take(plan.seg_ends));
  w.seg_entries = reinterpret_cast<float*>(take(plan.seg_entries));
  w.seg_decay = reinterpret_cast<float*>(take(plan.seg_decay));
  w.carry = reinterpret_cast<int32_t*>(take(plan.carry));
  return w;
}

std::string grid_refusal(const ForwardParams& p) {
  if (p.nheads <= 65535 && p.batch <= 65535) return "";
  return "its grids take at most 65535 heads and batch rows (nheads " + std::to_string(p.nheads) + ", batch " +
         std::to_string(p.batch) + ")";
}

FwdPlan scan_plan(const ForwardParams& p, CudaPath path, int64_t chunk) {
  FwdPlan plan;
  plan.path = path;
  plan.chunk = chunk;
  plan.nchunks = (p.seqlen + chunk - 1) / chunk;
  plan.lpad = plan.nchunks * chunk;
  plan.dt = plan.g = round_up(sizeof(float) * p.batch * p.nheads * plan.lpad);
  if (p.seq_idx || p.cu_seqlens) plan.seq = round_up(sizeof(int32_t) * p.batch * plan.lpad);
  return plan;
}

void plan_segments(FwdPlan& plan, const ForwardParams& p, int64_t slots, const SegmentModel& model) {
  const int64_t forced = g_forced_segments.load();
  plan.ptiles = walk_ptiles(p.headdim);
  const int64_t blocks_per_segment = p.batch * p.nheads * plan.ptiles;
  const std::size_t state_bytes = sizeof(float) * p.headdim * fused_state_cols(p.dstate);  // padded
  constexpr double kStateMoves = 4.0;  // stored, read, stored as an entry, read (choose_segments)
  const double state_steps =
      kStateMoves * static_cast<double>(state_bytes * p.batch * p.nheads) / kDramBytesPerUs / model.step_us;
  const int64_t max_segments = model.max_blocks > 0
                                   ? std::clamp<int64_t>(model.max_blocks / blocks_per_segment, 1, kMaxSegments)
                                   : int64_t{kMaxSegments};
  plan.nsegs = forced > 0 ? std::min({forced, plan.nchunks, static_cast<int64_t>(kMaxSegments)})
                          : choose_segments(blocks_per_segment, plan.nchunks, slots, max_segments, model, state_steps);
  plan.seg_chunks = (plan.nchunks + plan.nsegs - 1) / plan.nsegs;
  plan.nsegs = (plan.nchunks + plan.seg_chunks - 1) / plan.seg_chunks;  // no empty segments
  if (plan.nsegs > 1) {
    plan.seg_ends = plan.seg_entries = round_up(state_bytes * p.batch * plan.nsegs * p.nheads);
    plan.seg_decay = round_up(sizeof(float) * p.batch * plan.nsegs * p.nheads);
  }
  if (p.varlen_states) plan.carry = round_up(sizeof(int32_t) * plan.nchunks);  // b == 1
}

}  // namespace mamba2ssd::cuda

bool mamba2ssd::cuda::segments_forced_for_testing() { return cuda::g_forced_segments.load() > 0; }
void mamba2ssd::detail::set_fused_segments_for_testing(int64_t n) { cuda::g_forced_segments = n; }
