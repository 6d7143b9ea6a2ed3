// The wgmma layer (src/cuda/tile/wgmma.cuh) on its own: one warpgroup computes D = A B for a 64 x K
// A and a K x N B, with the operands in each form the Hopper kernels use, in both shared layouts
// (CoreTile with K = 32, SwizzledTile with K = 64), against a host product. Values are small
// multiples of 1/8, so every product and sum is exact in fp32.
//
// Then the layer's fragment moves between registers and those tiles, in both layouts: load_a_trans
// (the registers compared with the m16n8k16 A layout), store_accum_pair / load_accum_pair (stmatrix
// and ldmatrix of two accumulator tiles; sm_90) and scale_rows (against the host's bf16 rounding).
// Last the TF32 forms: transpose_tf32_in_place (against the host's rounding) and MmaTf32 with A
// from registers.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cstdio>
#include <cstring>
#include <random>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <vector>

#include "device_array.h"
#include "cuda/tile/wgmma.cuh"

namespace mamba2ssd::tile::wg {
namespace {

constexpr int kM = 64;
template <bool kSw>
constexpr int kK = kSw ? 64 : 32;
template <bool kSw, int kRows, int kCols>
using TileOf = std::conditional_t<kSw, SwizzledTile<kRows, kCols>, CoreTile<kRows, kCols>>;

// How the operands reach the instruction.
enum Form : int {
  kSharedKMajor = 0,   // A [m][k] and B [n][k] tiles
  kSharedMNMajor = 1,  // A [k][m] and B [k][n] tiles (both transposed)
  kRegsKMajor = 2,     // A from registers, B [n][k]
  kRegsMNMajor = 3,    // A from registers, B [k][n]
};

// The warpgroup's 64 x kN product (warp w: rows 16 w ..) into d, [64][kN] row-major.
template <int kN>
__device__ void store_product(float* d, const FragC (&acc)[kN / 8], int warp) {
#pragma unroll
  for (int j = 0; j < kN / 8; ++j)
#pragma unroll
    for (int e = 0; e < 4; ++e) d[(16 * warp + frag_row(e)) * kN + 8 * j + frag_col(e)] = acc[j].v[e];
}

// a: [kM][kK] row-major, b: [kK][kN] row-major (logical A and B), d: [kM][kN]. An MN-major B sits
// at columns kCol0 .. of its tile (as a warpgroup's half of the state columns does).
template <int kN, int kForm, bool kSw, int kCol0>
__global__ void product_kernel(const __nv_bfloat16* a, const __nv_bfloat16* b, float* d) {
#ifdef MAMBA2SSD_WGMMA
  constexpr int kKk = kK<kSw>;
  constexpr bool kAT = kForm == kSharedMNMajor, kBT = kForm == kSharedMNMajor || kForm == kRegsMNMajor;
  constexpr int kBCols = kSw ? (kCol0 + kN + 63) / 64 * 64 : kCol0 + kN;  // whole swizzle atoms
  using ATile = TileOf<kSw, kAT ? kKk : kM, kAT ? kM : kKk>;
  using BTile = TileOf<kSw, kBT ? kKk : kN, kBT ? kBCols : kKk>;
  __shared__ __align__(1024) __nv_bfloat16 sa[ATile::kElems];
  __shared__ __align__(1024) __nv_bfloat16 sb[BTile::kElems];
  for (int i = threadIdx.x; i < kM * kKk; i += blockDim.x) {
    const int m = i / kKk, k = i % kKk;
    sa[kAT ? ATile::offset(k, m) : ATile::offset(m, k)] = a[i];
  }
  for (int i = threadIdx.x; i < kKk * kN; i += blockDim.x) {
    const int k = i / kN, n = i % kN;
    sb[kBT ? BTile::offset(k, kCol0 + n) : BTile::offset(n, k)] = b[i];
  }
  proxy_fence();
  __syncthreads();

  // The m16n8k16 A fragments of rows 16 warp .., columns 16 ks .. (used by the register forms),
  // built before the fence as the kernels do.
  FragC acc[kN / 8];
  FragA fa[kKk / 16];
  const int warp = threadIdx.x / 32, l = lane_id();
#pragma unroll
  for (int ks = 0; ks < kKk / 16; ++ks) {
    const int r = 16 * warp + l / 4, c = 16 * ks + 2 * (l % 4);
    auto pair = [&](int rr, int cc) {
      return pack2<__nv_bfloat16>(__bfloat162float(a[rr * kKk + cc]), __bfloat162float(a[rr * kKk + cc + 1]));
    };
    fa[ks].r[0] = pair(r, c), fa[ks].r[1] = pair(r + 8, c), fa[ks].r[2] = pair(r, c + 8);
    fa[ks].r[3] = pair(r + 8, c + 8);
  }
  pin(acc), pin(fa);
  fence();
#pragma unroll
  for (int ks = 0; ks < kKk / 16; ++ks) {
    const uint64_t bd = kBT ? mn_major<BTile>(sb, kCol0, ks) : k_major<BTile>(sb, 0, ks);
    if constexpr (kForm == kRegsKMajor || kForm == kRegsMNMajor) {
      Mma<__nv_bfloat16, kN>::template rs<kBT>(acc, fa[ks], bd);
    } else {
      const uint64_t ad = kAT ? mn_major<ATile>(sa, 0, ks) : k_major<ATile>(sa, 0, ks);
      Mma<__nv_bfloat16, kN>::template ss<kAT, kBT>(acc, ad, bd);
    }
  }
  commit();
  wait<0>();
  pin(acc);
  store_product<kN>(d, acc, warp);
#endif
}

template <int kN, int kForm, bool kSw = false, int kCol0 = 0>
void check_form() {
  constexpr int kK = wg::kK<kSw>;
  int dev = 0, major = 0, minor = 0;
  if (cudaGetDevice(&dev) != cudaSuccess) GTEST_SKIP() << "no CUDA device";
  ASSERT_EQ(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev), cudaSuccess);
  ASSERT_EQ(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev), cudaSuccess);
  if (major != 9 || minor != 0) GTEST_SKIP() << "wgmma needs sm_90a; device is sm_" << major << minor;

