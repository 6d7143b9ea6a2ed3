// The warp-level tensor-core layer (src/cuda/tile/mma.cuh) on its own, for bf16, fp16 (m16n8k16,
// fragments through ldmatrix) and fp32 (TF32 m16n8k8, plain shared loads):
//   - every fragment load form: A from [m][k] (load_a) or [k][m] (load_a_trans) storage, B from [n][k]
//     (load_b) or [k][n] (load_b_trans) storage, at non-zero m0 / n0 / k0 and a padded leading
//     dimension, in a 32 x 16 product over several k-steps (four warps, one accumulator tile each);
//   - a_from_accum: two chained products, the accumulators of the first becoming the A operand of
//     the second without passing through memory;
//   - scale_a_cols: an A fragment with its columns scaled (both overloads of the 16-bit form);
//   - Mma3xTf32 (fp32 as three TF32 products): the same layout, and its accuracy against TF32's.
// The host computes the same products. Inputs are small multiples of 1/8, exact in every operand
// type, so the products and sums are exact in fp32 and the comparison is exact. Where the layer
// rounds (an accumulator or a scaled value back to bf16 / fp16 / TF32), the host rounds the same way
// first and the comparison stays exact. Shared tiles are poisoned with NaN outside the data, so a
// fragment that reads a wrong address gives NaN.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <random>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <vector>

#include "device_array.h"
#include "cuda/tile/mma.cuh"

