// Hopper warpgroup tensor-core products (wgmma, sm_90a) and the shared-memory layout they read.
//
// A warpgroup (4 warps, 128 threads) computes D[64 x N] += A[64 x 16] B[16 x N] per instruction.
// B, and A unless it comes from registers, are read from shared memory through a 64-bit matrix
// descriptor. Two canonical layouts: CoreTile, no swizzle, 8 x 8 core matrices (8 rows of 16 bytes,
// 128 contiguous bytes) laid out down the columns first, for tiles the threads write; and
// SwizzledTile, the 128-byte swizzle that TMA writes (tma.cuh). Each layout serves an operand
// either way round: read with its rows as M/N it is "K-major"; read with its rows as K it is
// "MN-major" (the instruction's transpose bit).
//
// The accumulator of a warpgroup: warp w of the group holds rows 16w .. 16w + 15 as one mma.sync
// accumulator tile (FragC) per 8 columns: d[j].v[e] is (row 16w + frag_row(e), column 8j + frag_col(e)).
// An A operand from registers has the mma.sync m16n8k16 A layout (FragA).
//
// Everything here exists only for sm_90a; callers compile it under MAMBA2SSD_WGMMA.
#pragma once

#include <cstdint>
#include <type_traits>

#include "cuda/tile/mma.cuh"

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900 && defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define MAMBA2SSD_WGMMA 1
#endif

