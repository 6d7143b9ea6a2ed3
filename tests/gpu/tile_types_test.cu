// The element layer (src/cuda/tile/types.cuh) on its own: to_float / from_float for bf16, fp16 and
// fp32, the 16-bit pairs of the mma operands (pack2 / unpack2, low half first), TF32 rounding
// (to_tf32: nearest, ties away from zero) and the paired / unpaired load_pair and store_pair.
//
// Every device result is compared bit for bit with the same conversion on the host: cuda_bf16.h and
// cuda_fp16.h round to nearest even on the host too, and TF32 rounding is emulated. Inputs are
// random floats of many magnitudes (so rounding happens) plus exact ties, which tell the rounding
// modes apart. Stores go to memory poisoned with NaN, so a store that writes too much or too little
// shows up.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

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
#include "cuda/tile/types.cuh"

namespace mamba2ssd::tile {
namespace {

// ---- host helpers ---------------------------------------------------------------------------------

using testing::DeviceArray;
using testing::launched;
using testing::bits;
using testing::host_from_float;

// The host's version of to_float.
template <typename T>
float host_to_float(T v) {
  if constexpr (std::is_same_v<T, __nv_bfloat16>) return __bfloat162float(v);
  else if constexpr (std::is_same_v<T, __half>) return __half2float(v);
  else return v;
}

float from_bits(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

// Test inputs for a narrowing to a format with `mantissa` fraction bits: random floats with exponents
// in [-max_exp, max_exp], exact ties (half an ulp above a representable value, with an even and an
// odd last kept bit), values just below and above a tie, and exactly representable ones.
std::vector<float> rounding_inputs(int mantissa, int max_exp, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_int_distribution<uint32_t> frac(0, (1u << 23) - 1), sign(0, 1);
  std::uniform_int_distribution<int> expo(-max_exp, max_exp);
  std::vector<float> v;
  const uint32_t drop = 23 - mantissa, half_ulp = 1u << (drop - 1);
  for (int i = 0; i < 1024; ++i) {
    const uint32_t e = static_cast<uint32_t>(expo(rng) + 127), s = sign(rng) << 31;
    const uint32_t kept = frac(rng) & ~((1u << drop) - 1);  // a representable value ...
    v.push_back(from_bits(s | e << 23 | frac(rng)));           // random
    v.push_back(from_bits(s | e << 23 | kept));                // exact
    v.push_back(from_bits(s | e << 23 | kept | half_ulp));     // ... plus an exact tie
    v.push_back(from_bits(s | e << 23 | (kept ^ 1u << drop) | half_ulp));  // the tie, other parity
    v.push_back(from_bits(s | e << 23 | kept | (half_ulp - 1)));           // just below the tie
    v.push_back(from_bits(s | e << 23 | kept | (half_ulp + 1)));           // just above
  }
  for (float x : {0.0f, -0.0f, 1.0f, -1.0f, 0.125f, -3.375f}) v.push_back(x);
  return v;
}

// ---- to_float / from_float --------------------------------------------------------------------------

template <typename T>
__global__ void convert_kernel(const float* in, T* narrow, float* widened, int n) {
  for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) {
    const T t = from_float<T>(in[i]);
    narrow[i] = t;
    widened[i] = to_float(t);
  }
}

template <typename T>
void check_convert(int mantissa, int max_exp) {
  const std::vector<float> in = rounding_inputs(mantissa, max_exp, 11 + mantissa);
  const int n = static_cast<int>(in.size());
  DeviceArray<float> d_in(in), d_wide(in.size());
  DeviceArray<T> d_narrow(in.size());
  d_narrow.poison(), d_wide.poison();
  convert_kernel<T><<<8, 256>>>(d_in.p, d_narrow.p, d_wide.p, n);
  launched();
  const std::vector<T> narrow = d_narrow.host();
  const std::vector<float> wide = d_wide.host();
  int bad = 0;
  for (int i = 0; i < n; ++i) {
    const T want = host_from_float<T>(in[i]);
    const uint32_t want_wide = bits(host_to_float(want));
    if ((bits(narrow[i]) != bits(want) || bits(wide[i]) != want_wide) && bad++ < 5)
      std::printf("  %a: from_float %#x (want %#x), to_float %a (want %a)\n", in[i], bits(narrow[i]), bits(want),
                  wide[i], host_to_float(want));
  }
  EXPECT_EQ(bad, 0) << "of " << n << " conversions";
}

TEST(TileTypes, ConvertBf16) { check_convert<__nv_bfloat16>(7, 60); }
TEST(TileTypes, ConvertFp16) { check_convert<__half>(10, 20); }  // down to 2^-20: subnormal halves too
TEST(TileTypes, ConvertFp32) { check_convert<float>(10, 60); }   // the identity

// ---- pack2 / unpack2 --------------------------------------------------------------------------------

template <typename T>
__global__ void pack_kernel(const float2* in, uint32_t* packed, float2* unpacked, int n) {
  for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) {
    const uint32_t p = pack2<T>(in[i].x, in[i].y);
    packed[i] = p;
    unpacked[i] = unpack2<T>(p);
  }
}

template <typename T>
void check_pack(int mantissa, int max_exp) {
  const std::vector<float> flat = rounding_inputs(mantissa, max_exp, 23 + mantissa);
  std::vector<float2> in(flat.size());
  std::mt19937 rng(5);
  std::uniform_int_distribution<size_t> pick(0, flat.size() - 1);
  for (size_t i = 0; i < in.size(); ++i) in[i] = make_float2(flat[i], flat[pick(rng)]);
  const int n = static_cast<int>(in.size());
  DeviceArray<float2> d_in(in), d_unpacked(in.size());
  DeviceArray<uint32_t> d_packed(in.size());
  d_packed.poison(), d_unpacked.poison();
  pack_kernel<T><<<8, 256>>>(d_in.p, d_packed.p, d_unpacked.p, n);
  launched();
  const std::vector<uint32_t> packed = d_packed.host();
  const std::vector<float2> unpacked = d_unpacked.host();
  int bad = 0;
  for (int i = 0; i < n; ++i) {
    const T lo = host_from_float<T>(in[i].x), hi = host_from_float<T>(in[i].y);
    const uint32_t want = bits(lo) | bits(hi) << 16;  // lo in the low half
    const bool ok = packed[i] == want && bits(unpacked[i].x) == bits(host_to_float(lo)) &&
                    bits(unpacked[i].y) == bits(host_to_float(hi));
    if (!ok && bad++ < 5)
      std::printf("  (%a, %a): pack2 %#010x (want %#010x), unpack2 (%a, %a)\n", in[i].x, in[i].y, packed[i], want,
                  unpacked[i].x, unpacked[i].y);
  }
  EXPECT_EQ(bad, 0) << "of " << n << " pairs";
}

TEST(TileTypes, PackBf16) { check_pack<__nv_bfloat16>(7, 60); }
TEST(TileTypes, PackFp16) { check_pack<__half>(10, 20); }

// ---- to_tf32 ----------------------------------------------------------------------------------------

__global__ void tf32_kernel(const float* in, uint32_t* out, int n) {
  for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) out[i] = to_tf32(in[i]);
}