namespace mamba2ssd::tile {
namespace {

// ---- host helpers ---------------------------------------------------------------------------------

using testing::DeviceArray;
using testing::launched;

// v rounded to the operand type T as the layer rounds it: bf16 / fp16 to nearest even (pack2),
// fp32 to TF32 to nearest with ties away (to_tf32).
template <typename T>
float host_round(float v) {
  if constexpr (std::is_same_v<T, __nv_bfloat16>) {
    return __bfloat162float(__float2bfloat16_rn(v));
  } else if constexpr (std::is_same_v<T, __half>) {
    return __half2float(__float2half_rn(v));
  } else {
    uint32_t u;
    std::memcpy(&u, &v, 4);
    u = (u + 0x1000u) & 0xFFFFE000u;
    std::memcpy(&v, &u, 4);
    return v;
  }
}

// n random multiples of 1/8 in [-lim / 8, lim / 8].
std::vector<float> eighths(size_t n, int lim, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int> d(-lim, lim);
  std::vector<float> v(n);
  for (auto& x : v) x = d(rng) / 8.0f;
  return v;
}

// Compares a device result with the host's, exactly; prints the first few differences.
void expect_equal(const std::vector<float>& got, const std::vector<float>& want, int cols, const std::string& what) {
  ASSERT_EQ(got.size(), want.size());
  int bad = 0;
  for (size_t i = 0; i < got.size(); ++i)
    if (!(got[i] == want[i]) && bad++ < 5)
      std::printf("  %s: [%zu][%zu] = %g, want %g\n", what.c_str(), i / cols, i % cols, got[i], want[i]);
  EXPECT_EQ(bad, 0) << what << ": of " << got.size() << " elements";
}

// out[m][n] = sum_k a[m][k] b[k][n].
std::vector<float> host_product(const std::vector<float>& a, const std::vector<float>& b, int m, int k, int n) {
  std::vector<float> out(static_cast<size_t>(m) * n, 0.0f);
  for (int i = 0; i < m; ++i)
    for (int j = 0; j < n; ++j) {
      float s = 0.0f;
      for (int l = 0; l < k; ++l) s += a[i * k + l] * b[l * n + j];
      out[i * n + j] = s;
    }
  return out;
}

// ---- device helpers -------------------------------------------------------------------------------

// Row padding of the shared tiles: 16 bytes, so that ldmatrix rows stay 16-byte aligned.
template <typename T>
constexpr int kPad = 16 / sizeof(T);

// The logical [rows][cols] matrix `src` into a shared tile with leading dimension ld, stored as is
// or transposed ([cols][rows]); the tile's other elements (the padding) are NaN. All threads; ends
// with a barrier.
template <typename T, bool kTrans>
__device__ void fill_tile(T* tile, int ld, const float* src, int rows, int cols) {
  const int stored_rows = kTrans ? cols : rows;
  for (int i = threadIdx.x; i < stored_rows * ld; i += blockDim.x) tile[i] = from_float<T>(__int_as_float(0x7FFFFFFF));
  __syncthreads();
  for (int i = threadIdx.x; i < rows * cols; i += blockDim.x) {
    const int r = i / cols, c = i % cols;
    tile[kTrans ? c * ld + r : r * ld + c] = from_float<T>(src[i]);
  }
  __syncthreads();
}

template <typename T, bool kTrans>
__device__ FragA load_a(const T* s, int ld, int m0, int k0) {
  if constexpr (kTrans) return Mma<T>::load_a_trans(s, ld, m0, k0);
  else return Mma<T>::load_a(s, ld, m0, k0);
}
template <typename T, bool kTrans>
__device__ FragB load_b(const T* s, int ld, int n0, int k0) {
  if constexpr (kTrans) return Mma<T>::load_b_trans(s, ld, n0, k0);
  else return Mma<T>::load_b(s, ld, n0, k0);
}

// The accumulator tile c (rows m0 .., columns n0 ..) into d (row-major, `cols` columns).
__device__ void store_accum(float* d, int cols, int m0, int n0, const FragC& c) {
#pragma unroll
  for (int e = 0; e < 4; ++e) d[(m0 + frag_row(e)) * cols + n0 + frag_col(e)] = c.v[e];
}

// ---- fragment loads ----------------------------------------------------------------------------------

constexpr int kM = 32, kN = 16, kK = 32;  // 2 x 2 accumulator tiles, 2 (TF32: 4) k-steps

// d[kM][kN] = a[kM][kK] b[kK][kN], A stored [m][k] or [k][m] (kAT), B stored [n][k] or [k][n] (kBT).
// Four warps: warp w computes the tile at m0 = 16 (w / 2), n0 = 8 (w % 2).
template <typename T, bool kAT, bool kBT>
__global__ void load_forms_kernel(const float* a, const float* b, float* d) {
  constexpr int kLda = (kAT ? kM : kK) + kPad<T>, kLdb = (kBT ? kN : kK) + kPad<T>;
  __shared__ __align__(16) T sa[(kAT ? kK : kM) * kLda];
  __shared__ __align__(16) T sb[(kBT ? kK : kN) * kLdb];
  fill_tile<T, kAT>(sa, kLda, a, kM, kK);
  // B's logical matrix is [k][n]: stored as is for [k][n] (kBT) and transposed for [n][k].
  fill_tile<T, !kBT>(sb, kLdb, b, kK, kN);
  const int m0 = 16 * (warp_id() / 2), n0 = 8 * (warp_id() % 2);
  FragC c;
  for (int k0 = 0; k0 < kK; k0 += Mma<T>::kK)
    Mma<T>::mma(c, load_a<T, kAT>(sa, kLda, m0, k0), load_b<T, kBT>(sb, kLdb, n0, k0));
  store_accum(d, kN, m0, n0, c);
}

template <typename T, bool kAT, bool kBT>
void check_load_forms() {
  const std::vector<float> a = eighths(kM * kK, 8, 100 + 2 * kAT + kBT), b = eighths(kK * kN, 8, 200 + 2 * kAT + kBT);
  DeviceArray<float> da(a), db(b), dd(kM * kN);
  dd.poison();
  load_forms_kernel<T, kAT, kBT><<<1, 128>>>(da.p, db.p, dd.p);
  launched();
  expect_equal(dd.host(), host_product(a, b, kM, kK, kN), kN,
               std::string(kAT ? "load_a_trans" : "load_a") + " x " + (kBT ? "load_b_trans" : "load_b"));
}

template <typename T>
void check_all_load_forms() {
  check_load_forms<T, false, false>();
  check_load_forms<T, false, true>();
  check_load_forms<T, true, false>();
  check_load_forms<T, true, true>();
}

TEST(TileMma, LoadFormsBf16) { check_all_load_forms<__nv_bfloat16>(); }
TEST(TileMma, LoadFormsFp16) { check_all_load_forms<__half>(); }
TEST(TileMma, LoadFormsTf32) { check_all_load_forms<float>(); }

// ---- a_from_accum: two chained products ---------------------------------------------------------------

// P[16][kP] = A[16][kK] B[kK][kP] in kP / 8 accumulator tiles, then O[16][8] = P E[kP][8] with P's
// k-blocks taken from the accumulators by a_from_accum (kP = two k-steps of the second product).
template <typename T>
constexpr int kChainP = 2 * Mma<T>::kK;

template <typename T>
__global__ void chain_kernel(const float* a, const float* b, const float* e, float* o) {
  constexpr int kKa = Mma<T>::kK, kP = kChainP<T>;
  constexpr int kLda = kKa + kPad<T>, kLdb = kP + kPad<T>, kLde = 8 + kPad<T>;
  __shared__ __align__(16) T sa[16 * kLda];
  __shared__ __align__(16) T sb[kKa * kLdb];
  __shared__ __align__(16) T se[kP * kLde];
  fill_tile<T, false>(sa, kLda, a, 16, kKa);  // [m][k]
  fill_tile<T, false>(sb, kLdb, b, kKa, kP);  // [k][n]
  fill_tile<T, false>(se, kLde, e, kP, 8);    // [k][n]
  FragC p[kP / 8];
  const FragA fa = Mma<T>::load_a(sa, kLda, 0, 0);
#pragma unroll
  for (int j = 0; j < kP / 8; ++j) Mma<T>::mma(p[j], fa, Mma<T>::load_b_trans(sb, kLdb, 8 * j, 0));
  FragC out;
#pragma unroll
  for (int kb = 0; kb < 2; ++kb) Mma<T>::mma(out, a_from_accum<T>(p, kb), Mma<T>::load_b_trans(se, kLde, 0, kb * kKa));
  store_accum(o, 8, 0, 0, out);
}

template <typename T>
void check_chain() {
  constexpr int kKa = Mma<T>::kK, kP = kChainP<T>;
  // P's elements are multiples of 1/64 up to kKa in size: not all of them fit a bf16, so they round.
  const std::vector<float> a = eighths(16 * kKa, 8, 300), b = eighths(kKa * kP, 8, 301), e = eighths(kP * 8, 8, 302);
  std::vector<float> p = host_product(a, b, 16, kKa, kP);
  for (float& x : p) x = host_round<T>(x);  // the accumulator as the next A operand
  DeviceArray<float> da(a), db(b), de(e), dout(16 * 8);
  dout.poison();
  chain_kernel<T><<<1, 32>>>(da.p, db.p, de.p, dout.p);
  launched();
  expect_equal(dout.host(), host_product(p, e, 16, kP, 8), 8, "a_from_accum chain");
}

TEST(TileMma, AFromAccumBf16) { check_chain<__nv_bfloat16>(); }
TEST(TileMma, AFromAccumFp16) { check_chain<__half>(); }
TEST(TileMma, AFromAccumTf32) { check_chain<float>(); }

// ---- scale_a_cols --------------------------------------------------------------------------------------

// O[16][8] = (A diag(w)) B over two k-steps, w applied to the A fragments with scale_a_cols: through
// the weight function (w of the fragment's local column), or (kExplicit, 16-bit types) with the
// thread's four weights given.
template <typename T, bool kExplicit>
__global__ void scale_kernel(const float* a, const float* w, const float* b, float* o) {
  constexpr int kKs = 2 * Mma<T>::kK, kLda = kKs + kPad<T>, kLdb = 8 + kPad<T>;
  __shared__ __align__(16) T sa[16 * kLda];
  __shared__ __align__(16) T sb[kKs * kLdb];
  fill_tile<T, false>(sa, kLda, a, 16, kKs);
  fill_tile<T, false>(sb, kLdb, b, kKs, 8);
  FragC out;
  for (int k0 = 0; k0 < kKs; k0 += Mma<T>::kK) {
    FragA fa = Mma<T>::load_a(sa, kLda, 0, k0);
    if constexpr (kExplicit) {
      const int q = lane_id() & 3;
      Mma<T>::scale_a_cols(fa, w[k0 + 2 * q], w[k0 + 2 * q + 1], w[k0 + 2 * q + 8], w[k0 + 2 * q + 9]);
    } else {
      Mma<T>::scale_a_cols(fa, [&](int k) { return w[k0 + k]; });
    }
    Mma<T>::mma(out, fa, Mma<T>::load_b_trans(sb, kLdb, 0, k0));
  }
  store_accum(o, 8, 0, 0, out);
}

template <typename T, bool kExplicit>
void check_scale() {
  constexpr int kKs = 2 * Mma<T>::kK;
  // Weights are multiples of 1/8 up to 4: a scaled element may need 10 bits and round in bf16.
  const std::vector<float> a = eighths(16 * kKs, 8, 400), w = eighths(kKs, 32, 401), b = eighths(kKs * 8, 8, 402);
  std::vector<float> scaled(a.size());
  for (int m = 0; m < 16; ++m)
    for (int k = 0; k < kKs; ++k) scaled[m * kKs + k] = host_round<T>(a[m * kKs + k] * w[k]);
  DeviceArray<float> da(a), dw(w), db(b), dout(16 * 8);
  dout.poison();
  scale_kernel<T, kExplicit><<<1, 32>>>(da.p, dw.p, db.p, dout.p);
  launched();
  expect_equal(dout.host(), host_product(scaled, b, 16, kKs, 8), 8,
               kExplicit ? "scale_a_cols (four weights)" : "scale_a_cols (weight function)");
}

TEST(TileMma, ScaleAColsBf16) { check_scale<__nv_bfloat16, false>(), check_scale<__nv_bfloat16, true>(); }
TEST(TileMma, ScaleAColsFp16) { check_scale<__half, false>(), check_scale<__half, true>(); }
TEST(TileMma, ScaleAColsTf32) { check_scale<float, false>(); }

// ---- Mma3xTf32: fp32 operands as three TF32 products ----------------------------------------------

// One warp: D[16][8] = (A diag(w)) B over two k-steps (A stored [m][k] or, kAT, [k][m]; B stored
// [n][k] or, kBT, [k][n]; w applied with scale_a_cols), then O[16][8] = D E[8][8] with D taken from
// its accumulator by a_from_accum. M: Mma<float> or Mma3xTf32 (the same fragment layout).
template <typename M, bool kAT, bool kBT>
__global__ void fp32_products_kernel(const float* a, const float* w, const float* b, const float* e, float* d,
                                     float* o) {
  constexpr int kKs = 16, kLda = (kAT ? 16 : kKs) + 4, kLdb = (kBT ? 8 : kKs) + 4, kLde = 8 + 4;
  __shared__ float sa[(kAT ? kKs : 16) * kLda];
  __shared__ float sb[(kBT ? kKs : 8) * kLdb];
  __shared__ float se[8 * kLde];
  fill_tile<float, kAT>(sa, kLda, a, 16, kKs);
  fill_tile<float, !kBT>(sb, kLdb, b, kKs, 8);
  fill_tile<float, false>(se, kLde, e, 8, 8);
  FragC acc;
  for (int k0 = 0; k0 < kKs; k0 += M::kK) {
    FragA fa = kAT ? M::load_a_trans(sa, kLda, 0, k0) : M::load_a(sa, kLda, 0, k0);
    M::scale_a_cols(fa, [&](int k) { return w[k0 + k]; });
    M::mma(acc, fa, kBT ? M::load_b_trans(sb, kLdb, 0, k0) : M::load_b(sb, kLdb, 0, k0));
  }
  store_accum(d, 8, 0, 0, acc);
  FragC out;
  M::mma(out, M::a_from_accum(acc), M::load_b_trans(se, kLde, 0, 0));
  store_accum(o, 8, 0, 0, out);
}

struct Fp32Products {
  std::vector<float> d, o;
};
template <typename M, bool kAT, bool kBT>
Fp32Products run_fp32_products(const std::vector<float>& a, const std::vector<float>& w, const std::vector<float>& b,
                               const std::vector<float>& e) {
  DeviceArray<float> da(a), dw(w), db(b), de(e), dd(16 * 8), dout(16 * 8);
  dd.poison(), dout.poison();
  fp32_products_kernel<M, kAT, kBT><<<1, 32>>>(da.p, dw.p, db.p, de.p, dd.p, dout.p);
  launched();
  return {dd.host(), dout.host()};
}

// The largest error of got against the exact product of x [16][k] and y [k][8], each element's
// error over the sum of its terms' magnitudes (so cancellation does not inflate it).
double worst_error(const std::vector<float>& got, const std::vector<double>& x, const std::vector<double>& y, int k) {
  double worst = 0.0;
  for (int m = 0; m < 16; ++m)
    for (int n = 0; n < 8; ++n) {
      double sum = 0.0, mag = 0.0;
      for (int l = 0; l < k; ++l) sum += x[m * k + l] * y[l * 8 + n], mag += std::fabs(x[m * k + l] * y[l * 8 + n]);
      worst = std::max(worst, std::fabs(got[m * 8 + n] - sum) / mag);
    }
  return worst;
}

// On inputs exact in TF32 (multiples of 1/8, small parts zero) every load form, scale_a_cols and
// a_from_accum give exactly Mma<float>'s (exact) products: the layout is the same.
template <bool kAT, bool kBT>
void check_3xtf32_forms() {
  const std::vector<float> a = eighths(16 * 16, 8, 500), w = eighths(16, 8, 501), b = eighths(16 * 8, 8, 502),
                           e = eighths(8 * 8, 8, 503);
  std::vector<float> scaled(a.size());
  for (int m = 0; m < 16; ++m)
    for (int k = 0; k < 16; ++k) scaled[m * 16 + k] = a[m * 16 + k] * w[k];
  const std::vector<float> d = host_product(scaled, b, 16, 16, 8);
  const Fp32Products got = run_fp32_products<Mma3xTf32, kAT, kBT>(a, w, b, e);
  const std::string form = std::string(kAT ? "load_a_trans" : "load_a") + " x " + (kBT ? "load_b_trans" : "load_b");
  expect_equal(got.d, d, 8, "3xTF32 " + form);
  expect_equal(got.o, host_product(d, e, 16, 8, 8), 8, "3xTF32 a_from_accum after " + form);
}

TEST(TileMma, Fp32x3LoadFormsScaleAndChainMatchTf32Layout) {
  check_3xtf32_forms<false, false>();
  check_3xtf32_forms<false, true>();
  check_3xtf32_forms<true, false>();
  check_3xtf32_forms<true, true>();
}

// On fp32 inputs with full mantissas, Mma3xTf32 is within a few 2^-24 of the exact products (relative
// to the terms), where Mma<float> (TF32) is off by about 2^-11: the mode is more accurate, by far.
TEST(TileMma, Fp32x3IsNearFp32WhereTf32IsNot) {
  std::mt19937 rng(600);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  auto random = [&](size_t n) {
    std::vector<float> v(n);
    for (float& x : v) x = u(rng);
    return v;
  };
  const std::vector<float> a = random(16 * 16), w = random(16), b = random(16 * 8), e = random(8 * 8);
  // The exact D from the fp32 scaled A (the layer scales in fp32 before it splits), then O from D.
  std::vector<double> scaled(a.size()), bd(b.begin(), b.end()), ed(e.begin(), e.end());
  for (int m = 0; m < 16; ++m)
    for (int k = 0; k < 16; ++k) scaled[m * 16 + k] = static_cast<double>(a[m * 16 + k] * w[k]);
  for (bool three : {false, true}) {
    const Fp32Products got = three ? run_fp32_products<Mma3xTf32, false, true>(a, w, b, e)
                                   : run_fp32_products<Mma<float>, false, true>(a, w, b, e);
    const std::vector<double> dd(got.d.begin(), got.d.end());
    const double err_d = worst_error(got.d, scaled, bd, 16), err_o = worst_error(got.o, dd, ed, 8);
    std::printf("  %s: D %.2e, O %.2e (relative to the terms)\n", three ? "3xTF32" : "TF32  ", err_d, err_o);
    if (three) {
      EXPECT_LT(err_d, 2e-6);
      EXPECT_LT(err_o, 2e-6);
    } else {
      EXPECT_GT(err_d, 2e-5);
      EXPECT_GT(err_o, 2e-5);
    }
  }
}

}  // namespace
}  // namespace mamba2ssd::tile