namespace mamba2ssd::tile::wg {

// Matrix descriptor: start address, leading and stride byte offsets (all >> 4), layout type.
enum class Swizzle : uint64_t { kNone = 0, k128B = 1 };
__device__ __forceinline__ uint64_t descriptor(const void* smem, uint32_t leading_bytes, uint32_t stride_bytes,
                                               Swizzle swizzle) {
  return static_cast<uint64_t>((smem_addr(smem) & 0x3FFFF) >> 4) |
         static_cast<uint64_t>((leading_bytes >> 4) & 0x3FFF) << 16 |
         static_cast<uint64_t>((stride_bytes >> 4) & 0x3FFF) << 32 | static_cast<uint64_t>(swizzle) << 62;
}
// The descriptor of the same operand `bytes` further on: shared addresses stay below 2^18, so the
// start field never carries. The tiles below build a k-step's descriptor as one base (the same for
// every k-step, computed once) plus a constant.
__device__ __forceinline__ uint64_t advance(uint64_t desc, uint32_t bytes) { return desc + (bytes >> 4); }

// A kRows x kCols tile of 16-bit elements (kRows, kCols multiples of 8) in core matrices, no
// swizzle: core matrix (r / 8, c / 8) is the (c / 8 * kRows / 8 + r / 8)-th 128-byte block.
// Descriptors of the 16-wide k-step `ks`, read K-major (rows from `row0`) or MN-major (columns
// from `col0`):
//   K-major operand (tile rows are M or N):  leading = next 8 columns (K), stride = next 8 rows.
//   MN-major operand (tile rows are K):      leading = next 8 rows (K),    stride = next 8 columns.
template <int kRows, int kCols>
struct CoreTile {
  static_assert(kRows % 8 == 0 && kCols % 8 == 0, "core matrices are 8 x 8");
  static constexpr int kElems = kRows * kCols;
  static constexpr uint32_t kColStepBytes = kRows * 16;  // next core matrix along a row
  static constexpr uint32_t kRowStepBytes = 128;         // next 8 rows
  static __device__ __forceinline__ int offset(int r, int c) {
    return (c >> 3) * (kRows * 8) + (r >> 3) * 64 + (r & 7) * 8 + (c & 7);
  }
  static __device__ __forceinline__ uint64_t k_major(const void* tile, int row0, int ks) {
    const char* p = static_cast<const char*>(tile) + (row0 >> 3) * kRowStepBytes;
    return advance(descriptor(p, kColStepBytes, kRowStepBytes, Swizzle::kNone), 2 * ks * kColStepBytes);
  }
  static __device__ __forceinline__ uint64_t mn_major(const void* tile, int col0, int ks) {
    const char* p = static_cast<const char*>(tile) + (col0 >> 3) * kColStepBytes;
    return advance(descriptor(p, kRowStepBytes, kColStepBytes, Swizzle::kNone), 2 * ks * kRowStepBytes);
  }
};

// A kRows x kCols tile of kElemBytes-byte elements in the 128-byte swizzle layout that TMA writes
// with a box of 128 bytes of columns (tma.cuh; 64 columns of 16-bit elements, 32 of fp32): column
// blocks of kBlockCols one after the other, each kRows rows of 128 bytes, and the 16-byte piece j of
// row r stored at piece j ^ (r % 8). Needs 1024-byte alignment (the swizzle repeats every 8 rows).
// Descriptors (a k-step is 32 bytes of K: 16 16-bit elements, 8 TF32):
//   K-major: stride = next 8 rows (1024 bytes); the k-step moves the start 32 bytes along the row.
//   MN-major (16-bit only): stride = next 8 rows (K), leading = next 64 columns; a k-step is 16 rows.
template <int kRows, int kCols, int kElemBytes = 2>
struct SwizzledTile {
  static_assert(kElemBytes == 2 || kElemBytes == 4, "16- or 32-bit elements");
  static constexpr int kPieceShift = kElemBytes == 2 ? 3 : 2, kBlockShift = kPieceShift + 3;  // log2 of:
  static constexpr int kPieceElems = 1 << kPieceShift, kBlockCols = 1 << kBlockShift;  // 16 bytes, 128 bytes
  static_assert(kRows % 8 == 0 && kCols % kBlockCols == 0, "swizzled tiles are whole 8-row, 128-byte atoms");
  static constexpr int kElems = kRows * kCols;
  static constexpr uint32_t kBlockBytes = kRows * 128;  // one column block
  static __device__ __forceinline__ int offset(int r, int c) {
    return (c >> kBlockShift) * (kRows * kBlockCols) + r * kBlockCols +
           ((((c >> kPieceShift) & 7) ^ (r & 7)) << kPieceShift) + (c & (kPieceElems - 1));
  }
  static __device__ __forceinline__ uint64_t k_major(const void* tile, int row0, int ks) {
    const char* p = static_cast<const char*>(tile) + row0 * 128;
    return advance(descriptor(p, 16, 1024, Swizzle::k128B), (ks >> 2) * kBlockBytes + (ks & 3) * 32);
  }
  static __device__ __forceinline__ uint64_t mn_major(const void* tile, int col0, int ks) {
    static_assert(kElemBytes == 2, "wgmma reads 32-bit operands K-major only");
    const char* p = static_cast<const char*>(tile) + (col0 >> 6) * kBlockBytes + (col0 & 63) * 2;
    return advance(descriptor(p, kBlockBytes, 1024, Swizzle::k128B), ks * 16 * 128);
  }
  // Zeroes rows [from, kRows), `threads` threads from `thread` (0 .. threads - 1), 16 bytes a store:
  // a row is one 128-byte line of each column block (the swizzle only permutes its pieces). A proxy
  // fence, and a barrier or an mbarrier release, must follow before wgmma reads the tile.
  static __device__ __forceinline__ void zero_rows_from(void* tile, int from, int thread, int threads) {
    constexpr int kLineBlocks = kCols / kBlockCols;
    const int pieces = (kRows - from) * kLineBlocks * 8;
    for (int i = thread; i < pieces; i += threads) {
      const int line = i >> 3, r = from + line / kLineBlocks, cb = line % kLineBlocks;
      *reinterpret_cast<uint4*>(static_cast<char*>(tile) + cb * kBlockBytes + r * 128 + (i & 7) * 16) =
          make_uint4(0u, 0u, 0u, 0u);
    }
  }
};

template <typename Tile>
__device__ __forceinline__ uint64_t k_major(const void* tile, int row0, int ks) {
  return Tile::k_major(tile, row0, ks);
}
template <typename Tile>
__device__ __forceinline__ uint64_t mn_major(const void* tile, int col0, int ks) {
  return Tile::mn_major(tile, col0, ks);
}

// Multiplies row r of a kRows x kCols Tile (CoreTile or SwizzledTile) by w(r), with all kThreads
// threads, 16 bytes at a time (a barrier must follow before other threads read the tile).
template <typename T, typename Tile, int kRows, int kCols, int kThreads, typename W>
__device__ __forceinline__ void scale_rows(T* tile, W w) {
  static_assert(sizeof(T) == 2, "tiles hold 16-bit elements");
  constexpr int kBlocks = kCols / 8, kPieces = kRows * kBlocks;
  static_assert(kPieces % kThreads == 0 && kThreads % kRows == 0, "each thread scales pieces of one row");
  const int r = threadIdx.x % kRows;  // consecutive threads: consecutive rows
  const float f = w(r);
#pragma unroll
  for (int k = 0; k < kPieces / kThreads; ++k) {
    const int c = (threadIdx.x + k * kThreads) / kRows * 8;
    uint4* piece = reinterpret_cast<uint4*>(tile + Tile::offset(r, c));
    uint4 v = *piece;
    uint32_t* u = reinterpret_cast<uint32_t*>(&v);
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const float2 e = unpack2<T>(u[j]);
      u[j] = pack2<T>(e.x * f, e.y * f);
    }
    *piece = v;
  }
}

