// Warp-level tensor-core tiles: fragments of mma.sync m16n8k16 (bf16, fp16) and m16n8k8 (TF32, and
// fp32 as 3xTF32), fragment loads from shared tiles, and the accumulator -> operand reuse of two chained products.
//
// Conventions. A shared tile is row-major with a padded leading dimension `ld` (elements).
//   A operand (m16 x k): load_a from [m][k] storage, load_a_trans from [k][m] storage.
//   B operand (k x n8):  load_b from [n][k] storage, load_b_trans from [k][n] storage.
// A thread's accumulator FragC holds (row g, col 2q), (g, 2q+1), (g+8, 2q), (g+8, 2q+1) of its
// 16 x 8 tile, with g = lane / 4 and q = lane % 4 (the PTX layout).
#pragma once

#include <cstdint>

#include "cuda/tile/types.cuh"

namespace mamba2ssd::tile {

struct FragA {
  uint32_t r[4];
};
struct FragB {
  uint32_t r[2];
};
struct FragC {
  float v[4] = {0.0f, 0.0f, 0.0f, 0.0f};
};

// The padding of a shared tile's rows that these fragment loads read: 16 bytes (rows stay 16-byte
// aligned for cp.async). 16-bit rows (8 elements): ldmatrix's eight rows fall on distinct banks. fp32
// rows (4 elements): load_a's and load_b's eight rows g start 4 g banks apart, so a warp's 32 loads
// hit 32 banks; the transposed loads are then 2-way, the cheaper trade (8 elements would make the
// row loads 2-way instead, and take 16 more bytes a row).
template <typename T>
inline constexpr int kRowPad = 16 / static_cast<int>(sizeof(T));

__device__ __forceinline__ int lane_id() { return threadIdx.x & 31; }
__device__ __forceinline__ int warp_id() { return threadIdx.x >> 5; }
// v, the same on every lane of the warp, made so for ptxas too (broadcast from lane 0): what is
// built from it, such as a wgmma descriptor, then stays in uniform registers, where from threadIdx
// alone each use takes a move (R2UR; docs/perf-log.md, "Backward b12").
__device__ __forceinline__ int warp_uniform(int v) { return __shfl_sync(0xffffffffu, v, 0); }

// Row and column (within a 16 x 8 accumulator tile) of element e of this thread's FragC.
__device__ __forceinline__ int frag_row(int e) { return (lane_id() >> 2) + (e >> 1) * 8; }
__device__ __forceinline__ int frag_col(int e) { return (lane_id() & 3) * 2 + (e & 1); }

__device__ __forceinline__ uint32_t smem_addr(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// ldmatrix: four 8x8 16-bit matrices, each row address given by one group of 8 lanes.
__device__ __forceinline__ void ldmatrix_x4(uint32_t (&r)[4], const void* row_addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_addr(row_addr)));
}
__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t (&r)[4], const void* row_addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_addr(row_addr)));
}
// The inverse of ldmatrix_x4: four 8 x 8 matrices of 16-bit pairs to shared memory.
__device__ __forceinline__ void stmatrix_x4(void* row_addr, const uint32_t (&r)[4]) {
  asm volatile("stmatrix.sync.aligned.m8n8.x4.shared.b16 [%0], {%1,%2,%3,%4};" ::"r"(smem_addr(row_addr)), "r"(r[0]),
               "r"(r[1]), "r"(r[2]), "r"(r[3])
               : "memory");
}
__device__ __forceinline__ void ldmatrix_x2(uint32_t (&r)[2], const void* row_addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x2.shared.b16 {%0,%1}, [%2];"
               : "=r"(r[0]), "=r"(r[1])
               : "r"(smem_addr(row_addr)));
}
__device__ __forceinline__ void ldmatrix_x2_trans(uint32_t (&r)[2], const void* row_addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x2.trans.shared.b16 {%0,%1}, [%2];"
               : "=r"(r[0]), "=r"(r[1])
               : "r"(smem_addr(row_addr)));
}