// TF32 keeps 10 fraction bits; cvt.rna rounds to nearest with ties away from zero, which on the
// sign-magnitude bits is: add half an ulp, drop the low 13 bits.
uint32_t host_tf32(float v) { return (bits(v) + 0x1000u) & 0xFFFFE000u; }

TEST(TileTypes, Tf32RoundsToNearestTiesAway) {
  const std::vector<float> in = rounding_inputs(10, 100, 37);
  const int n = static_cast<int>(in.size());
  DeviceArray<float> d_in(in);
  DeviceArray<uint32_t> d_out(in.size());
  d_out.poison();
  tf32_kernel<<<8, 256>>>(d_in.p, d_out.p, n);
  launched();
  const std::vector<uint32_t> out = d_out.host();
  int bad = 0;
  for (int i = 0; i < n; ++i) {
    // The tensor cores read only the top 19 bits, so only those are compared.
    const uint32_t got = out[i] & 0xFFFFE000u, want = host_tf32(in[i]);
    if (got != want && bad++ < 5) std::printf("  %a: to_tf32 %#010x, want %#010x\n", in[i], out[i], want);
  }
  EXPECT_EQ(bad, 0) << "of " << n << " values";
}

// ---- load_pair / store_pair ------------------------------------------------------------------------

// Pair i: load_pair at element 2i (aligned, paired) and at element 2i + 1 (unaligned, one element at a
// time); store_pair of vals[2i], vals[2i + 1] at element 2i of `paired` and 2i + 1 of `unpaired`.
template <typename T>
__global__ void pair_kernel(const T* src, const float* vals, float* loaded_paired, float* loaded_unpaired,
                            T* paired, T* unpaired, int pairs) {
  for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < pairs; i += gridDim.x * blockDim.x) {
    float v[2];
    load_pair(src + 2 * i, true, v);
    loaded_paired[2 * i] = v[0], loaded_paired[2 * i + 1] = v[1];
    load_pair(src + 2 * i + 1, false, v);
    loaded_unpaired[2 * i] = v[0], loaded_unpaired[2 * i + 1] = v[1];
    const float w[2] = {vals[2 * i], vals[2 * i + 1]};
    store_pair(paired + 2 * i, true, w);
    store_pair(unpaired + 2 * i + 1, false, w);
  }
}