  std::mt19937 rng(1234 + kN * 10 + kForm + 5 * kSw + kCol0);
  std::uniform_int_distribution<int> val(-8, 8);
  std::vector<__nv_bfloat16> a(kM * kK), b(kK * kN);
  std::vector<float> af(a.size()), bf(b.size());
  for (size_t i = 0; i < a.size(); ++i) af[i] = val(rng) / 8.0f, a[i] = __float2bfloat16(af[i]);
  for (size_t i = 0; i < b.size(); ++i) bf[i] = val(rng) / 8.0f, b[i] = __float2bfloat16(bf[i]);

  __nv_bfloat16 *da, *db;
  float* dd;
  ASSERT_EQ(cudaMalloc(&da, a.size() * 2), cudaSuccess);
  ASSERT_EQ(cudaMalloc(&db, b.size() * 2), cudaSuccess);
  ASSERT_EQ(cudaMalloc(&dd, kM * kN * 4), cudaSuccess);
  ASSERT_EQ(cudaMemcpy(da, a.data(), a.size() * 2, cudaMemcpyHostToDevice), cudaSuccess);
  ASSERT_EQ(cudaMemcpy(db, b.data(), b.size() * 2, cudaMemcpyHostToDevice), cudaSuccess);
  ASSERT_EQ(cudaMemset(dd, 0xFF, kM * kN * 4), cudaSuccess);  // NaN
  product_kernel<kN, kForm, kSw, kCol0><<<1, 128>>>(da, db, dd);
  ASSERT_EQ(cudaGetLastError(), cudaSuccess);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  std::vector<float> d(kM * kN);
  ASSERT_EQ(cudaMemcpy(d.data(), dd, d.size() * 4, cudaMemcpyDeviceToHost), cudaSuccess);
  EXPECT_EQ(cudaFree(da), cudaSuccess);
  EXPECT_EQ(cudaFree(db), cudaSuccess);
  EXPECT_EQ(cudaFree(dd), cudaSuccess);

  int bad = 0;
  for (int m = 0; m < kM; ++m)
    for (int n = 0; n < kN; ++n) {
      float want = 0;
      for (int k = 0; k < kK; ++k) want += af[m * kK + k] * bf[k * kN + n];
      const float got = d[m * kN + n];
      if (!(got == want) && bad++ < 5) std::printf("  d[%d][%d] = %g, want %g\n", m, n, got, want);
    }
  EXPECT_EQ(bad, 0) << "of " << kM * kN << " elements (n " << kN << ", form " << kForm << ", swizzled " << kSw
                    << ", column " << kCol0 << ")";
}