// Mma<T>: the tensor-core product for storage type T. kK is the k extent of one instruction.
template <typename T>
struct Mma;

// 16-bit operands: m16n8k16, fragments through ldmatrix.
template <typename T>
struct Mma16 {
  static constexpr int kK = 16;

  // [m][k] storage: matrices (m0-7,k0-7) (m8-15,k0-7) (m0-7,k8-15) (m8-15,k8-15) in lane groups.
  static __device__ FragA load_a(const T* s, int ld, int m0, int k0) {
    const int l = lane_id();
    FragA a;
    ldmatrix_x4(a.r, s + (m0 + (l & 15)) * ld + k0 + (l >> 4) * 8);
    return a;
  }
  // [k][m] storage: the same four matrices read transposed.
  static __device__ FragA load_a_trans(const T* s, int ld, int m0, int k0) {
    const int l = lane_id();
    FragA a;
    ldmatrix_x4_trans(a.r, s + (k0 + (l & 7) + (l >> 4) * 8) * ld + m0 + ((l >> 3) & 1) * 8);
    return a;
  }
  // [n][k] storage: matrices (n0-7, k0-7) (n0-7, k8-15).
  static __device__ FragB load_b(const T* s, int ld, int n0, int k0) {
    const int l = lane_id();
    FragB b;
    ldmatrix_x2(b.r, s + (n0 + (l & 7)) * ld + k0 + ((l >> 3) & 1) * 8);
    return b;
  }
  // [k][n] storage: rows k0..k0+15, read transposed.
  static __device__ FragB load_b_trans(const T* s, int ld, int n0, int k0) {
    const int l = lane_id();
    FragB b;
    ldmatrix_x2_trans(b.r, s + (k0 + (l & 15)) * ld + n0);
    return b;
  }
  // Multiplies column k of A (k local to the fragment) by w(k): a holds columns 2q, 2q+1 (regs 0, 1)
  // and 2q+8, 2q+9 (regs 2, 3).
  template <typename W>
  static __device__ void scale_a_cols(FragA& a, W w) {
    const int q = lane_id() & 3;
    scale_a_cols(a, w(2 * q), w(2 * q + 1), w(2 * q + 8), w(2 * q + 9));
  }
  // The same with the thread's four weights given: columns 2q, 2q + 1, 2q + 8, 2q + 9.
  static __device__ void scale_a_cols(FragA& a, float w0, float w1, float w8, float w9) {
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const float2 v = unpack2<T>(a.r[i]);
      a.r[i] = i < 2 ? pack2<T>(v.x * w0, v.y * w1) : pack2<T>(v.x * w8, v.y * w9);
    }
  }
  // The A operand of the next product from two accumulator tiles (columns 0-7 and 8-15 of k):
  // the accumulator layout of m16n8 is the A layout of m16k16, so no data moves between lanes.
  static __device__ FragA a_from_accum(const FragC& lo, const FragC& hi) {
    FragA a;
    a.r[0] = pack2<T>(lo.v[0], lo.v[1]);
    a.r[1] = pack2<T>(lo.v[2], lo.v[3]);
    a.r[2] = pack2<T>(hi.v[0], hi.v[1]);
    a.r[3] = pack2<T>(hi.v[2], hi.v[3]);
    return a;
  }
};

template <>
struct Mma<__nv_bfloat16> : Mma16<__nv_bfloat16> {
  static __device__ void mma(FragC& c, const FragA& a, const FragB& b) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%2,%3};"
        : "+f"(c.v[0]), "+f"(c.v[1]), "+f"(c.v[2]), "+f"(c.v[3])
        : "r"(a.r[0]), "r"(a.r[1]), "r"(a.r[2]), "r"(a.r[3]), "r"(b.r[0]), "r"(b.r[1]));
  }
};