template <typename T>
void check_pairs(int mantissa, int max_exp) {
  std::vector<float> vals = rounding_inputs(mantissa, max_exp, 41 + mantissa);
  if (vals.size() % 2) vals.pop_back();
  const int pairs = static_cast<int>(vals.size() / 2), n = 2 * pairs;
  // The source: n + 1 representable values (multiples of 1/8; the unpaired loads reach element n).
  std::mt19937 rng(3);
  std::uniform_int_distribution<int> eighths(-64, 64);
  std::vector<T> src(n + 1);
  for (auto& s : src) s = host_from_float<T>(eighths(rng) / 8.0f);

  DeviceArray<T> d_src(src), d_paired(n + 2), d_unpaired(n + 2);
  DeviceArray<float> d_vals(vals), d_lp(n), d_lu(n);
  d_paired.poison(), d_unpaired.poison(), d_lp.poison(), d_lu.poison();
  pair_kernel<T><<<8, 256>>>(d_src.p, d_vals.p, d_lp.p, d_lu.p, d_paired.p, d_unpaired.p, pairs);
  launched();
  const std::vector<float> lp = d_lp.host(), lu = d_lu.host();
  const std::vector<T> paired = d_paired.host(), unpaired = d_unpaired.host();

  int bad = 0;
  auto expect = [&](bool ok, const char* what, int i) {
    if (!ok && bad++ < 5) std::printf("  %s, element %d\n", what, i);
  };
  const uint32_t poison = sizeof(T) == 2 ? 0xFFFFu : 0xFFFFFFFFu;
  for (int i = 0; i < n; ++i) {
    expect(bits(lp[i]) == bits(host_to_float(src[i])), "load_pair, paired", i);
    expect(bits(lu[i]) == bits(host_to_float(src[i + 1])), "load_pair, unpaired", i);
    const uint32_t want = bits(host_from_float<T>(vals[i]));
    expect(bits(paired[i]) == want, "store_pair, paired", i);
    expect(bits(unpaired[i + 1]) == want, "store_pair, unpaired", i);
  }
  // Nothing written outside the pairs.
  expect(bits(paired[n]) == poison && bits(paired[n + 1]) == poison, "store_pair, paired: past the end", n);
  expect(bits(unpaired[0]) == poison && bits(unpaired[n + 1]) == poison, "store_pair, unpaired: outside", 0);
  EXPECT_EQ(bad, 0) << "of " << pairs << " pairs";
}

TEST(TileTypes, PairsBf16) { check_pairs<__nv_bfloat16>(7, 60); }
TEST(TileTypes, PairsFp16) { check_pairs<__half>(10, 14); }
TEST(TileTypes, PairsFp32) { check_pairs<float>(10, 60); }

}  // namespace
}  // namespace mamba2ssd::tile
