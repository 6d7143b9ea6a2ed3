// Hopper's bulk copies into shared memory (TMA), completing on an mbarrier: one thread issues a
// chunk's tiles, the others wait for the barrier's phase. No per-thread addresses or registers are
// tied up in the copy, and rows past the tensor's end arrive as zeros.
//
// Tensor maps (CUtensorMap, built on the host with cuTensorMapEncodeTiled) must live in kernel
// parameter space (__grid_constant__) or global memory. Everything here exists only for sm_90a;
// callers compile it under MAMBA2SSD_WGMMA.
#pragma once

#include <cuda.h>

#include <cstdint>

#include "cuda/tile/wgmma.cuh"

namespace mamba2ssd::tile::tma {

#ifdef MAMBA2SSD_WGMMA
#define MAMBA2SSD_TMA_ASM(...) asm volatile(__VA_ARGS__)
#else
#define MAMBA2SSD_TMA_ASM(...) ((void)0)
#endif

// The first 1024-byte aligned address of shared memory at or after p (the swizzled tiles' atoms
// must sit at such addresses).
template <typename T>
__device__ __forceinline__ T* align_1024(void* p) {
  const uint32_t a = smem_addr(p);
  return reinterpret_cast<T*>(static_cast<char*>(p) + ((1024 - (a & 1023)) & 1023));
}

// An mbarrier that completes a phase when `count` threads arrived and the expected bytes landed.
__device__ __forceinline__ void barrier_init(uint64_t* bar, uint32_t count) {
  MAMBA2SSD_TMA_ASM("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(smem_addr(bar)), "r"(count));
}
// Makes initialized barriers visible to the async proxy (then a __syncthreads).
__device__ __forceinline__ void barrier_init_fence() {
  MAMBA2SSD_TMA_ASM("fence.mbarrier_init.release.cluster;" ::: "memory");
}
// Arrives (one thread) and announces the bytes the phase's copies will deliver.
__device__ __forceinline__ void arrive_expect_bytes(uint64_t* bar, uint32_t bytes) {
  MAMBA2SSD_TMA_ASM("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(smem_addr(bar)), "r"(bytes)
                    : "memory");
}
// Arrives (one thread), with release semantics: what the thread wrote before is visible to those
// that wait for the phase.
__device__ __forceinline__ void arrive(uint64_t* bar) {
  MAMBA2SSD_TMA_ASM("mbarrier.arrive.shared::cta.b64 _, [%0];" ::"r"(smem_addr(bar)) : "memory");
}
// Returns when the phase of the given parity has completed.
__device__ __forceinline__ void wait(uint64_t* bar, uint32_t parity) {
  MAMBA2SSD_TMA_ASM(
      "{\n.reg .pred done;\n"  // labels are local to the braces
      "again:\n"
      "mbarrier.try_wait.parity.shared::cta.b64 done, [%0], %1;\n"
      "@!done bra again;\n}" ::"r"(smem_addr(bar)),
      "r"(parity)
      : "memory");
}

// The box at coordinates (c0 .. c3) of a rank-4 tensor map into dst (1024-byte aligned for the
// 128-byte swizzle, so that the pattern matches SwizzledTile).
__device__ __forceinline__ void load_4d(void* dst, const CUtensorMap* map, int c0, int c1, int c2, int c3,
                                        uint64_t* bar) {
  MAMBA2SSD_TMA_ASM(
      "cp.async.bulk.tensor.4d.shared::cluster.global.tile.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3, %4, "
      "%5}], [%6];" ::"r"(smem_addr(dst)),
      "l"(map), "r"(c0), "r"(c1), "r"(c2), "r"(c3), "r"(smem_addr(bar))
      : "memory");
}
// The box at coordinates (c0 .. c3) of a rank-4 tensor map from src (shared memory, aligned as for
// load_4d; written before a proxy fence and a barrier), as one bulk group of this thread.
__device__ __forceinline__ void store_4d(const CUtensorMap* map, int c0, int c1, int c2, int c3, const void* src) {
  MAMBA2SSD_TMA_ASM("cp.async.bulk.tensor.4d.global.shared::cta.bulk_group [%0, {%1, %2, %3, %4}], [%5];" ::"l"(map),
                    "r"(c0), "r"(c1), "r"(c2), "r"(c3), "r"(smem_addr(src))
                    : "memory");
  MAMBA2SSD_TMA_ASM("cp.async.bulk.commit_group;" ::: "memory");
}
// Returns when this thread's bulk stores have read their shared memory (it may be written again).
__device__ __forceinline__ void wait_stores_read() {
  MAMBA2SSD_TMA_ASM("cp.async.bulk.wait_group.read 0;" ::: "memory");
}
// Returns when this thread's bulk stores are complete.
__device__ __forceinline__ void wait_stores() { MAMBA2SSD_TMA_ASM("cp.async.bulk.wait_group 0;" ::: "memory"); }

// `bytes` contiguous bytes (a multiple of 16, both addresses 16-byte aligned).
__device__ __forceinline__ void load_bytes(void* dst, const void* src, uint32_t bytes, uint64_t* bar) {
  MAMBA2SSD_TMA_ASM(
      "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::"r"(smem_addr(dst)),
      "l"(src), "r"(bytes), "r"(smem_addr(bar))
      : "memory");
}

// Tokens per TMA box of the row-tile maps (encode_row_tiles on the host): a tile of kRows tokens
// arrives as kRows / kBoxRows boxes per column block, a 64-token tile (and y's store) as one.
constexpr int kBoxRows = 64;

// Rows [t0, t0 + kRows) and columns [col0, col0 + kCols) of one (head or group, batch row) of a
// [batch, token, head, column] tensor of kElemBytes-byte elements into a SwizzledTile: boxes of 128
// bytes of columns x kBoxRows tokens with the 128-byte swizzle. Row r of a column block sits at
// r * 128 bytes, so the boxes of one block stack.
template <int kRows, int kCols, int kElemBytes = 2>
__device__ __forceinline__ void load_swizzled_tile(void* dst, const CUtensorMap* map, int t0, int head, int b,
                                                   uint64_t* bar, int col0 = 0) {
  using Tile = wg::SwizzledTile<kRows, kCols, kElemBytes>;
  static_assert(kRows % kBoxRows == 0, "a tile is whole boxes");
#pragma unroll
  for (int cb = 0; cb < kCols / Tile::kBlockCols; ++cb)
#pragma unroll
    for (int rb = 0; rb < kRows / kBoxRows; ++rb)
      load_4d(static_cast<char*>(dst) + cb * Tile::kBlockBytes + rb * kBoxRows * 128, map, col0 + Tile::kBlockCols * cb,
              head, t0 + rb * kBoxRows, b, bar);
}

}  // namespace mamba2ssd::tile::tma