template <>
struct Mma<__half> : Mma16<__half> {
  static __device__ void mma(FragC& c, const FragA& a, const FragB& b) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%2,%3};"
        : "+f"(c.v[0]), "+f"(c.v[1]), "+f"(c.v[2]), "+f"(c.v[3])
        : "r"(a.r[0]), "r"(a.r[1]), "r"(a.r[2]), "r"(a.r[3]), "r"(b.r[0]), "r"(b.r[1]));
  }
};

// fp32 storage: m16n8k8 fragments. A holds (g, q) (g+8, q) (g, q+4) (g+8, q+4); B holds (k=q, n=g)
// and (k=q+4, n=g). No ldmatrix for 32-bit elements: plain shared loads. Each element enters a
// fragment through Cvt::of: rounded to TF32 (Mma<float>) or kept in fp32 (Mma3xTf32).
template <typename Cvt>
struct Fp32Frags {
  static constexpr int kK = 8;

  static __device__ FragA load_a(const float* s, int ld, int m0, int k0) {
    const int g = lane_id() >> 2, q = lane_id() & 3;
    const float* p = s + (m0 + g) * ld + k0 + q;
    return {{Cvt::of(p[0]), Cvt::of(p[8 * ld]), Cvt::of(p[4]), Cvt::of(p[8 * ld + 4])}};
  }
  static __device__ FragA load_a_trans(const float* s, int ld, int m0, int k0) {
    const int g = lane_id() >> 2, q = lane_id() & 3;
    const float* p = s + (k0 + q) * ld + m0 + g;
    return {{Cvt::of(p[0]), Cvt::of(p[8]), Cvt::of(p[4 * ld]), Cvt::of(p[4 * ld + 8])}};
  }
  static __device__ FragB load_b(const float* s, int ld, int n0, int k0) {
    const int g = lane_id() >> 2, q = lane_id() & 3;
    const float* p = s + (n0 + g) * ld + k0 + q;
    return {{Cvt::of(p[0]), Cvt::of(p[4])}};
  }
  // A holds columns q (regs 0, 1) and q + 4 (regs 2, 3).
  template <typename W>
  static __device__ void scale_a_cols(FragA& a, W w) {
    const int q = lane_id() & 3;
    const float w0 = w(q), w4 = w(q + 4);
    a.r[0] = Cvt::of(__uint_as_float(a.r[0]) * w0);
    a.r[1] = Cvt::of(__uint_as_float(a.r[1]) * w0);
    a.r[2] = Cvt::of(__uint_as_float(a.r[2]) * w4);
    a.r[3] = Cvt::of(__uint_as_float(a.r[3]) * w4);
  }
  static __device__ FragB load_b_trans(const float* s, int ld, int n0, int k0) {
    const int g = lane_id() >> 2, q = lane_id() & 3;
    const float* p = s + (k0 + q) * ld + n0 + g;
    return {{Cvt::of(p[0]), Cvt::of(p[4 * ld])}};
  }
  // Accumulator (g, 2q..2q+1) -> A (g, q), (g, q+4): the values sit in other lanes of the same
  // row group, so they are fetched with shuffles.
  static __device__ FragA a_from_accum(const FragC& c) {
    const int l = lane_id(), q = l & 3, base = l & ~3;
    const int src_lo = base + (q >> 1), src_hi = base + 2 + (q >> 1);
    const bool odd = q & 1;
    float v[4];
    for (int half = 0; half < 2; ++half) {  // rows g (elements 0,1) and g+8 (elements 2,3)
      const float e0 = c.v[2 * half], e1 = c.v[2 * half + 1];
      const float lo0 = __shfl_sync(0xffffffffu, e0, src_lo), lo1 = __shfl_sync(0xffffffffu, e1, src_lo);
      const float hi0 = __shfl_sync(0xffffffffu, e0, src_hi), hi1 = __shfl_sync(0xffffffffu, e1, src_hi);
      v[half] = odd ? lo1 : lo0;       // column q
      v[half + 2] = odd ? hi1 : hi0;   // column q + 4
    }
    return {{Cvt::of(v[0]), Cvt::of(v[1]), Cvt::of(v[2]), Cvt::of(v[3])}};
  }
};

