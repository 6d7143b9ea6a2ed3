#include "cuda/fwd/check_inputs.h"

#include <cstdint>

#include "common/input_rules.h"
#include "cuda/common/launch.h"

namespace mamba2ssd::cuda {
namespace {

constexpr int kCheckThreads = 1024;

struct CheckArgs {
  const int64_t* cu_seqlens;  // [S + 1] or null
  int64_t nseqs, batch, seqlen;
  const int32_t* seq_idx;  // [b, L] or null
  Strides2 seq_idx_stride;
  int64_t* status;  // [kInputStatusWords]
};

// Orders bad entries: cu_seqlens before seq_idx, then by flat index, then by rule (the smallest
// key is the first bad entry). Flat indices are below 2^56 (validate()), so the key fits 64 bits.
__device__ __forceinline__ unsigned long long key_of(int64_t rule, int64_t flat) {
  const unsigned long long tensor = rule == detail::kSeqIdxDecreasing;
  return tensor << 62 | static_cast<unsigned long long>(flat) << 3 | static_cast<unsigned long long>(rule);
}

// One block walks every entry (the check is opt-in and the tensors are small next to x: S + 1
// offsets and b L ids), so that the first bad entry is found with a block reduction and no
// second launch; a later call's failure never overwrites an earlier one's (sticky status).
__global__ void __launch_bounds__(kCheckThreads) check_inputs_kernel(CheckArgs a) {
  __shared__ unsigned long long first;
  if (threadIdx.x == 0) first = ~0ull;
  __syncthreads();
  unsigned long long mine = ~0ull;
  auto bad = [&](int64_t rule, int64_t flat) { mine = min(mine, key_of(rule, flat)); };
  if (a.cu_seqlens) {
    for (int64_t s = threadIdx.x; s <= a.nseqs; s += kCheckThreads) {
      const int64_t v = a.cu_seqlens[s];
      if (s == 0 && v != 0) bad(detail::kCuSeqlensFirstNotZero, s);
      if (s > 0 && v < a.cu_seqlens[s - 1]) bad(detail::kCuSeqlensDecreasing, s);
      if (v > a.seqlen) bad(detail::kCuSeqlensPastTheEnd, s);
      if (s == a.nseqs && v != a.seqlen) bad(detail::kCuSeqlensLastNotSeqlen, s);
    }
  }
  if (a.seq_idx) {
    const int64_t total = a.batch * a.seqlen;
    for (int64_t i = threadIdx.x; i < total; i += kCheckThreads) {
      const int64_t b = i / a.seqlen, t = i % a.seqlen;
      const int32_t* row = a.seq_idx + b * a.seq_idx_stride.s0;
      if (t > 0 && row[t * a.seq_idx_stride.s1] < row[(t - 1) * a.seq_idx_stride.s1]) bad(detail::kSeqIdxDecreasing, i);
    }
  }
  if (mine != ~0ull) atomicMin(&first, mine);
  __syncthreads();
  if (threadIdx.x != 0 || first == ~0ull) return;
  const int64_t rule = static_cast<int64_t>(first & 7), flat = static_cast<int64_t>((first >> 3) & ((1ull << 59) - 1));
  int64_t row = 0, index = flat, value = 0;
  if (rule == detail::kSeqIdxDecreasing) {
    row = flat / a.seqlen, index = flat % a.seqlen;
    value = a.seq_idx[row * a.seq_idx_stride.s0 + index * a.seq_idx_stride.s1];
  } else {
    value = a.cu_seqlens[flat];
  }
  // Sticky: only a clean status takes this call's failure.
  auto* status = reinterpret_cast<unsigned long long*>(a.status);
  if (atomicCAS(status, 0ull, static_cast<unsigned long long>(rule)) == 0ull) {
    a.status[1] = row, a.status[2] = index, a.status[3] = value;
  }
}

}  // namespace

void launch_check_inputs(const ForwardParams& p, cudaStream_t stream) {
  const CheckArgs a{p.cu_seqlens, p.nseqs, p.batch, p.seqlen, p.seq_idx, p.seq_idx_stride, p.input_status};
  if (!a.cu_seqlens && !a.seq_idx) return;  // nothing to check
  launch(check_inputs_kernel, "check_inputs_kernel", dim3(1), kCheckThreads, 0, stream, a);
}

}  // namespace mamba2ssd::cuda
