// The project's one table of tolerances: relative L2 error ||out - ref|| / ||ref|| against the fp64
// oracle, by the dtype of x/B/C/y, for the forward's outputs and the backward's gradients. Every check
// (C++ tests, GPU tests, the CLI, the Python tests through mamba2ssd.tolerance) reads it from here.
#pragma once

#include "mamba2ssd/mamba2ssd.h"

namespace mamba2ssd::testing {

inline double rel_l2_tolerance(DType t) {
  switch (t) {
    case DType::kF32: return 2e-3;   // TF32 tensor-core products on the GPU (fp32_math tf32)
    case DType::kF16: return 5e-3;   // 10-bit mantissa operands, fp32 accumulation
    case DType::kBF16: return 1e-2;  // 7-bit mantissa operands, fp32 accumulation
    case DType::kF64: return 1e-12;  // the oracle itself (reference backend only): rounding alone
  }
  return 0.0;
}

// fp32 with fp32_math accurate: 3xTF32 products on the GPU (the host backends are fp32 or fp64
// whatever fp32_math says). The error model, with u = 2^-24 fp32's unit roundoff:
//   - a 3xTF32 product a b leaves out small_a small_b and the parts of a and b beyond big + small,
//     each at most about 2^-22 = 4u of |a b| (tile::Mma3xTf32), so at most about 12u = 7e-7;
//     rounding errors of random sign, so a dot product of K terms (K <= 256) is off by about
//     sqrt(K) u |a||b| for both the products and the fp32 accumulation: 1e-6 relative to its terms;
//   - the rest is fp32 as on the CPU: the fast exp2 (2 ulp), the state carried across chunks
//     in fp32 (its error shrinks with the decay, it does not grow chunk after chunk), y rounded to
//     fp32 (u);
//   - a sum whose terms cancel loses digits in proportion: ||terms|| / ||sum|| of a few in these
//     problems.
// So about 1e-6 to 5e-6; the bar is 2e-5, the decode step's fp32 bar (fp32 arithmetic, the same
// fast exp2). TF32 rounds every operand to 2^-11 = 4.9e-4 (about 2.8e-4 rms), so its products are
// off by about 4e-4 rms and its outputs by 1e-4 to 1e-3: twenty times this bar or more, so a kernel
// still on TF32 products fails it.
inline double accurate_fp32_rel_l2_tolerance() { return 2e-5; }

// The forward's bar for a call: rel_l2_tolerance, or for fp32 with fp32_math accurate the bar above.
inline double rel_l2_tolerance(DType t, Fp32Math math) {
  return t == DType::kF32 && math == Fp32Math::kAccurate ? accurate_fp32_rel_l2_tolerance() : rel_l2_tolerance(t);
}

// The backward's gradients, by the dtype of x/B/C (and of the gradient itself: a gradient stored in a
// coarser dtype than x, such as ddt in bf16, takes the coarser bar). For now the forward's bars: the
// CPU backward (fp32 throughout) is far inside them, its error being mostly the rounding of each
// gradient to its dtype. ddt is a sum over the head dim (x_p dxp_p) and the decay term, so its
// elements count against their terms' scale as the sums below do (reference::Grads64::ddt_terms):
// one GPU fuzz case (2026-12-06, H100; b 2, L 3, H 1, P 128, bf16, dt clamped after the first token)
// had its only two nonzero ddt at 1/230 and 1/30 of their terms' scale, and failed at 7.6e-2 with
// the bf16 operands' rounding.
inline double backward_rel_l2_tolerance(DType t) { return rel_l2_tolerance(t); }

// The gradients that are sums over every token of the call (dA, ddt_bias, dD): their terms take both
// signs and cancel, so the sum's relative error is its terms' amplified. Twice the bar above: the
// CUDA backward's TF32 products put one fp32 case's ddt_bias at 3.1e-3 on the H200 (2026-12-01),
// where its per-token ddt passed 2e-3. And each such element's error counts against the larger of
// the sum and the root sum of squares of its terms (reference::Grads64::dA_terms, ...), the scale
// of the error of a sum whose terms each carry their own rounding: where a head's terms cancel to
// near zero, ||error|| / ||sum|| measures the cancellation, not the kernel (2026-12-06, H100: GPU
// fuzz cases of one or two heads at dA, ddt_bias 0.02-0.7 relative to the sum; mamba_ssm's
// kernels on the same inputs as far off: docs/reliability.md, "Randomized checking").
inline double backward_sum_rel_l2_tolerance(DType t) { return 2.0 * backward_rel_l2_tolerance(t); }

// The decode step's out and stored states. No tensor cores: fp32 arithmetic on every backend, so
// the error is the rounding of out to its dtype and of each stored state to the cache's dtype
// (rel L2 about u / 2 for unit roundoff u: bf16 1.6e-3, fp16 2e-4), plus fp32's own (about 1e-6
// with the GPU's fast exp2). The bar is the coarser of the inputs' dtype and the cache's.
inline double decode_rel_l2_tolerance_of(DType t) {
  switch (t) {
    case DType::kF32: return 2e-5;
    case DType::kF16: return 1e-3;
    case DType::kBF16: return 5e-3;
    case DType::kF64: return 0.0;  // the decode step refuses fp64 (validate)
  }
  return 0.0;
}
inline double decode_rel_l2_tolerance(DType dtype, DType state_dtype) {
  const double a = decode_rel_l2_tolerance_of(dtype), b = decode_rel_l2_tolerance_of(state_dtype);
  return a > b ? a : b;
}

// The exact mode of prefill (docs/serving.md, "Consistency"): the decode step run over the prompt's
// tokens with an fp32 cache, so the decode step's bar.
inline double exact_prefill_rel_l2_tolerance(DType t) { return decode_rel_l2_tolerance(t, DType::kF32); }

// The packed prefill's y and stored states (PrefillParams): the forward's bar for the inputs' dtype
// (the CUDA prefill will run the forward's tensor-core scan) or the cache's, whichever is coarser:
// a state read from and stored to a bf16 or fp16 cache is rounded there (decode's bar for it).
inline double prefill_rel_l2_tolerance(DType dtype, DType state_dtype) {
  const double a = rel_l2_tolerance(dtype), b = decode_rel_l2_tolerance_of(state_dtype);
  return a > b ? a : b;
}

// The layer's causal convolution (conv1d_cuda; Conv1dParams): fp32 arithmetic, so out and dx are
// off by their rounding to the dtype (the decode step's bars), and dweight and dbias, fp32 sums over
// every token of a channel, by fp32's own rounding: about sqrt(terms) u of the terms' scale, which
// cancelling terms make larger relative to the sum (2e-5, the decode step's fp32 bar).
inline double conv1d_rel_l2_tolerance(DType t) { return decode_rel_l2_tolerance_of(t); }
inline double conv1d_weight_rel_l2_tolerance() { return 2e-5; }

// The consistency rules (src/testing/consistency.h): a prefill done in pieces, or ended by decode
// steps, against the same tokens prefilled whole. Each is held to rel_l2_tolerance against the
// oracle, so two of them differ by at most twice that (the triangle inequality): they tile their
// tokens differently (chunk boundaries move with the split, the decode steps use no tensor cores),
// so nothing tighter holds by default. The exact mode is held to equal bits instead.
inline double consistency_rel_l2_tolerance(DType t) { return 2.0 * rel_l2_tolerance(t); }

}  // namespace mamba2ssd::testing
