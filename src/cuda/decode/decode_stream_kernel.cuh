// The decode step with the state staged ahead (decode_kernel.cuh): once the faster kernel for large
// single-token calls on fp32 caches, behind the rows kernel everywhere since "Decode d7" (perf-log),
// so decode_cuda runs it only when forced (tests, CLI `decode --kernel stream`); it takes any cache.
// Work unit: one warp's tile of rows of one (request, head) (fp32, N 128: 8 lanes a row, 4 rows,
// 2 KiB; bf16: 1 KiB). Units are numbered row tile fastest, then head, then request, and each warp
// walks a contiguous range of them: neighbouring units share the request's slot and the group's B
// and C, which the warp then reads once.
//
// Pipeline. The state goes global -> shared memory by cp.async, a few units ahead: while a warp
// computes one unit, its next units' copies are in flight, so the memory system does not wait for
// the arithmetic, the slot lookups or the small inputs (the rows kernel, whose blocks have nothing
// in flight between them, then stayed near 0.68 of the copy ceiling). Each lane copies and reads
// back only its own chunks, so the stages need no barrier: cp.async.wait_group is per thread. The
// warp's B and C rows (as fp32) are the only shared data; __syncwarp guards their restaging.
#pragma once

#include <climits>

#include "cuda/decode/decode_kernel.cuh"