TEST(Wgmma, SharedKMajor) { check_form<128, kSharedKMajor>(), check_form<64, kSharedKMajor>(); }
TEST(Wgmma, SharedMNMajor) { check_form<64, kSharedMNMajor>(), check_form<32, kSharedMNMajor>(); }
TEST(Wgmma, RegistersKMajor) { check_form<64, kRegsKMajor>(); }
TEST(Wgmma, RegistersMNMajor) { check_form<64, kRegsMNMajor>(), check_form<128, kRegsMNMajor>(); }
// The 128-byte swizzle (TMA's layout): as the Hopper kernels read X, B and C, including a
// warpgroup's 32 or 64 state columns that start inside or after the first 64.
TEST(Wgmma, SwizzledKMajor) { check_form<128, kSharedKMajor, true>(), check_form<64, kSharedKMajor, true>(); }
TEST(Wgmma, SwizzledMNMajor) {
  check_form<64, kSharedMNMajor, true>(), check_form<128, kSharedMNMajor, true>();  // 128: two atoms wide
  check_form<32, kSharedMNMajor, true, 32>();
  check_form<64, kSharedMNMajor, true, 64>();
}
TEST(Wgmma, SwizzledRegistersMNMajor) {
  check_form<64, kRegsMNMajor, true>(), check_form<128, kRegsMNMajor, true>();  // 128: two atoms wide
  check_form<32, kRegsMNMajor, true, 32>();
  check_form<64, kRegsMNMajor, true, 64>();
}


// ---- fragments to and from the tiles ----------------------------------------------------------------

using testing::DeviceArray;
using testing::launched;

uint16_t bits(__nv_bfloat16 v) {
  uint16_t u;
  std::memcpy(&u, &v, 2);
  return u;
}

// n random multiples of 1/8 in [-8, 8] as bf16 (exact).
std::vector<__nv_bfloat16> random_tile(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int> d(-64, 64);
  std::vector<__nv_bfloat16> v(n);
  for (auto& x : v) x = __float2bfloat16(d(rng) / 8.0f);
  return v;
}

bool is_sm90(std::string* why) {
  int dev = 0, major = 0, minor = 0;
  CUDA_OK(cudaGetDevice(&dev));
  CUDA_OK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev));
  CUDA_OK(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev));
  *why = "stmatrix needs sm_90; device is sm_" + std::to_string(major) + std::to_string(minor);
  return major == 9 && minor == 0;
}

// A logical [kRows][kCols] row-major matrix into a Tile at Tile::offset (all threads, then a barrier).
template <typename Tile, int kCols>
__device__ void fill_tile(__nv_bfloat16* tile, const __nv_bfloat16* src) {
  for (int i = threadIdx.x; i < Tile::kElems; i += blockDim.x) tile[Tile::offset(i / kCols, i % kCols)] = src[i];
  __syncthreads();
}

// load_a_trans: the A fragment at (m0, k0) of the transpose of a [k][m] Tile of kRows x kCols; one
// warp, frag[4 lane + j] = register j of the lane.
template <typename Tile, int kRows, int kCols>
__global__ void load_a_trans_kernel(const __nv_bfloat16* src, int m0, int k0, uint32_t* frag) {
  __shared__ __align__(1024) __nv_bfloat16 tile[Tile::kElems];
  fill_tile<Tile, kCols>(tile, src);
  const FragA a = load_a_trans<Tile>(tile, m0, k0);
#pragma unroll
  for (int j = 0; j < 4; ++j) frag[4 * lane_id() + j] = a.r[j];
}

template <typename Tile, int kRows, int kCols>
void check_load_a_trans(int m0, int k0) {
  const std::vector<__nv_bfloat16> t = random_tile(kRows * kCols, 500 + m0 + k0);
  DeviceArray<__nv_bfloat16> d_t(t);
  DeviceArray<uint32_t> d_frag(32 * 4);
  d_frag.poison();
  load_a_trans_kernel<Tile, kRows, kCols><<<1, 32>>>(d_t.p, m0, k0, d_frag.p);
  launched();
  const std::vector<uint32_t> frag = d_frag.host();
  // A[m][k] = t[k][m]; register j of lane l holds A rows m0 + l / 4 (+ 8 for j = 1, 3), columns
  // k0 + 2 (l % 4), + 1 (+ 8 for j = 2, 3), the lower column in the low half.
  auto a = [&](int m, int k) { return uint32_t{bits(t[(k0 + k) * kCols + m0 + m])}; };
  int bad = 0;
  for (int l = 0; l < 32; ++l)
    for (int j = 0; j < 4; ++j) {
      const int m = l / 4 + 8 * (j & 1), k = 2 * (l % 4) + 8 * (j >> 1);
      const uint32_t want = a(m, k) | a(m, k + 1) << 16;
      if (frag[4 * l + j] != want && bad++ < 5)
        std::printf("  lane %d register %d = %#010x, want %#010x\n", l, j, frag[4 * l + j], want);
    }
  EXPECT_EQ(bad, 0) << kRows << " x " << kCols << " tile, m0 " << m0 << ", k0 " << k0;
}

