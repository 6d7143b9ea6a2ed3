// Global -> shared staging of 2-d tiles, with zero padding at ragged edges. The fast path is
// cp.async in 16-byte pieces; a tensor whose rows are not 16-byte aligned takes the element path.
#pragma once

#include <cstdint>

#include "cuda/tile/mma.cuh"

namespace mamba2ssd::tile {

__device__ __forceinline__ void cp_async_16(void* smem, const void* gmem, bool valid) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(smem_addr(smem)), "l"(gmem),
               "r"(valid ? 16 : 0));
}
// A 16-byte streaming load (ld.global.cs: data read once) where `valid` holds, zeros where it does
// not: one predicated instruction, not a branch, so that the compiler leaves the address arithmetic
// where it was written rather than sinking a copy of it into a branch per load (which put it behind
// the decode rows kernel's wait for the slot, docs/perf-log.md "Decode d7"). Ordered with the
// thread's other memory accesses ("memory"): a load of what the thread stored earlier sees the store.
__device__ __forceinline__ uint4 load_16_cs_if(const void* gmem, bool valid) {
  uint4 v{0u, 0u, 0u, 0u};
  asm volatile(
      "{\n .reg .pred p;\n setp.ne.b32 p, %5, 0;\n @p ld.global.cs.v4.u32 {%0, %1, %2, %3}, [%4];\n}"
      : "+r"(v.x), "+r"(v.y), "+r"(v.z), "+r"(v.w)
      : "l"(gmem), "r"(static_cast<int>(valid))
      : "memory");
  return v;
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;"); }
template <int kPending>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;" ::"n"(kPending));
}

// A global tile source: row r starts at base + r * row_stride (elements); columns are contiguous.
template <typename T>
struct GlobalRows {
  const T* base;
  int64_t row_stride;
  int valid_rows;  // rows at or past this read as zero
  int valid_cols;  // columns at or past this read as zero (a multiple of 16 elements)
  bool aligned;    // base and row_stride allow 16-byte accesses
};

// Stages a kRows x kCols tile into dst (leading dimension ld) with all kThreads threads of the block.
// The async path must be followed by cp_async_commit / cp_async_wait and a barrier.
template <typename T, int kRows, int kCols, int kThreads>
__device__ __forceinline__ void stage(T* dst, int ld, const GlobalRows<T>& src) {
  constexpr int kVec = 16 / sizeof(T);  // elements per 16-byte piece
  static_assert(kCols % kVec == 0, "tile columns must be whole 16-byte pieces");
  constexpr int kPieces = kRows * (kCols / kVec);
  if (src.aligned) {
    for (int i = threadIdx.x; i < kPieces; i += kThreads) {
      const int r = i / (kCols / kVec), c = (i % (kCols / kVec)) * kVec;
      const bool valid = r < src.valid_rows && c < src.valid_cols;
      cp_async_16(dst + r * ld + c, valid ? src.base + r * src.row_stride + c : src.base, valid);
    }
  } else {
    for (int i = threadIdx.x; i < kRows * kCols; i += kThreads) {
      const int r = i / kCols, c = i % kCols;
      dst[r * ld + c] = r < src.valid_rows && c < src.valid_cols ? src.base[r * src.row_stride + c]
                                                                 : from_float<T>(0.0f);
    }
  }
}

// True if p and a row stride (elements of size `elem`) allow 16-byte accesses.
inline bool aligned16(const void* p, int64_t row_stride, int64_t elem) {
  return reinterpret_cast<uintptr_t>(p) % 16 == 0 && (row_stride * elem) % 16 == 0;
}

}  // namespace mamba2ssd::tile
