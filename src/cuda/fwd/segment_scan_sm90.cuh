// The hopper path's main kernel: the fused walk on Hopper's warpgroup tensor-core instructions
// (wgmma, sm_90a), the same algorithm as segment_scan_sm80.cuh (one block per (segment of chunks,
// 64 head-dim columns, head, batch row), the state on chip), in steps of 64 tokens (half a chunk of
// the plan), one warpgroup per block and two blocks per multiprocessor (state size 256: two
// warpgroups, one block; below), so that one block's masks and epilogue run under the other's wgmma.
// Every product of a step is a wgmma that reads its operands from shared memory:
//   S      = C B^T                       the step's 64 x 64 causal weights (the upper half masked)
//   Y      = C h^T                       h from shared memory, rounded to the input type
//   h_next = exp2(g_last - g_base) h + X^T (w B)   X^T w from registers, B read transposed
//   Y     += (S * exp2(g_i - g_j) dt_j * mask) X      S from registers, X read transposed
// A step's tiles load (TMA, 128-byte swizzled tiles) while the previous step computes; h sits in
// fp32 registers and, for C h^T, in shared memory. g is the cumsum of the plan's 128-token chunk,
// so a step in the chunk's second half measures decays from g of the token before it. 16-bit
// inputs, every head dim (64 columns per block: walk_block; head dim 32 runs with 32 zero columns),
// state size up to kN (64, 128 or 256). The segments' entry states come from
// segment_ends_sm90.cuh and segment_entries.cuh. With varlen states, the state entering each chunk in
// which a sequence ends goes to that sequence's entry (CarriedStates).
//
// State size 256 (kN = 256) takes two warpgroups, each with 128 of the state columns: S, C h^T, the
// state jump and P X are all sums over those columns, so each warpgroup runs the step above on its
// half of B, C and h, and y is the sum of the two halves' results (warpgroup 1 hands its part over
// through shared memory before warpgroup 0 finishes y). One block per multiprocessor then.
#pragma once

#include <type_traits>

#include "cuda/common/grid_dependency.cuh"
#include "cuda/fwd/args.cuh"
#include "cuda/fwd/output_steps.cuh"
#include "cuda/fwd/sm90_loads.cuh"
#include "cuda/fwd/state_steps.cuh"
#include "cuda/prefill/request_edges.cuh"
#include "cuda/tile/wgmma.cuh"

