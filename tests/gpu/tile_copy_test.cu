// Global -> shared staging (src/cuda/tile/copy.cuh) on its own: stage<T, kRows, kCols, kThreads> for
// bf16, fp16 and fp32, on the cp.async path (16-byte aligned rows) and the element path (a base or
// row stride that is not 16-byte aligned, as aligned16 decides), with the whole tile valid and with
// ragged valid_rows / valid_cols, whose elements must arrive as zeros even though the memory behind
// them holds data. Tile shapes whose pieces do not divide evenly among the threads are included, and
// a two-group pipeline checks cp_async_wait<1>.
//
// The shared tile (with a padded leading dimension) is poisoned with NaN first and copied out whole:
// each element of the tile must hold its source value or +0, bit for bit, and the padding columns
// must still hold the poison (stage writes nothing outside the tile).
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <cstdio>
#include <cstring>
#include <random>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <vector>

#include "device_array.h"
#include "cuda/tile/copy.cuh"

namespace mamba2ssd::tile {
namespace {

// ---- host helpers ---------------------------------------------------------------------------------

using testing::DeviceArray;
using testing::launched;
using testing::bits;
using testing::host_from_float;

template <typename T>
constexpr uint32_t kPoison = sizeof(T) == 2 ? 0xFFFFu : 0xFFFFFFFFu;  // NaN


// n random non-zero multiples of 1/8 (a zero read from memory is not mistaken for padding).
template <typename T>
std::vector<T> nonzero_values(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int> mag(1, 64), sign(0, 1);
  std::vector<T> v(n);
  for (auto& x : v) x = host_from_float<T>((sign(rng) ? -1 : 1) * mag(rng) / 8.0f);
  return v;
}

// ---- kernels ----------------------------------------------------------------------------------------

template <typename T, int kCols>
constexpr int kLd = kCols + 16 / static_cast<int>(sizeof(T));  // one 16-byte piece of padding per row

template <typename T>
__device__ T poison() {
  if constexpr (std::is_same_v<T, __nv_bfloat16>) return __ushort_as_bfloat16(0xFFFFu);
  else if constexpr (std::is_same_v<T, __half>) return __ushort_as_half(0xFFFFu);
  else return __int_as_float(-1);
}

// Poisons a shared tile of kRows x kLd, then stages src into it; out gets the whole tile.
template <typename T, int kRows, int kCols, int kThreads>
__global__ void stage_kernel(GlobalRows<T> src, T* out) {
  constexpr int kN = kRows * kLd<T, kCols>;
  __shared__ __align__(16) T tile[kN];
  for (int i = threadIdx.x; i < kN; i += kThreads) tile[i] = poison<T>();
  __syncthreads();
  stage<T, kRows, kCols, kThreads>(tile, kLd<T, kCols>, src);
  cp_async_commit();
  cp_async_wait<0>();
  __syncthreads();
  for (int i = threadIdx.x; i < kN; i += kThreads) out[i] = tile[i];
}

// Two tiles staged as two commit groups: after cp_async_wait<1> (and a barrier) the first must be
// complete, after cp_async_wait<0> the second.
template <typename T, int kRows, int kCols, int kThreads>
__global__ void pipeline_kernel(GlobalRows<T> first, GlobalRows<T> second, T* out_first, T* out_second) {
  constexpr int kN = kRows * kLd<T, kCols>;
  __shared__ __align__(16) T tile[2][kN];
  for (int i = threadIdx.x; i < 2 * kN; i += kThreads) tile[i / kN][i % kN] = poison<T>();
  __syncthreads();
  stage<T, kRows, kCols, kThreads>(tile[0], kLd<T, kCols>, first);
  cp_async_commit();
  stage<T, kRows, kCols, kThreads>(tile[1], kLd<T, kCols>, second);
  cp_async_commit();
  cp_async_wait<1>();
  __syncthreads();
  for (int i = threadIdx.x; i < kN; i += kThreads) out_first[i] = tile[0][i];
  cp_async_wait<0>();
  __syncthreads();
  for (int i = threadIdx.x; i < kN; i += kThreads) out_second[i] = tile[1][i];
}

// ---- checks -------------------------------------------------------------------------------------------

// A source in global memory: `rows` rows of `stride` elements (all of them data), starting `offset`
// elements into the allocation.
template <typename T>
struct Source {
  std::vector<T> host;  // the whole allocation
  DeviceArray<T> dev;
  int offset;
  int64_t stride;
  Source(int n_rows, int64_t row_stride, int elem_offset, uint32_t seed)
      : host(nonzero_values<T>(n_rows * row_stride + elem_offset + 16, seed)),
        dev(host),
        offset(elem_offset),
        stride(row_stride) {}
  GlobalRows<T> rows(int valid_rows, int valid_cols) const {
    const T* base = dev.p + offset;
    return {base, stride, valid_rows, valid_cols, aligned16(base, stride, sizeof(T))};
  }
  T at(int r, int c) const { return host[offset + r * stride + c]; }
};

// The staged tile `got` (kRows x kLd) against the source.
template <typename T, int kRows, int kCols>
void expect_tile(const std::vector<T>& got, const Source<T>& src, int valid_rows, int valid_cols,
                 const std::string& what) {
  int bad = 0;
  for (int r = 0; r < kRows; ++r)
    for (int c = 0; c < kLd<T, kCols>; ++c) {
      uint32_t want = kPoison<T>;                                              // padding: untouched
      if (c < kCols) want = r < valid_rows && c < valid_cols ? bits(src.at(r, c)) : 0u;  // data or +0
      const uint32_t have = bits(got[r * kLd<T, kCols> + c]);
      if (have != want && bad++ < 5) std::printf("  %s: [%d][%d] = %#x, want %#x\n", what.c_str(), r, c, have, want);
    }
  EXPECT_EQ(bad, 0) << what << ": of " << kRows * kLd<T, kCols> << " elements";
}

// Stages a kRows x kCols tile from a source with the given row stride and element offset, for each
// (valid_rows, valid_cols) in `valid`.
template <typename T, int kRows, int kCols, int kThreads = 128>
void check_stage(int64_t row_stride, int elem_offset, bool want_aligned,
                 std::initializer_list<std::pair<int, int>> valid) {
  const Source<T> src(kRows + 2, row_stride, elem_offset, 7 + elem_offset + static_cast<uint32_t>(row_stride));
  ASSERT_EQ(src.rows(kRows, kCols).aligned, want_aligned) << "aligned16, stride " << row_stride << ", offset "
                                                          << elem_offset;
  DeviceArray<T> out(kRows * kLd<T, kCols>);
  for (auto [vr, vc] : valid) {
    out.poison();
    stage_kernel<T, kRows, kCols, kThreads><<<1, kThreads>>>(src.rows(vr, vc), out.p);
    launched();
    expect_tile<T, kRows, kCols>(out.host(), src, vr, vc,
                                 std::string(want_aligned ? "cp.async" : "element") + " path, " + std::to_string(kRows) +
                                     " x " + std::to_string(kCols) + ", valid " + std::to_string(vr) + " x " +
                                     std::to_string(vc));
  }
}

// Each dtype: a 64 x 64 tile and a 40 x 48 one (whose 16-byte pieces and elements do not divide
// among 128 threads), a row stride wider than the tile (a view into a larger tensor).
template <typename T>
void check_aligned() {
  constexpr int kVec = 16 / sizeof(T);
  check_stage<T, 64, 64>(64 + 2 * kVec, 0, true, {{64, 64}, {37, 64}, {64, 48}, {1, 16}, {0, 64}});
  check_stage<T, 40, 48>(48, 0, true, {{40, 48}, {23, 32}, {40, 16}});
  check_stage<T, 40, 48, 96>(48 + kVec, 0, true, {{40, 48}, {39, 32}});  // another thread count
}

// Unaligned rows: a row stride that is not a whole number of 16-byte pieces, or a base one element
// off alignment (the element path).
template <typename T>
void check_unaligned() {
  check_stage<T, 64, 64>(64 + 3, 0, false, {{64, 64}, {37, 48}, {0, 64}});
  check_stage<T, 64, 64>(64 + 16 / sizeof(T), 1, false, {{64, 64}, {50, 32}});
  check_stage<T, 40, 48>(48 + 1, 1, false, {{40, 48}, {23, 32}});
}

template <typename T>
void check_pipeline() {
  constexpr int kRows = 64, kCols = 64;
  const Source<T> a(kRows, kCols, 0, 91), b(kRows, kCols + 16, 0, 92);
  DeviceArray<T> out_a(kRows * kLd<T, kCols>), out_b(kRows * kLd<T, kCols>);
  out_a.poison(), out_b.poison();
  pipeline_kernel<T, kRows, kCols, 128><<<1, 128>>>(a.rows(kRows, kCols), b.rows(45, 48), out_a.p, out_b.p);
  launched();
  expect_tile<T, kRows, kCols>(out_a.host(), a, kRows, kCols, "first group after cp_async_wait<1>");
  expect_tile<T, kRows, kCols>(out_b.host(), b, 45, 48, "second group after cp_async_wait<0>");
}

TEST(TileCopy, StageAlignedBf16) { check_aligned<__nv_bfloat16>(); }
TEST(TileCopy, StageAlignedFp16) { check_aligned<__half>(); }
TEST(TileCopy, StageAlignedFp32) { check_aligned<float>(); }
TEST(TileCopy, StageUnalignedBf16) { check_unaligned<__nv_bfloat16>(); }
TEST(TileCopy, StageUnalignedFp16) { check_unaligned<__half>(); }
TEST(TileCopy, StageUnalignedFp32) { check_unaligned<float>(); }
TEST(TileCopy, PipelineBf16) { check_pipeline<__nv_bfloat16>(); }
TEST(TileCopy, PipelineFp32) { check_pipeline<float>(); }

TEST(TileCopy, Aligned16) {
  alignas(16) static char buf[64];
  EXPECT_TRUE(aligned16(buf, 8, 2));
  EXPECT_TRUE(aligned16(buf + 16, 4, 4));
  EXPECT_FALSE(aligned16(buf + 2, 8, 2));   // base off by one bf16
  EXPECT_FALSE(aligned16(buf, 12, 2));      // a row of 24 bytes
  EXPECT_FALSE(aligned16(buf, 6, 4));       // a row of 24 bytes
}

}  // namespace
}  // namespace mamba2ssd::tile