// The mma.sync A fragment (16 x 16) at rows m0, columns k0 of the transpose of a Tile, i.e. of a
// tile stored [k][m] (as load_a_trans of Mma16): each 8 x 8 core matrix is one ldmatrix matrix.
template <typename Tile, typename T>
__device__ __forceinline__ FragA load_a_trans(const T* tile, int m0, int k0) {
  const int l = lane_id();
  FragA a;
  ldmatrix_x4_trans(a.r, tile + Tile::offset(k0 + (l & 7) + (l >> 4) * 8, m0 + ((l >> 3) & 1) * 8));
  return a;
}

// Two accumulator tiles in 16-bit form (the m16n8 layout: rows r0 .. r0 + 15, columns c0 .. c0 + 15)
// to or from a Tile, as four 8 x 8 matrices in one instruction: r[2 t + h] is the thread's pair of
// tile t (columns c0 + 8 t ..), rows r0 + 8 h .. (accumulator elements 2 h, 2 h + 1).
template <typename Tile, typename T>
__device__ __forceinline__ const T* accum_pair_row(const T* tile, int r0, int c0) {
  const int l = lane_id(), m = l >> 3;  // lane l gives row l % 8 of matrix m
  return tile + Tile::offset(r0 + (l & 7) + 8 * (m & 1), c0 + 8 * (m >> 1));
}
template <typename Tile, typename T>
__device__ __forceinline__ void store_accum_pair(T* tile, int r0, int c0, const uint32_t (&r)[4]) {
  stmatrix_x4(const_cast<T*>(accum_pair_row<Tile>(tile, r0, c0)), r);
}
template <typename Tile, typename T>
__device__ __forceinline__ void load_accum_pair(const T* tile, int r0, int c0, uint32_t (&r)[4]) {
  ldmatrix_x4(r, accum_pair_row<Tile>(tile, r0, c0));
}

// Ordering. fence: before the first wgmma, and after registers it reads (accumulators, A) were
// written by other instructions (pin them first, see pin()). commit/wait: wgmma runs
// asynchronously; wait<n> returns when at most n committed groups are still pending. proxy_fence:
// after shared memory was written by ordinary stores or cp.async and before wgmma (the async proxy)
// reads it (then a barrier).
__device__ __forceinline__ void fence() {
#ifdef MAMBA2SSD_WGMMA
  asm volatile("wgmma.fence.sync.aligned;" ::: "memory");
#endif
}
__device__ __forceinline__ void commit() {
#ifdef MAMBA2SSD_WGMMA
  asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory");
#endif
}
template <int kPending>
__device__ __forceinline__ void wait() {
#ifdef MAMBA2SSD_WGMMA
  asm volatile("wgmma.wait_group.sync.aligned %0;" ::"n"(kPending) : "memory");
#endif
}
__device__ __forceinline__ void proxy_fence() {
#ifdef MAMBA2SSD_WGMMA
  asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
#endif
}

// A barrier of one warpgroup's 128 threads only (named barrier `id`, 1-15: 0 is __syncthreads'),
// for blocks whose other warps are busy elsewhere (a producer warp).
__device__ __forceinline__ void warpgroup_sync(int id) {
  asm volatile("bar.sync %0, 128;" ::"r"(id) : "memory");
}