namespace mamba2ssd::cuda {

template <typename T, int kN>
struct SegmentScanSm90Shape : Sm90Step {
  static constexpr int kStages = 2;  // steps in flight
  static constexpr int kGroups = kN / 128 > 1 ? kN / 128 : 1;  // warpgroups, one per 128 state columns
  static constexpr int kNg = kN / kGroups;                       // a warpgroup's state columns
  static constexpr int kThreads = kGroups * Sm90Step::kThreads;
  static constexpr int kBlocksPerSm = sm90_blocks_per_sm(kN);
  using XTile = tile::wg::SwizzledTile<kTokens, kHeadDim>;  // [token][p], by TMA
  using BCTile = tile::wg::SwizzledTile<kTokens, kN>;       // [token][n], B and C, by TMA
  using BCPart = tile::wg::SwizzledTile<kTokens, kNg>;      // a warpgroup's columns of B or C
  using HTile = tile::wg::CoreTile<kHeadDim, kNg>;         // [p][n] of a warpgroup, written by its threads
  static constexpr int kStageElems = XTile::kElems + 2 * BCTile::kElems;  // X, B, C
  static constexpr int kPartialFloats = kGroups > 1 ? kTokens * kHeadDim : 0;  // warpgroup 1's part of y
  // Shared memory, carved from one 1024-byte aligned base in the kernel (in this order): the stages'
  // X, B and C tiles; y; h per warpgroup; warpgroup 1's part of y; the stages' scalars; the token
  // weights; the stages' barriers. (Not a SharedStorage struct like the other kernels: with one,
  // ptxas scheduled this kernel differently and it ran 5% slower at state size 128 on the H200,
  // perf-log.md v10.)
  static constexpr int kSmemBytes =
      (kStages * kStageElems + XTile::kElems + kGroups * HTile::kElems) * 2 +
      kPartialFloats * 4 + kStages * sizeof(Scalars) + kTokens * 4 + kStages * 8 +
      1024;  // to align the tiles to 1024 bytes
  static_assert(kBlocksPerSm * (kSmemBytes + 1024) <= 228 * 1024, "Hopper blocks exceed shared memory");
  static_assert(kGroups == 1 || BCPart::kElems * kGroups == BCTile::kElems, "B's parts are its column blocks");
};

// About 160 accumulator and operand registers per thread (S 32, Y 32, h 64, X^T w 16, P 16).
// kCarry: with varlen states (a kernel of its own: the check alone, in the plain kernel, moved its
// SASS and cost 4% on the headline shape). kTiled: any head dim but 64, as column tiles (a kernel of
// its own for the same reason: the tiles' offsets and tests cost head dim 64 1%; HeadRows).
// kPrefill: the packed prefill's padded layout (src/cuda/prefill/request_edges.cuh): each step's
// tokens where the chunk map says (segments of whole requests: from each request's span, request
// after request, and no step past a request's last token), each request entered from its slot at
// its first chunk and its states stored after its last step and at its boundaries; a step with
// fewer than 64 of its request's tokens stores y from registers, row by row (a TMA store would
// write the next request's rows). kSave (not with kCarry or kPrefill): the state entering each step
// also goes to saved_states, for the backward, by TMA from s_h, which is then a 128-byte swizzled
// tile (whole 128-byte rows a box; the core-matrix layout's rows are 16 bytes); with kTiled, the
// block's rows of it (a kernel of its own, so that the others' SASS does not change).
template <typename T, int kN, bool kCarry, bool kTiled, bool kPrefill = false, bool kSave = false>
__global__ void __launch_bounds__(SegmentScanSm90Shape<T, kN>::kThreads, SegmentScanSm90Shape<T, kN>::kBlocksPerSm)
    segment_scan_sm90_kernel(const __grid_constant__ Sm90FwdArgs a) {
  static_assert(!kSave || (!kCarry && !kPrefill), "states are saved from the plain forward only");
  static_assert(!kSave || (SegmentScanSm90Shape<T, kN>::kStages * SegmentScanSm90Shape<T, kN>::kStageElems +
                           SegmentScanSm90Shape<T, kN>::XTile::kElems) * sizeof(T) % 1024 == 0,
                "a swizzled h needs its 1024-byte aligned place");
#ifdef MAMBA2SSD_WGMMA
  namespace wg = tile::wg;
  using Shape = SegmentScanSm90Shape<T, kN>;
  using XTile = typename Shape::XTile;
  using BCTile = typename Shape::BCTile;
  // (kSave: swizzled, as TMA stores it; the same size and 1024-byte aligned, as every stage's tiles are)
  using HTile = std::conditional_t<kSave, tile::wg::SwizzledTile<Shape::kHeadDim, Shape::kNg>, typename Shape::HTile>;
  using BCPart = typename Shape::BCPart;
  using Out = OutputSteps<T, Shape::kTokens, Shape::kHeadDim>;
  constexpr int kTokens = Shape::kTokens, kP = Shape::kHeadDim, kStages = Shape::kStages;
  constexpr int kStepsPerChunk = Shape::kStepsPerChunk, kNg = Shape::kNg;
  const Geometry& geo = a.geo;
  const FwdTensors& io = a.io;
  // The packed prefill with segments of whole requests runs its grid as (heads x column tiles,
  // segments), so that a segment's blocks, which read the same B and C, run side by side
  // (hopper_path.cu).
  const bool per_request = kPrefill && a.prefill.request_chunks;
  const WalkBlock block = kTiled ? walk_block(a, blockIdx.x) : WalkBlock{blockIdx.x, 0};  // x: segment or head
  const int64_t seg = per_request ? blockIdx.y : block.seg, h = per_request ? block.seg : blockIdx.y, b = blockIdx.z;
  const int p_base = kTiled ? block.p_base : 0;
  const HeadRows<kTiled> head_rows{p_base, kTiled ? geo.headdim : kWalkPCols};
  const int64_t grp = geo.group_of(h);
  // The segment's steps; a chunk's second step is skipped when no token of it is in the sequence.
  // (The prefill walks padded chunks, as many as the chunk map fills: that count is read once the
  // kernels before this one are done.)
  int64_t step_begin = seg * a.seg.chunks * kStepsPerChunk;
  const int64_t seq_steps = kPrefill ? a.scan.nchunks * kStepsPerChunk : (geo.seqlen + kTokens - 1) / kTokens;
  int64_t step_end = step_begin + a.seg.chunks * kStepsPerChunk < seq_steps
                         ? step_begin + a.seg.chunks * kStepsPerChunk
                         : seq_steps;

  extern __shared__ __align__(128) unsigned char smem_bytes[];  // TMA boxes land 128-byte aligned
  T* smem_tiles = tile::tma::align_1024<T>(smem_bytes);
  auto sX = [&](int buf) { return smem_tiles + buf * Shape::kStageElems; };
  auto sB = [&](int buf) { return sX(buf) + XTile::kElems; };
  auto sC = [&](int buf) { return sB(buf) + BCTile::kElems; };
  T* s_y = smem_tiles + kStages * Shape::kStageElems;  // a step's y on its way out (TMA store), as X
  T* s_hs = s_y + XTile::kElems;                        // [warpgroups] of h
  float* s_partial = reinterpret_cast<float*>(s_hs + Shape::kGroups * HTile::kElems);  // [kYTiles][4][128]
  float* s_scalars = s_partial + Shape::kPartialFloats;  // [stages] of Scalars
  // (The stages' scalars are addressed as floats: through the Scalars struct, ptxas scheduled the
  // loop differently, 600 SASS lines apart.)
  auto s_g = [&](int buf) { return Shape::g(s_scalars, buf); };
  auto s_dt = [&](int buf) { return Shape::dt(s_scalars, buf); };
  auto s_seq = [&](int buf) { return Shape::seq(s_scalars, buf); };
  float* s_w = s_scalars + kStages * Shape::kScalarFloats;  // [kTokens] token weights of the state jump
  uint64_t* s_full = reinterpret_cast<uint64_t*>(s_w + kTokens);  // [stages]

  // The prefill's request walked and its step s (tokens and request). With segments of whole
  // requests, from the request's span and chunks, read when the walk reaches it (each step's reads
  // of the chunk map, slot and cu_seqlens were memory latencies on the walk's path); else from the
  // chunk map, the span read when the request changes.
  using Request = WalkedRequest<kTokens, kStepsPerChunk>;
  [[maybe_unused]] Request walk{{-1, {0, 0}, -1}, 0, 0};
  [[maybe_unused]] int32_t group_end = 0;  // (segments of whole requests) the segment's end request
  auto step_at = [&](int64_t s) {
    return per_request ? walk.step(s, geo.seqlen) : prefill_step<kTokens, kStepsPerChunk>(a, s);
  };
  // The step after s (with segments of whole requests, the next request's first once s is its
  // request's last; `move`: the walk goes on to that request) and, for the prefill, its first
  // token (-1 past the walk's steps). Thread 0 asks at a step's top (to stage that step's tiles),
  // every thread again at its end: the next request read twice (from L1 the second time) rather
  // than held in registers across the step, where the N 256 walk has none to spare.
  struct NextStep {
    int64_t s, t0;
  };
  auto step_after = [&](int64_t s, bool move) -> NextStep {
    if constexpr (kPrefill) {
      if (per_request && s + 1 >= walk.last) {
        const Request next = Request::from(a, walk.span.req + 1, group_end, static_cast<int32_t>(step_end));
        if (move) walk = next;
        return {next.first, next.span.tokens.start};
      }
      if (s + 1 < step_end) return {s + 1, step_at(s + 1).t0};
    }
    return {s + 1, -1};
  };
  // Step s's loads into buffer buf (the prefill's tiles from token t0), issued by thread 0; a
  // second-half step brings g's lead along.
  auto stage_step = [&](int64_t s, int64_t t0, int buf) {
    issue_step_loads<T, kTokens, kP, kN, true>(a, b, h, grp, s * kTokens, p_base,
                                               {sX(buf), sB(buf), sC(buf), s_g(buf), s_dt(buf), s_seq(buf), &s_full[buf]},
                                               s % kStepsPerChunk != 0, 0, kPrefill ? t0 : -1);
  };
  // A step's y from s_y to global memory at token t0 (rows past the sequence and columns past the
  // head dim are not written), by thread 0 after a proxy fence and a barrier.
  auto store_y_tile = [&](int64_t t0) {
    tile::tma::store_4d(&a.y_map, p_base, static_cast<int>(h), static_cast<int>(t0), static_cast<int>(b), s_y);
  };
  // (The prefill) the first token of the previous step's y tile in s_y, or -1: a step short of its
  // request's tokens stored its rows itself (finish_y).
  [[maybe_unused]] int y_t0 = -1;  // (TMA's coordinates are 32-bit)
  prepare_stages<kStages, Shape::kThreads>(a, s_full, s_seq);

  // Warpgroup wgi holds state columns n0 .. n0 + kNg - 1; its warp w holds rows 16 w .. of the step
  // (S, Y) and of the state (p).
  // (0 written as a constant for one warpgroup, warp_uniform for two: derived from threadIdx alone,
  // the tiles' addresses would leave ptxas's uniform registers, and every wgmma descriptor would
  // take a move.)
  const int wgi = Shape::kGroups > 1 ? tile::warp_uniform(static_cast<int>(threadIdx.x) / Sm90Step::kThreads) : 0;
  const int n0 = wgi * kNg;
  const int m0 = 16 * (tile::warp_id() % 4);
  T* s_h = s_hs + wgi * HTile::kElems;
  tile::FragC acc_h[kNg / 8];
  auto for_each_state = [&](auto&& f) {  // f(value, p index, n index)
#pragma unroll
    for (int j = 0; j < kNg / 8; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) f(acc_h[j].v[e], m0 + tile::frag_row(e), n0 + 8 * j + tile::frag_col(e));
  };
  typename Out::DFactors d_factors;
  Out::load_d(io, h, head_rows.headdim, p_base, d_factors);
  // h rounded to T as the operand of C h^T (as the other paths do; with fp16 inputs an |h| above
  // 65504 becomes inf), two accumulator tiles per stmatrix.
  auto state_to_smem = [&] {
#pragma unroll
    for (int j = 0; j < kNg / 8; j += 2) {
      const tile::FragC &lo = acc_h[j], &hi = acc_h[j + 1];
      const uint32_t r[4] = {tile::pack2<T>(lo.v[0], lo.v[1]), tile::pack2<T>(lo.v[2], lo.v[3]),
                             tile::pack2<T>(hi.v[0], hi.v[1]), tile::pack2<T>(hi.v[2], hi.v[3])};
      wg::store_accum_pair<HTile>(s_h, m0, 8 * j, r);
    }
  };
  // (kSave) The state entering step s, as s_h holds it (rounded to T, as C h^T reads it), to
  // saved_states: each 64 state columns of every warpgroup one box of the block's rows (p_base on;
  // rows past the head dim, head dim 32's padding, and columns past the state size lie outside the
  // map, so TMA stores none of them). By thread 0 after a proxy fence and a barrier; s_h is
  // rewritten only after the barrier that follows its wait_stores_read. The backward's chunks are
  // the steps (64 tokens), so it reads there what its own walk would have stored.
  [[maybe_unused]] auto save_state = [&](int64_t s) {
    constexpr int kBoxCols = 128 / static_cast<int>(sizeof(T));  // a box: one 128-byte swizzle span of columns
    const int row = static_cast<int>(b * seq_steps + s);         // (b, step) of the [b x steps] view
#pragma unroll
    for (int k = 0; k < kN / kBoxCols; ++k)
      if (kBoxCols * k < geo.dstate)
        tile::tma::store_4d(&a.saved_map, kBoxCols * k, static_cast<int>(h), p_base, row, s_hs + k * kP * kBoxCols);
  };
  // y = (acc_y + D x) * silu(z) of the warp's rows into s_y, x from X: both SwizzledTiles, moved as
  // 8 x 8 matrices. Rows past the sequence (x zero there) are never stored by the TMA store; z is
  // read only inside the sequence.
  auto finish_y = [&](tile::FragC(&acc_y)[Out::kYTiles], const T* x, int64_t t0, int rows) {
#pragma unroll
    for (int pt = 0; pt < Out::kYTiles; pt += 2) {
      uint32_t xr[4];
      wg::load_accum_pair<XTile>(x, m0, 8 * pt, xr);
#pragma unroll
      for (int e = 0; e < 8; ++e) {  // tile pt + e / 4, element e % 4
        const float2 xv = tile::unpack2<T>(xr[2 * (e >> 2) + ((e >> 1) & 1)]);
        acc_y[pt + (e >> 2)].v[e & 3] += d_factors[pt + (e >> 2)][e & 1] * (e & 1 ? xv.y : xv.x);
      }
    }
    if (io.z) {  // (written out rather than OutputSteps::gate_row, which moved this kernel's SASS)
      const T* z = static_cast<const T*>(io.z) + b * io.z_stride.s0 + t0 * io.z_stride.s1 + h * io.z_stride.s2 + p_base;
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        const int i = m0 + tile::frag_row(2 * half);
        if (i >= rows) continue;
#pragma unroll
        for (int pt = 0; pt < Out::kYTiles; ++pt) {
          if (!head_rows.in(pt * 8)) break;  // z has no such columns (y's store drops them)
          float zv[2];
          tile::load_pair(z + i * io.z_stride.s1 + pt * 8 + tile::frag_col(0), io.z_pairs, zv);
          acc_y[pt].v[2 * half] *= silu(zv[0]);
          acc_y[pt].v[2 * half + 1] *= silu(zv[1]);
        }
      }
    }
    if (kPrefill && rows < kTokens) {  // the request's rows only, straight to y (store_y_tile skips the step)
      T* y = static_cast<T*>(io.y) + b * io.y_stride.s0 + t0 * io.y_stride.s1 + h * io.y_stride.s2 + p_base;
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        const int i = m0 + tile::frag_row(2 * half);
        if (i >= rows) continue;
#pragma unroll
        for (int pt = 0; pt < Out::kYTiles; ++pt)
          if (head_rows.in(pt * 8))
            tile::store_pair(y + i * io.y_stride.s1 + pt * 8 + tile::frag_col(0), io.y_pairs,
                             {acc_y[pt].v[2 * half], acc_y[pt].v[2 * half + 1]});
      }
      return;
    }
#pragma unroll
    for (int pt = 0; pt < Out::kYTiles; pt += 2) {
      const tile::FragC &lo = acc_y[pt], &hi = acc_y[pt + 1];
      const uint32_t r[4] = {tile::pack2<T>(lo.v[0], lo.v[1]), tile::pack2<T>(lo.v[2], lo.v[3]),
                             tile::pack2<T>(hi.v[0], hi.v[1]), tile::pack2<T>(hi.v[2], hi.v[3])};
      wg::store_accum_pair<XTile>(s_y, m0, 8 * pt, r);
    }
  };
  // The packed prefill's state elements of this block and warpgroup, as request_edges.cuh visits
  // them: pairs of columns (n, n + 1), n even, inside the head dim and the state size (p and n the
  // head's), an accumulator's elements 0, 1 and 2, 3 (the state size is a multiple of 16, so a pair
  // is inside it or outside it whole). The padding rows and columns stay zero: x's and B's are.
  auto for_each_request_pair = [&](auto&& f) {
#pragma unroll
    for (int j = 0; j < kNg / 8; ++j)
#pragma unroll
      for (int e = 0; e < 4; e += 2) {
        const int p = m0 + tile::frag_row(e), n = n0 + 8 * j + tile::frag_col(e);
        if (head_rows.in(p) && n < geo.dstate) f(acc_h[j].v[e], acc_h[j].v[e + 1], p_base + p, n);
      }
  };

  // The prefill's chunk map and requests, read before the wait (a segment's first request takes two
  // dependent loads): padded_chunks_kernel wrote them before chunk_cumsum, which starts only once
  // it is done (not a dependent launch), and this walk starts after chunk_cumsum does.
  if constexpr (kPrefill) {  // the chunks that hold requests
    const int64_t used = *a.scan.padded_count * kStepsPerChunk;
    if (per_request) {  // the segment's requests from the first with a step, each entered from its slot below
      const int32_t* group = a.prefill.request_groups + seg;
      group_end = group[1];
      step_end = kStepsPerChunk * a.prefill.request_chunks[group_end];
      walk = Request::from(a, group[0], group_end, static_cast<int32_t>(step_end));
      step_begin = walk.first;
    }
    step_end = step_end < used ? step_end : used;
  }
  wait_previous_kernel();  // the segment entries (and, before them, chunk_cumsum's g and dt)
  if (per_request) for_each_state([](float& v, int, int) { v = 0.0f; });  // (the padding, before the first entry)
  else load_segment_entry<false, kN>(a, b, seg, h, head_rows, for_each_state);
  state_to_smem();
  int32_t seq_prev = a.scan.resets && step_begin > 0 ? seq_of(a, b, step_begin * kTokens - 1) : 0;
  const int64_t chunk_end = (step_end + kStepsPerChunk - 1) / kStepsPerChunk;
  CarriedStates carried(a, step_begin / kStepsPerChunk);
  // The prefill: whether this block entered the request it walks (else that request began in an
  // earlier segment, whose block reads its slot: its final state waits for deferred_states_kernel).
  // With one segment, chunk 0 starts a request: never deferred.
  [[maybe_unused]] bool entered = a.seg.count == 1;
  // The first loads go out after the entry: issued before it, they kept ptxas from holding the
  // wgmma descriptors in uniform registers (82 more register-to-uniform moves a step).
  if (threadIdx.x == 0 && step_begin < step_end) stage_step(step_begin, kPrefill ? step_at(step_begin).t0 : -1, 0);
  // (The prefill's s skips the empty second half of a request's short last chunk: i counts the
  // steps walked.)
  [[maybe_unused]] int walked = 0;
  for (int64_t s = step_begin; s < step_end; s = kPrefill ? step_after(s, true).s : s + 1) {
    const int64_t i = kPrefill ? walked++ : s - step_begin;
    const int buf = static_cast<int>(i % kStages);
    if constexpr (kCarry)
      if (s % kStepsPerChunk == 0) carried.enter(a, h, s / kStepsPerChunk, chunk_end, head_rows, for_each_state);
    PrefillStep step{};
    if constexpr (kPrefill) {
      step = step_at(s);
      if (!per_request && step.rows > 0 && step.req != walk.span.req) walk.span = request_span(a, step.req);
      if (step.rows > 0 && step.t0 == walk.span.tokens.start) {  // the request's first step
        // (s_h is free since the last barrier; the hopper path's caches allow pairs)
        enter_request<true>(a, walk.span, h, for_each_request_pair);
        state_to_smem();
        entered = true;
      }
    }
    // h and y (written at the end of the previous step) are visible to the async proxy, and every
    // thread is done with step s - 1, so its buffers take step s + 1; then step s's tiles arrive.
    wg::proxy_fence();
    __syncthreads();
    if (threadIdx.x == 0) {
      const NextStep next = step_after(s, false);
      if (next.s < step_end) stage_step(next.s, next.t0, static_cast<int>((i + 1) % kStages));
      if constexpr (kPrefill) {
        if (y_t0 >= 0) store_y_tile(y_t0);
      } else if (s > step_begin) {
        store_y_tile((s - 1) * kTokens);
      }
      if constexpr (kSave) save_state(s);
    }
    tile::tma::wait(&s_full[buf], static_cast<uint32_t>(i / kStages) & 1);
    if constexpr (kPrefill)
      if (0 < step.rows && step.rows < kTokens) {
        // A step with fewer than 64 of its request's tokens: the boxes' other rows are the next
        // request's tokens, which the masks' zeros would turn into NaN wherever those are not
        // finite (0 * inf); zeroed, a request's y and states depend on its own tokens only. (C's
        // other rows reach only the rows of y that are not stored.)
        XTile::zero_rows_from(sX(buf), step.rows, threadIdx.x, Shape::kThreads);
        BCTile::zero_rows_from(sB(buf), step.rows, threadIdx.x, Shape::kThreads);
        wg::proxy_fence();
        __syncthreads();
      }

    const T *x = sX(buf), *B = sB(buf) + wgi * BCPart::kElems, *C = sC(buf) + wgi * BCPart::kElems;
    const float *g = s_g(buf), *dt = s_dt(buf);
    const int32_t* seq = s_seq(buf);
    const float g_base = s % kStepsPerChunk ? g[-1] : 0.0f;
    const int64_t t0 = kPrefill ? step.t0 : s * kTokens;
    const int rows = kPrefill ? step.rows : static_cast<int>(geo.seqlen - t0 < kTokens ? geo.seqlen - t0 : kTokens);
    const StateJump jump(g, seq, kTokens, seq_prev, g_base);
#pragma unroll
    for (auto& f : acc_h)
#pragma unroll
      for (float& v : f.v) v *= jump.decay;  // before any wgmma of this step is in flight

    // S = C B^T and Y = C h^T, asynchronously while the jump weights are computed (the first k-step
    // starts both afresh).
    tile::FragC acc_s[Out::kSTiles], acc_y[Out::kYTiles];
    wg::pin(acc_h);
    wg::fence();
    wg::Mma<T, kTokens>::template ss<0, 0, false>(acc_s, wg::k_major<BCPart>(C, 0, 0), wg::k_major<BCPart>(B, 0, 0));
    wg::Mma<T, kP>::template ss<0, 0, false>(acc_y, wg::k_major<BCPart>(C, 0, 0), wg::k_major<HTile>(s_h, 0, 0));
#pragma unroll
    for (int ks = 1; ks < kNg / 16; ++ks) {
      const uint64_t c_desc = wg::k_major<BCPart>(C, 0, ks);
      wg::Mma<T, kTokens>::template ss<0, 0>(acc_s, c_desc, wg::k_major<BCPart>(B, 0, ks));
      wg::Mma<T, kP>::template ss<0, 0>(acc_y, c_desc, wg::k_major<HTile>(s_h, 0, ks));
    }
    wg::commit();
    jump.weights<kTokens, Shape::kThreads>(g, dt, seq, s_w);
    if (threadIdx.x == 0) tile::tma::wait_stores_read();  // s_y is free for this step's y (kSave: s_h too)
    wg::wait<0>();
    wg::pin(acc_s), wg::pin(acc_y);
    // The weights are visible, and every warp's share of C h^T is done: s_h may be rewritten. The
    // same barrier tells whether the mask may take the weights as a factor (no resets, and no decay
    // in the step wide enough to leave fp32's range).
    const bool exact_mask =
        __syncthreads_or(threadIdx.x < kTokens && !(fabsf(g[threadIdx.x] - jump.g_last) < Out::kFactoredRange)) ||
        a.scan.resets;

    // h += X^T (w B) (h already decayed): A = (X^T scaled by w per token) from registers, B = B read
    // MN-major.
    tile::FragA xw[kTokens / 16];
#pragma unroll
    for (int ks = 0; ks < kTokens / 16; ++ks) {
      xw[ks] = wg::load_a_trans<XTile>(x, m0, 16 * ks);
      tile::Mma<T>::scale_a_cols(xw[ks], [&](int k) { return s_w[16 * ks + k]; });
    }
    wg::pin(acc_h), wg::pin(xw);
    wg::fence();
#pragma unroll
    for (int ks = 0; ks < kTokens / 16; ++ks)
      wg::Mma<T, kNg>::template rs<1>(acc_h, xw[ks], wg::mn_major<BCPart>(B, 0, ks));
    wg::commit();

    // Y += P X with P = the masked, decayed S (registers) and X read MN-major.
    if (exact_mask) Out::decay_and_mask(acc_s, acc_y, g, dt, seq, seq_prev, m0, a.scan.resets, g_base);
    else Out::decay_and_mask_factored(acc_s, acc_y, g, s_w, m0, jump.g_last, g_base);
    tile::FragA pa[kTokens / 16];
#pragma unroll
    for (int ks = 0; ks < kTokens / 16; ++ks) pa[ks] = tile::a_from_accum<T>(acc_s, ks);
    wg::pin(acc_y), wg::pin(pa);
    wg::fence();
#pragma unroll
    for (int ks = 0; ks < kTokens / 16; ++ks)
      wg::Mma<T, kP>::template rs<1>(acc_y, pa[ks], wg::mn_major<XTile>(x, 0, ks));
    wg::commit();
    // h goes to shared memory (read by step s + 1 after its barrier) while P X still runs. (With
    // two warpgroups, after y: there the early store cost 48 more register-to-uniform moves.)
    if constexpr (Shape::kGroups == 1) {
      wg::wait<1>();
      wg::pin(acc_h);
      state_to_smem();
    }
    wg::wait<0>();
    wg::pin(acc_h), wg::pin(acc_y);
    seq_prev = jump.seq_last;
    if constexpr (kPrefill)
      if (step.rows > 0)
        store_request_states<true>(a, walk.span, step.t0 + step.rows, h, for_each_request_pair, !entered,
                                   [&](float v, int p, int n) { seg_state<kN>(a.seg.ends, a, b, seg, h)[p * kN + n] = v; });
    if constexpr (Shape::kGroups > 1) wg::sum_into_first(acc_y, s_partial, wgi);  // y = the warpgroups' parts
    if (wgi == 0) finish_y(acc_y, x, t0, rows);
    if constexpr (Shape::kGroups > 1) state_to_smem();
    if constexpr (kPrefill) y_t0 = rows == kTokens ? static_cast<int>(t0) : -1;
  }

  wg::proxy_fence();  // the last step's y
  __syncthreads();
  if (threadIdx.x == 0) {
    if constexpr (kPrefill) {
      if (y_t0 >= 0) store_y_tile(y_t0);
    } else if (step_end > step_begin) {
      store_y_tile((step_end - 1) * kTokens);
    }
    tile::tma::wait_stores();
  }
  store_segment_exit<false, kN>(a, b, seg, h, head_rows, for_each_state);
#else
  __trap();  // built without sm_90a code: the host never selects this kernel (sm90_kernels_built)
#endif
}

}  // namespace mamba2ssd::cuda