TEST(Wgmma, LoadATransCoreTile) {
  check_load_a_trans<CoreTile<32, 64>, 32, 64>(0, 0);
  check_load_a_trans<CoreTile<32, 64>, 32, 64>(48, 16);
  check_load_a_trans<CoreTile<64, 32>, 64, 32>(16, 32);
}
TEST(Wgmma, LoadATransSwizzledTile) {
  check_load_a_trans<SwizzledTile<64, 64>, 64, 64>(0, 0);
  check_load_a_trans<SwizzledTile<64, 64>, 64, 64>(16, 48);
  check_load_a_trans<SwizzledTile<32, 128>, 32, 128>(80, 16);  // the second column block
  check_load_a_trans<SwizzledTile<32, 128>, 32, 128>(48, 0);
}

// store_accum_pair into a poisoned Tile (copied out whole as a row-major matrix), then
// load_accum_pair back (regs_out): one warp, regs[4 lane + j] = register j of the lane.
template <typename Tile, int kRows, int kCols>
__global__ void accum_pair_kernel(int r0, int c0, const uint32_t* regs_in, __nv_bfloat16* out, uint32_t* regs_out) {
#ifdef MAMBA2SSD_WGMMA
  __shared__ __align__(1024) __nv_bfloat16 tile[Tile::kElems];
  for (int i = threadIdx.x; i < Tile::kElems; i += blockDim.x) tile[i] = __ushort_as_bfloat16(0xFFFFu);
  __syncthreads();
  uint32_t r[4];
#pragma unroll
  for (int j = 0; j < 4; ++j) r[j] = regs_in[4 * lane_id() + j];
  store_accum_pair<Tile>(tile, r0, c0, r);
  __syncthreads();
  for (int i = threadIdx.x; i < Tile::kElems; i += blockDim.x) out[i] = tile[Tile::offset(i / kCols, i % kCols)];
  uint32_t back[4];
  load_accum_pair<Tile>(tile, r0, c0, back);
#pragma unroll
  for (int j = 0; j < 4; ++j) regs_out[4 * lane_id() + j] = back[j];
#endif
}

template <typename Tile, int kRows, int kCols>
void check_accum_pair(int r0, int c0) {
  std::string why;
  if (!is_sm90(&why)) GTEST_SKIP() << why;
  const std::vector<__nv_bfloat16> v = random_tile(32 * 8, 600 + r0 + c0);
  std::vector<uint32_t> regs(32 * 4);
  for (int i = 0; i < 32 * 4; ++i) regs[i] = bits(v[2 * i]) | uint32_t{bits(v[2 * i + 1])} << 16;
  DeviceArray<uint32_t> d_regs(regs), d_back(32 * 4);
  DeviceArray<__nv_bfloat16> d_out(kRows * kCols);
  d_back.poison(), d_out.poison();
  accum_pair_kernel<Tile, kRows, kCols><<<1, 32>>>(r0, c0, d_regs.p, d_out.p, d_back.p);
  launched();
  // Register 2 t + h of lane l: accumulator tile t (columns c0 + 8 t ..), elements 2 h and 2 h + 1:
  // row r0 + l / 4 + 8 h, columns c0 + 8 t + 2 (l % 4) (low half) and + 1 (high half).
  std::vector<uint32_t> want(kRows * kCols, 0xFFFFu);
  for (int l = 0; l < 32; ++l)
    for (int t = 0; t < 2; ++t)
      for (int h = 0; h < 2; ++h) {
        const int r = r0 + l / 4 + 8 * h, c = c0 + 8 * t + 2 * (l % 4);
        want[r * kCols + c] = regs[4 * l + 2 * t + h] & 0xFFFFu;
        want[r * kCols + c + 1] = regs[4 * l + 2 * t + h] >> 16;
      }
  const std::vector<__nv_bfloat16> out = d_out.host();
  int bad = 0;
  for (int i = 0; i < kRows * kCols; ++i)
    if (bits(out[i]) != want[i] && bad++ < 5)
      std::printf("  tile (%d, %d) = %#06x, want %#06x\n", i / kCols, i % kCols, bits(out[i]), want[i]);
  EXPECT_EQ(bad, 0) << "store_accum_pair: " << kRows << " x " << kCols << " tile at (" << r0 << ", " << c0 << ")";
  EXPECT_EQ(d_back.host(), regs) << "load_accum_pair did not give back the stored registers";
}