// TF32 wgmma reads a 32-bit operand K-major only: a 64 x 64 fp32 Tile t ([k][mn] as TMA brought it)
// as t^T ([mn][k], TileT) in its own place, rounded to TF32, by one warpgroup (thread: 0 .. 127 within
// it; barrier: its named barrier). Each thread reads its 32 elements, the warpgroup waits for every
// read, then each writes its own as 16-byte pieces of row mn, four k each (a warp reads 32
// consecutive columns of a row, and its stores of 8 rows land in 8 distinct swizzle positions: no
// bank conflict either way). A proxy fence and a warpgroup barrier must follow before wgmma reads it.
template <typename Tile, typename TileT>
__device__ __forceinline__ void transpose_tf32_in_place(float* t, int thread, int barrier) {
  static_assert(Tile::kElems == 64 * 64 && TileT::kElems == 64 * 64, "a 64 x 64 tile");
  constexpr int kPieces = 8;  // of the 16 pieces of a row, a thread's half
  const int mn = thread % 64, half = thread / 64;
  uint4 v[kPieces];
#pragma unroll
  for (int k = 0; k < kPieces; ++k) {
    const int i = 4 * (kPieces * half + k);
    v[k] = {to_tf32(t[Tile::offset(i, mn)]), to_tf32(t[Tile::offset(i + 1, mn)]), to_tf32(t[Tile::offset(i + 2, mn)]),
            to_tf32(t[Tile::offset(i + 3, mn)])};
  }
  warpgroup_sync(barrier);
#pragma unroll
  for (int k = 0; k < kPieces; ++k) *reinterpret_cast<uint4*>(t + TileT::offset(mn, 4 * (kPieces * half + k))) = v[k];
}

// Two warpgroups' accumulators summed into the first's (wgi: the thread's warpgroup, 0 or 1): the
// second hands its tiles over through `partial` ([kTiles][4][128] floats), a block barrier between.
template <int kTiles>
__device__ __forceinline__ void sum_into_first(FragC (&d)[kTiles], float* partial, int wgi) {
  const int slot = threadIdx.x % 128;
  if (wgi == 1)
#pragma unroll
    for (int j = 0; j < kTiles; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) partial[(4 * j + e) * 128 + slot] = d[j].v[e];
  __syncthreads();
  if (wgi == 0)
#pragma unroll
    for (int j = 0; j < kTiles; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) d[j].v[e] += partial[(4 * j + e) * 128 + slot];
}

// Pins registers in program order: the compiler may move ordinary register writes (zeroing, scaling,
// building A fragments) past fence() or a wgmma's issue, which PTX forbids and ptxas then repairs by
// serializing the wgmma groups (warnings C7519/C7517). pin(x) right before fence(), and right after
// wait(), for every accumulator and register operand involved.
template <int kTiles>
__device__ __forceinline__ void pin(FragC (&d)[kTiles]) {
#pragma unroll
  for (int i = 0; i < kTiles; ++i)
#pragma unroll
    for (int e = 0; e < 4; ++e) asm volatile("" : "+f"(d[i].v[e])::"memory");
}
template <int kFrags>
__device__ __forceinline__ void pin(FragA (&a)[kFrags]) {
#pragma unroll
  for (int i = 0; i < kFrags; ++i)
#pragma unroll
    for (int r = 0; r < 4; ++r) asm volatile("" : "+r"(a[i].r[r])::"memory");
}

// D[64 x kN] += A B: Mma<T, kN>::ss(d, a_desc, b_desc) with A and B in shared memory;
// Mma<T, kN>::rs(d, a, b_desc) with A from registers. d: the thread's kN / 8 accumulator tiles.
// kTransA / kTransB: the operand is MN-major. T is __nv_bfloat16 or __half.
template <typename T>
constexpr bool kIsBf16 = std::is_same_v<T, __nv_bfloat16>;  // else __half

template <typename T, int kN>
struct Mma;

