// The wgmma layer (src/cuda/tile/wgmma.cuh) on its own: one warpgroup computes D = A B for a 64 x K
// A and a K x N B, with the operands in each form the Hopper kernels use, in both shared layouts
// (CoreTile with K = 32, SwizzledTile with K = 64), against a host product. Values are small
// multiples of 1/8, so every product and sum is exact in fp32.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cstdio>
#include <random>
#include <type_traits>
#include <vector>

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
#pragma unroll
  for (int j = 0; j < kN / 8; ++j)
#pragma unroll
    for (int e = 0; e < 4; ++e) d[(16 * warp + frag_row(e)) * kN + 8 * j + frag_col(e)] = acc[j].v[e];
#endif
}

template <int kN, int kForm, bool kSw = false, int kCol0 = 0>
void check_form() {
  constexpr int kK = wg::kK<kSw>;
  int dev = 0, major = 0, minor = 0;
  if (cudaGetDevice(&dev) != cudaSuccess) GTEST_SKIP() << "no CUDA device";
  cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev);
  cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev);
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
  cudaMemcpy(da, a.data(), a.size() * 2, cudaMemcpyHostToDevice);
  cudaMemcpy(db, b.data(), b.size() * 2, cudaMemcpyHostToDevice);
  cudaMemset(dd, 0xFF, kM * kN * 4);  // NaN
  product_kernel<kN, kForm, kSw, kCol0><<<1, 128>>>(da, db, dd);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  std::vector<float> d(kM * kN);
  cudaMemcpy(d.data(), dd, d.size() * 4, cudaMemcpyDeviceToHost);
  cudaFree(da), cudaFree(db), cudaFree(dd);

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

}  // namespace
}  // namespace mamba2ssd::tile::wg