TEST(Wgmma, AccumPairCoreTile) {
  check_accum_pair<CoreTile<64, 64>, 64, 64>(0, 0);
  check_accum_pair<CoreTile<64, 64>, 64, 64>(48, 32);
}
TEST(Wgmma, AccumPairSwizzledTile) {
  check_accum_pair<SwizzledTile<64, 64>, 64, 64>(0, 0);
  check_accum_pair<SwizzledTile<64, 64>, 64, 64>(16, 48);
  check_accum_pair<SwizzledTile<32, 128>, 32, 128>(16, 64);  // the second column block
}

// scale_rows with 128 threads: row r times w[r], in place.
template <typename Tile, int kRows, int kCols>
__global__ void scale_rows_kernel(const __nv_bfloat16* src, const float* w, __nv_bfloat16* out) {
  __shared__ __align__(1024) __nv_bfloat16 tile[Tile::kElems];
  fill_tile<Tile, kCols>(tile, src);
  scale_rows<__nv_bfloat16, Tile, kRows, kCols, 128>(tile, [&](int r) { return w[r]; });
  __syncthreads();
  for (int i = threadIdx.x; i < Tile::kElems; i += blockDim.x) out[i] = tile[Tile::offset(i / kCols, i % kCols)];
}

template <typename Tile, int kRows, int kCols>
void check_scale_rows() {
  const std::vector<__nv_bfloat16> t = random_tile(kRows * kCols, 700 + kRows);
  std::vector<float> w(kRows);
  std::mt19937 rng(701);
  std::uniform_int_distribution<int> d(-32, 32);
  for (auto& x : w) x = d(rng) / 8.0f;  // products of up to 13 bits: many round in bf16
  DeviceArray<__nv_bfloat16> d_t(t), d_out(kRows * kCols);
  DeviceArray<float> d_w(w);
  d_out.poison();
  scale_rows_kernel<Tile, kRows, kCols><<<1, 128>>>(d_t.p, d_w.p, d_out.p);
  launched();
  const std::vector<__nv_bfloat16> out = d_out.host();
  int bad = 0;
  for (int i = 0; i < kRows * kCols; ++i) {
    const uint16_t want = bits(__float2bfloat16_rn(__bfloat162float(t[i]) * w[i / kCols]));
    if (bits(out[i]) != want && bad++ < 5)
      std::printf("  (%d, %d) = %#06x, want %#06x\n", i / kCols, i % kCols, bits(out[i]), want);
  }
  EXPECT_EQ(bad, 0) << "scale_rows: " << kRows << " x " << kCols << " tile";
}

TEST(Wgmma, ScaleRows) {
  check_scale_rows<CoreTile<64, 64>, 64, 64>();
  check_scale_rows<CoreTile<128, 32>, 128, 32>();
  check_scale_rows<SwizzledTile<64, 128>, 64, 128>();
}

// ---- the TF32 forms --------------------------------------------------------------------------------

// The host's TF32 rounding of fp32 (cvt.rna: to nearest, ties away from zero; finite values).
float tf32_rna(float v) {
  uint32_t u;
  std::memcpy(&u, &v, 4);
  u = (u + 0x1000u) & 0xffffe000u;
  std::memcpy(&v, &u, 4);
  return v;
}