// The instructions: one asm text per (n, A operand form, type), assembled by the preprocessor.
// Operand i < n / 2 is element i % 4 of accumulator tile i / 4; the descriptors, the A registers
// and the immediates follow. The bf16 and fp16 forms differ only in the type suffix.
#ifdef MAMBA2SSD_WGMMA
#define MAMBA2SSD_WGMMA_ASM(...) asm volatile(__VA_ARGS__)
#else
#define MAMBA2SSD_WGMMA_ASM(...) ((void)0)
#endif
#define MAMBA2SSD_WGMMA_TEXT(N, K, TYPE, ACC_REGS, REST, SCALE_D)                                           \
  "{.reg .pred p; setp.ne.b32 p, " SCALE_D ", 0;\n"                                                          \
  "wgmma.mma_async.sync.aligned.m64n" #N "k" #K ".f32." TYPE "." TYPE " " ACC_REGS ", " REST ";}"
#define MAMBA2SSD_ACC_TILE(j) "+f"(d[j].v[0]), "+f"(d[j].v[1]), "+f"(d[j].v[2]), "+f"(d[j].v[3])
#define MAMBA2SSD_ACC_32 MAMBA2SSD_ACC_TILE(0), MAMBA2SSD_ACC_TILE(1), MAMBA2SSD_ACC_TILE(2), MAMBA2SSD_ACC_TILE(3)
#define MAMBA2SSD_ACC_64 \
  MAMBA2SSD_ACC_32, MAMBA2SSD_ACC_TILE(4), MAMBA2SSD_ACC_TILE(5), MAMBA2SSD_ACC_TILE(6), MAMBA2SSD_ACC_TILE(7)
#define MAMBA2SSD_ACC_128                                                                                   \
  MAMBA2SSD_ACC_64, MAMBA2SSD_ACC_TILE(8), MAMBA2SSD_ACC_TILE(9), MAMBA2SSD_ACC_TILE(10), MAMBA2SSD_ACC_TILE(11), \
      MAMBA2SSD_ACC_TILE(12), MAMBA2SSD_ACC_TILE(13), MAMBA2SSD_ACC_TILE(14), MAMBA2SSD_ACC_TILE(15)
#define MAMBA2SSD_ACC_REGS_32 \
  "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15}"
#define MAMBA2SSD_ACC_REGS_64 \
  "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, " \
  "%21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}"
#define MAMBA2SSD_ACC_REGS_128 \
  "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, " \
  "%21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, " \
  "%40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, " \
  "%59, %60, %61, %62, %63}"