struct RoundToTf32 {
  static __device__ __forceinline__ uint32_t of(float v) { return to_tf32(v); }
};
struct KeepFp32 {
  static __device__ __forceinline__ uint32_t of(float v) { return __float_as_uint(v); }
};

// fp32 operands as TF32 (ForwardParams::fp32_math kTf32): rounded as they are loaded.
template <>
struct Mma<float> : Fp32Frags<RoundToTf32> {
  static __device__ void mma(FragC& c, const FragA& a, const FragB& b) {
    asm volatile(
        "mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%2,%3};"
        : "+f"(c.v[0]), "+f"(c.v[1]), "+f"(c.v[2]), "+f"(c.v[3])
        : "r"(a.r[0]), "r"(a.r[1]), "r"(a.r[2]), "r"(a.r[3]), "r"(b.r[0]), "r"(b.r[1]));
  }
};

// fp32 operands as 3xTF32 (ForwardParams::fp32_math kAccurate): the fragments hold the fp32 values
// themselves (Mma<float>'s layout), and each product splits them. An operand a becomes
// big = tf32(a) and small = tf32(a - big): |a - big| <= 2^-11 |a|, so big + small carries a to
// about 2^-22 of it. a b is taken as big_a big_b + big_a small_b + small_a big_b on the TF32 tensor
// cores, accumulated in fp32: the dropped small_a small_b and what big + small leaves of a and b
// are each about 2^-22 of the product, so the result is close to fp32 FMA's (TF32 alone: 2^-11).
// The small terms go first, so that the large one meets an accumulator that holds them already.
struct Mma3xTf32 : Fp32Frags<KeepFp32> {
  static __device__ void mma(FragC& c, const FragA& a, const FragB& b) {
    FragA a_big, a_small;
    FragB b_big, b_small;
#pragma unroll
    for (int i = 0; i < 4; ++i) split(a.r[i], a_big.r[i], a_small.r[i]);
#pragma unroll
    for (int i = 0; i < 2; ++i) split(b.r[i], b_big.r[i], b_small.r[i]);
    Mma<float>::mma(c, a_small, b_big);
    Mma<float>::mma(c, a_big, b_small);
    Mma<float>::mma(c, a_big, b_big);
  }

 private:
  // v (fp32 bits) = big + small, both TF32. The mask makes big exactly the value the tensor cores
  // read (they ignore the low 13 bits), so that v - big is the part big leaves out.
  static __device__ __forceinline__ void split(uint32_t v, uint32_t& big, uint32_t& small) {
    big = to_tf32(__uint_as_float(v)) & 0xffffe000u;
    small = to_tf32(__uint_as_float(v) - __uint_as_float(big));
  }
};

// The product a kernel runs for storage type T: Mma<T>, or Mma3xTf32 for fp32 with k3xTf32 (a
// compile-time choice: the TF32 kernels' code does not change). 16-bit types ignore k3xTf32.
template <typename T, bool k3xTf32>
struct MmaSelect {
  using type = Mma<T>;
};
template <>
struct MmaSelect<float, true> {
  using type = Mma3xTf32;
};
template <typename T, bool k3xTf32 = false>
using MmaFor = typename MmaSelect<T, k3xTf32>::type;

// The A operand for k-block kb (kK columns) of a row of accumulator tiles acc[0..].
template <typename T, bool k3xTf32 = false>
__device__ __forceinline__ FragA a_from_accum(const FragC* acc, int kb) {
  using M = MmaFor<T, k3xTf32>;
  if constexpr (M::kK == 16) return M::a_from_accum(acc[2 * kb], acc[2 * kb + 1]);
  else return M::a_from_accum(acc[kb]);
}

}  // namespace mamba2ssd::tile