// One warpgroup: b, a 64 x 64 fp32 tile [k][n] as TMA brings it, made [n][k] in its place by
// transpose_tf32_in_place (bt_out: the tile as it then holds it, [n][k]); then D = A B by
// MmaTf32<kN>, A from registers (m16n8k8 TF32 layout, rounded), B read K-major from the first kN
// rows of the transposed tile.
template <int kN>
__global__ void tf32_kernel(const float* a, const float* b, float* bt_out, float* d) {
#ifdef MAMBA2SSD_WGMMA
  using Tile = SwizzledTile<64, 64, 4>;
  __shared__ __align__(1024) float sb[Tile::kElems];
  for (int i = threadIdx.x; i < Tile::kElems; i += blockDim.x) sb[Tile::offset(i / 64, i % 64)] = b[i];
  __syncthreads();
  transpose_tf32_in_place<Tile, Tile>(sb, threadIdx.x, 1);
  proxy_fence();
  warpgroup_sync(1);
  for (int i = threadIdx.x; i < Tile::kElems; i += blockDim.x) bt_out[i] = sb[Tile::offset(i / 64, i % 64)];

  FragC acc[kN / 8];
  for (auto& f : acc) f.v[0] = f.v[1] = f.v[2] = f.v[3] = 0.0f;
  FragA fa[8];
  const int warp = threadIdx.x / 32, l = lane_id(), r = 16 * warp + l / 4;
#pragma unroll
  for (int ks = 0; ks < 8; ++ks) {
    const int k = 8 * ks + l % 4;
    fa[ks].r[0] = to_tf32(a[r * 64 + k]), fa[ks].r[1] = to_tf32(a[(r + 8) * 64 + k]);
    fa[ks].r[2] = to_tf32(a[r * 64 + k + 4]), fa[ks].r[3] = to_tf32(a[(r + 8) * 64 + k + 4]);
  }
  pin(acc), pin(fa);
  fence();
#pragma unroll
  for (int ks = 0; ks < 8; ++ks) MmaTf32<kN>::rs(acc, fa[ks], k_major<Tile>(sb, 0, ks));
  commit();
  wait<0>();
  pin(acc);
  store_product<kN>(d, acc, warp);
#endif
}

// b's elements are not all TF32 values (each 1 + q 2^-10 + j 2^-12 in magnitude, j = 2 a tie), so the
// transposed tile must hold them rounded to nearest, ties away (truncation would fail), and the
// product with A (multiples of 1/8) is then exact in fp32 in any order of its sums.
template <int kN>
void check_tf32() {
  std::string why;
  if (!is_sm90(&why)) GTEST_SKIP() << why;
  std::mt19937 rng(900 + kN);
  std::uniform_int_distribution<int> av(-8, 8), q(0, 1023), j(-1, 2), sign(0, 1);
  std::vector<float> a(64 * 64), b(64 * 64);
  for (auto& x : a) x = av(rng) / 8.0f;
  for (auto& x : b) x = (sign(rng) ? -1.0f : 1.0f) * (1.0f + q(rng) * 0x1p-10f + j(rng) * 0x1p-12f);
  DeviceArray<float> d_a(a), d_b(b), d_bt(64 * 64), d_d(64 * kN);
  d_bt.poison(), d_d.poison();
  tf32_kernel<kN><<<1, 128>>>(d_a.p, d_b.p, d_bt.p, d_d.p);
  launched();
  const std::vector<float> bt = d_bt.host(), d = d_d.host();
  int bad_t = 0, bad_d = 0;
  for (int n = 0; n < 64; ++n)
    for (int k = 0; k < 64; ++k) {
      const float want = tf32_rna(b[k * 64 + n]);
      if (!(bt[n * 64 + k] == want) && bad_t++ < 5) std::printf("  b^T[%d][%d] = %a, want %a\n", n, k, bt[n * 64 + k], want);
    }
  for (int m = 0; m < 64; ++m)
    for (int n = 0; n < kN; ++n) {
      float want = 0;
      for (int k = 0; k < 64; ++k) want += a[m * 64 + k] * tf32_rna(b[k * 64 + n]);
      if (!(d[m * kN + n] == want) && bad_d++ < 5) std::printf("  d[%d][%d] = %g, want %g\n", m, n, d[m * kN + n], want);
    }
  EXPECT_EQ(bad_t, 0) << "transpose_tf32_in_place: elements of 64 x 64";
  EXPECT_EQ(bad_d, 0) << "MmaTf32<" << kN << ">: elements of 64 x " << kN;
}

TEST(Wgmma, Tf32TransposeInPlaceAndProduct) { check_tf32<64>(), check_tf32<32>(); }

}  // namespace
}  // namespace mamba2ssd::tile::wg