namespace mamba2ssd::cuda {

// 16-byte chunks of a row a lane takes per unit: 4 of an fp32 state (16 values), 2 of a 16-bit one
// (16 values: 32 would spill at the register budget below).
template <typename StateT>
constexpr int decode_stream_chunks() { return sizeof(StateT) == 4 ? 4 : 2; }
// Units a warp has staged or in flight: about 4 KiB of state a warp ahead of its arithmetic.
constexpr int decode_stream_stages(int chunks) { return chunks == 4 ? 3 : 5; }
// Blocks per multiprocessor the register budget must allow (80 registers a thread). The shared
// memory (stages of 32 x chunks x 16 bytes and 2 KiB of B and C a warp: 28-32 KiB a block) holds six.
constexpr int kDecodeStreamMinBlocks = 6;

// The kernel's shared memory (its stages and the warps' B and C rows), for the host's count of the
// blocks that fit on a multiprocessor.
template <typename StateT>
constexpr int decode_stream_smem_bytes() {
  constexpr int chunks = decode_stream_chunks<StateT>();
  return kDecodeWarps * (decode_stream_stages(chunks) * chunks * 32 * 16 + 2 * kDecodeMaxDstate * 4);
}

// Which rows a unit covers. A warp decomposes its first unit once and steps from there: 64-bit
// divisions per unit cost more issue slots than the unit's arithmetic (perf-log, "Decode d2").
struct DecodeUnit {
  int64_t b, h, g;  // request, head, the head's group
  int64_t h_in_g;   // h's place in its group
  int tile;
  // The next unit in the numbering: row tile fastest, then head, then request.
  __device__ __forceinline__ void advance(const DecodeArgs& a) {
    if (++tile < a.row_tiles) return;
    tile = 0;
    if (++h_in_g == a.heads_per_group) h_in_g = 0, ++g;
    if (++h < a.nheads) return;
    h = 0, g = 0, h_in_g = 0;
    ++b;
  }
};
__device__ __forceinline__ DecodeUnit decode_unit(const DecodeArgs& a, int64_t u) {
  if (a.units <= INT32_MAX) {  // 32-bit divisions (a few instructions, not a 64-bit routine)
    const uint32_t u32 = static_cast<uint32_t>(u), bh = u32 / a.row_tiles;
    const uint32_t H = static_cast<uint32_t>(a.nheads), hpg = static_cast<uint32_t>(a.heads_per_group);
    const uint32_t h = bh % H;
    return {bh / H, h, h / hpg, h % hpg, static_cast<int>(u32 % a.row_tiles)};
  }
  const int64_t bh = u / a.row_tiles, h = bh % a.nheads;
  return {bh / a.nheads, h, h / a.heads_per_group, h % a.heads_per_group, static_cast<int>(u % a.row_tiles)};
}

// A token's B and C rows (N values each, of the inputs' dtype In) into the warp's fp32 rows. Typed
// read-only loads (ld.global.nc), so that the compiler issues a lane's loads of each unrolled
// round ahead of its shared stores: one memory latency per round, not one per value (a generic
// load, whose dtype is chosen per value, could alias the stores between them).
template <typename In>
__device__ __forceinline__ void stage_rows(const void* B, int64_t B_at, const void* C, int64_t C_at, int N, int lane,
                                           float* sB, float* sC) {
  const In* Bp = static_cast<const In*>(B) + B_at;
  const In* Cp = static_cast<const In*>(C) + C_at;
#pragma unroll 4
  for (int n = lane; n < N; n += 32) {
    sB[n] = tile::to_float(__ldg(Bp + n));
    sC[n] = tile::to_float(__ldg(Cp + n));
  }
}

// Grid: one wave of blocks (decode_cuda), warp w taking units [w, w + 1) x units_per_warp.
template <typename StateT, bool kVec>
__global__ void __launch_bounds__(kDecodeThreads, kDecodeStreamMinBlocks) decode_stream_kernel(const DecodeArgs a) {
  using Chunk = StateChunk<StateT, kVec>;
  constexpr int kV = Chunk::kV, kChunks = decode_stream_chunks<StateT>(), kStages = decode_stream_stages(kChunks);
  __shared__ uint4 stages[kDecodeWarps][kStages][kChunks][32];  // [.., chunk, lane]: no bank conflicts
  __shared__ __align__(16) float sBC[kDecodeWarps][2][kDecodeMaxDstate];  // the warp's B and C rows, fp32

  const int L = a.lanes_per_row, lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const int row_in_unit = lane / L;
  const int P = static_cast<int>(a.headdim), N = static_cast<int>(a.dstate);
  const Strides3& ss = a.state_stride;
  float* const sB = sBC[warp][0];
  float* const sC = sBC[warp][1];
  const int col = lane % L;
  int n0[kChunks];
#pragma unroll
  for (int c = 0; c < kChunks; ++c) n0[c] = (col + c * L) * kV < N ? (col + c * L) * kV : -1;

  const int64_t first = (static_cast<int64_t>(blockIdx.x) * kDecodeWarps + warp) * a.units_per_warp;
  const int64_t end = first + a.units_per_warp < a.units ? first + a.units_per_warp : a.units;
  if (first >= end) return;  // warp-uniform

  // Issues the next unit's copies into the next stage (then one commit group, issued or not, per
  // unit, so that wait_group counts units).
  int64_t issued = first;
  DecodeUnit next = decode_unit(a, first);
  DecodeUnit w = next;  // the unit being computed (next: the next one to issue)
  int next_stage = 0;
  auto issue = [&]() {
    if (issued < end) {
      const int32_t read = read_slot(a.slots, next.b);
      const int p = next.tile * a.tile_rows + row_in_unit;
      const bool row_ok = read >= 0 && p < P;
      const StateT* src = static_cast<const StateT*>(a.state) + (row_ok ? read * ss.s0 + next.h * ss.s1 + p * ss.s2 : 0);
#pragma unroll
      for (int c = 0; c < kChunks; ++c) {
        const bool ok = row_ok && n0[c] >= 0;
        Chunk::stage(&stages[warp][next_stage][c][lane], ok ? src + n0[c] : src, ok);
      }
      next.advance(a);
    }
    tile::cp_async_commit();
    ++issued;
    next_stage = next_stage + 1 < kStages ? next_stage + 1 : 0;
  };
#pragma unroll
  for (int s = 0; s < kStages - 1; ++s) issue();

  int64_t staged_b = -1, staged_g = -1, staged_t = -1;  // whose B and C rows sB and sC hold
  int stage = 0;
  for (int64_t u = first; u < end; ++u, w.advance(a), stage = stage + 1 < kStages ? stage + 1 : 0) {
    issue();  // unit u + kStages - 1, into the stage unit u - 1 used
    const int64_t b = w.b, h = w.h, g = w.g;
    const int32_t read = read_slot(a.slots, b);
    const int row = w.tile * a.tile_rows + row_in_unit;
    const int p = row < P ? row : -1;
    if (read < 0) {  // a pad (or a slot outside the cache): zero output, nothing stored
      tile::cp_async_wait<kStages - 1>();  // its zero fill lands before the stage is reused
      __syncwarp();                         // (and no shared access moves above the wait)
      decode_zero_out(a, col, p, b, h);
      continue;
    }

    const float a_log2 = a.A[h] * kLog2e, bias = a.dt_bias ? a.dt_bias[h] : 0.0f;
    float s[kChunks][kV];
    for (int64_t t = 0; t < a.ntokens; ++t) {
      // The token's small inputs first, so that their loads overlap B's and C's.
      const DecodeTokenIn in = load_token_in(a, b, t, h, p, col);
      // This token's B and C rows of group g, staged for the warp when they change.
      if (b != staged_b || g != staged_g || t != staged_t) {
        __syncwarp();  // every lane is done with the rows staged before
        const int64_t B_at = b * a.B_stride.s0 + t * a.B_stride.s1 + g * a.B_stride.s2;
        const int64_t C_at = b * a.C_stride.s0 + t * a.C_stride.s1 + g * a.C_stride.s2;
        switch (a.dtype) {
          case DType::kF32: stage_rows<float>(a.B, B_at, a.C, C_at, N, lane, sB, sC); break;
          case DType::kF16: stage_rows<__half>(a.B, B_at, a.C, C_at, N, lane, sB, sC); break;
          default: stage_rows<__nv_bfloat16>(a.B, B_at, a.C, C_at, N, lane, sB, sC); break;  // bf16 (fp64 is refused)
        }
        __syncwarp();
        staged_b = b, staged_g = g, staged_t = t;
      }
      const float d = token_dt(a, in, bias);
      if (t == 0) {  // the unit's state, from its stage (this lane's own copies)
        tile::cp_async_wait<kStages - 1>();
        __syncwarp();  // a compiler barrier too: the wait's asm does not tell it that memory changed
#pragma unroll
        for (int c = 0; c < kChunks; ++c) Chunk::to_float(stages[warp][stage][c][lane], s[c]);
      }
      decode_token<StateT, kVec>(a, L, col, p, n0, s, sB, sC, fast_exp2(a_log2 * d), d, in, b, t, h, read);
    }
  }
  tile::cp_async_wait<0>();  // no copy outlives the block (the last units' empty groups included)
}

}  // namespace mamba2ssd::cuda