// Mma<T, n>: ss(d, a_desc, b_desc) and rs(d, a, b_desc); SS_REST / RS_REST: the operands after the
// accumulators, SS_SCALE / RS_SCALE: the operand that says whether D is added (kAccumulate; a
// product with kAccumulate = false starts D afresh, so no register needs zeroing first).
#define MAMBA2SSD_WGMMA_SHAPE(N, SS_REST, SS_SCALE, RS_REST, RS_SCALE)                                     \
  template <typename T>                                                                                     \
  struct Mma<T, N> {                                                                                        \
    template <int kTransA, int kTransB, bool kAccumulate = true>                                            \
    static __device__ __forceinline__ void ss(FragC* d, uint64_t a, uint64_t b) {                          \
      if constexpr (kIsBf16<T>)                                                                             \
        MAMBA2SSD_WGMMA_ASM(MAMBA2SSD_WGMMA_TEXT(N, 16, "bf16", MAMBA2SSD_ACC_REGS_##N, SS_REST, SS_SCALE)     \
                            : MAMBA2SSD_ACC_##N                                                             \
                            : "l"(a), "l"(b), "n"(kTransA), "n"(kTransB), "n"(int{kAccumulate}));           \
      else                                                                                                  \
        MAMBA2SSD_WGMMA_ASM(MAMBA2SSD_WGMMA_TEXT(N, 16, "f16", MAMBA2SSD_ACC_REGS_##N, SS_REST, SS_SCALE)      \
                            : MAMBA2SSD_ACC_##N                                                             \
                            : "l"(a), "l"(b), "n"(kTransA), "n"(kTransB), "n"(int{kAccumulate}));           \
    }                                                                                                       \
    template <int kTransB, bool kAccumulate = true>                                                         \
    static __device__ __forceinline__ void rs(FragC* d, const FragA& a, uint64_t b) {                      \
      if constexpr (kIsBf16<T>)                                                                             \
        MAMBA2SSD_WGMMA_ASM(MAMBA2SSD_WGMMA_TEXT(N, 16, "bf16", MAMBA2SSD_ACC_REGS_##N, RS_REST, RS_SCALE)     \
                            : MAMBA2SSD_ACC_##N                                                             \
                            : "r"(a.r[0]), "r"(a.r[1]), "r"(a.r[2]), "r"(a.r[3]), "l"(b), "n"(kTransB),     \
                              "n"(int{kAccumulate}));                                                       \
      else                                                                                                  \
        MAMBA2SSD_WGMMA_ASM(MAMBA2SSD_WGMMA_TEXT(N, 16, "f16", MAMBA2SSD_ACC_REGS_##N, RS_REST, RS_SCALE)      \
                            : MAMBA2SSD_ACC_##N                                                             \
                            : "r"(a.r[0]), "r"(a.r[1]), "r"(a.r[2]), "r"(a.r[3]), "l"(b), "n"(kTransB),     \
                              "n"(int{kAccumulate}));                                                       \
    }                                                                                                       \
  };

MAMBA2SSD_WGMMA_SHAPE(32, "%16, %17, p, 1, 1, %18, %19", "%20", "{%16, %17, %18, %19}, %20, p, 1, 1, %21", "%22")
MAMBA2SSD_WGMMA_SHAPE(64, "%32, %33, p, 1, 1, %34, %35", "%36", "{%32, %33, %34, %35}, %36, p, 1, 1, %37", "%38")
MAMBA2SSD_WGMMA_SHAPE(128, "%64, %65, p, 1, 1, %66, %67", "%68", "{%64, %65, %66, %67}, %68, p, 1, 1, %69",
                      "%70")

// fp32 operands as TF32 (the tensor cores read an fp32 word's upper 19 bits), k = 8 per instruction:
// MmaTf32<n>::ss(d, a_desc, b_desc) and rs(d, a, b_desc) as Mma's, both shared-memory operands
// K-major (no transpose for 32-bit types). A from registers has the mma.sync m16n8k8 TF32 layout:
// a.r = (row g, k q), (g + 8, q), (g, q + 4), (g + 8, q + 4), g = lane / 4, q = lane % 4.
template <int kN>
struct MmaTf32;
#define MAMBA2SSD_WGMMA_TF32_SHAPE(N, SS_REST, SS_SCALE, RS_REST, RS_SCALE)                                \
  template <>                                                                                               \
  struct MmaTf32<N> {                                                                                       \
    template <bool kAccumulate = true>                                                                      \
    static __device__ __forceinline__ void ss(FragC* d, uint64_t a, uint64_t b) {                          \
      MAMBA2SSD_WGMMA_ASM(MAMBA2SSD_WGMMA_TEXT(N, 8, "tf32", MAMBA2SSD_ACC_REGS_##N, SS_REST, SS_SCALE)        \
                          : MAMBA2SSD_ACC_##N                                                               \
                          : "l"(a), "l"(b), "n"(int{kAccumulate}));                                         \
    }                                                                                                       \
    template <bool kAccumulate = true>                                                                      \
    static __device__ __forceinline__ void rs(FragC* d, const FragA& a, uint64_t b) {                      \
      MAMBA2SSD_WGMMA_ASM(MAMBA2SSD_WGMMA_TEXT(N, 8, "tf32", MAMBA2SSD_ACC_REGS_##N, RS_REST, RS_SCALE)        \
                          : MAMBA2SSD_ACC_##N                                                               \
                          : "r"(a.r[0]), "r"(a.r[1]), "r"(a.r[2]), "r"(a.r[3]), "l"(b), "n"(int{kAccumulate})); \
    }                                                                                                       \
  };
MAMBA2SSD_WGMMA_TF32_SHAPE(32, "%16, %17, p, 1, 1", "%18", "{%16, %17, %18, %19}, %20, p, 1, 1", "%21")
MAMBA2SSD_WGMMA_TF32_SHAPE(64, "%32, %33, p, 1, 1", "%34", "{%32, %33, %34, %35}, %36, p, 1, 1", "%37")

}  // namespace mamba2ssd::tile::wg
