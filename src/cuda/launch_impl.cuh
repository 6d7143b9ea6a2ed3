// Definition of launch_all, included by the per-dtype translation units only.
#pragma once

#include "cuda/check.h"
#include "cuda/chunk_cumsum.cuh"
#include "cuda/chunk_scan_fused.cuh"
#include "cuda/chunk_scan_hopper.cuh"
#include "cuda/segment_ends_hopper.cuh"
#include "cuda/segment_pass.cuh"
#include "cuda/compute_out.cuh"
#include "cuda/fwd_pass_state.cuh"
#include "cuda/launch.h"
#include "cuda/varlen_states.cuh"

namespace mamba2ssd::cuda {

inline void check_launch(const char* kernel) { cuda_check(cudaGetLastError(), kernel); }

// Raises the dynamic shared memory limit of a kernel instance once.
template <typename Kernel>
void allow_smem(Kernel kernel, int bytes) {
  if (bytes > 48 * 1024)
    cuda_check(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes),
               "cudaFuncSetAttribute(max dynamic shared memory)");
}

// Launches kernel<<<grid, threads, smem, stream>>>(a); behind: as a programmatic dependent launch
// (sm_90), whose blocks may start while the kernel before it ends and wait for its results
// (wait_previous_kernel).
inline void launch(void (*kernel)(Args), const char* name, dim3 grid, int threads, int smem, cudaStream_t stream,
                   const Args& a, bool behind) {
  cudaLaunchAttribute attr{};
  attr.id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr.val.programmaticStreamSerializationAllowed = 1;
  cudaLaunchConfig_t config{};
  config.gridDim = grid, config.blockDim = dim3(threads), config.dynamicSmemBytes = smem, config.stream = stream;
  config.attrs = &attr, config.numAttrs = behind ? 1 : 0;
  cuda_check(cudaLaunchKernelEx(&config, kernel, a), name);
}

template <typename T, int kChunk, int kHeadDim>
void launch_compute_out(const Args& a, cudaStream_t stream) {
  using Shape = ComputeOutShape<T, kChunk, kHeadDim>;
  auto kernel = compute_out_kernel<T, kChunk, kHeadDim>;
  allow_smem(kernel, Shape::kSmemBytes);
  const dim3 grid(static_cast<unsigned>(a.nchunks), static_cast<unsigned>(a.p.nheads),
                  static_cast<unsigned>(a.p.batch));
  kernel<<<grid, Shape::kThreads, Shape::kSmemBytes, stream>>>(a);
  check_launch("compute_out_kernel");
}

template <int kChunk>
void launch_chunk_cumsum(const Args& a, cudaStream_t stream) {
  const dim3 grid(static_cast<unsigned>(a.nchunks), static_cast<unsigned>((a.p.nheads + kCumsumHeads - 1) / kCumsumHeads),
                  static_cast<unsigned>(a.p.batch));
  switch (a.p.dt_dtype) {
    case DType::kF16: chunk_cumsum_kernel<kChunk, __half><<<grid, kCumsumThreads, 0, stream>>>(a); break;
    case DType::kBF16: chunk_cumsum_kernel<kChunk, __nv_bfloat16><<<grid, kCumsumThreads, 0, stream>>>(a); break;
    default: chunk_cumsum_kernel<kChunk, float><<<grid, kCumsumThreads, 0, stream>>>(a); break;
  }
  check_launch("chunk_cumsum_kernel");
}

template <typename T, int kChunk>
void launch_pass_state(const Args& a, cudaStream_t stream) {
  using Shape = PassStateShape<T, kChunk>;
  auto kernel = fwd_pass_state_kernel<T, kChunk>;
  allow_smem(kernel, Shape::kSmemBytes);
  const ForwardParams& p = a.p;
  const int64_t tiles = (p.dstate + kStateTile - 1) / kStateTile * (p.headdim / kStateTile);
  const dim3 grid(static_cast<unsigned>(tiles), static_cast<unsigned>(p.nheads), static_cast<unsigned>(p.batch));
  kernel<<<grid, Shape::kThreads, Shape::kSmemBytes, stream>>>(a);
  check_launch("fwd_pass_state_kernel");
}

template <typename T, int kChunk>
void launch_all(const Args& a, cudaStream_t stream) {
  const ForwardParams& p = a.p;
  launch_chunk_cumsum<kChunk>(a, stream);
  launch_pass_state<T, kChunk>(a, stream);

  switch (p.headdim) {
    case 32: launch_compute_out<T, kChunk, 32>(a, stream); break;
    case 64: launch_compute_out<T, kChunk, 64>(a, stream); break;
    default: launch_compute_out<T, kChunk, 128>(a, stream); break;
  }

  if (p.varlen_states) {
    const dim3 grid(static_cast<unsigned>(p.nseqs), static_cast<unsigned>(p.nheads),
                    static_cast<unsigned>((p.dstate + 31) / 32));
    varlen_states_kernel<T, kChunk><<<grid, kVarlenThreads, 0, stream>>>(a);
    check_launch("varlen_states_kernel");
  }
}

// The fused walk over every segment, or (kSegmentEnds) the segment ends of every segment but the
// last; kHopper: the wgmma kernels (16-bit types only).
template <typename T, int kN, bool kSegmentEnds, bool kHopper>
void launch_fused_scan(const Args& a, cudaStream_t stream) {
  void (*kernel)(Args);
  int threads = 0, smem = 0;
  const char* name = nullptr;
  if constexpr (kHopper && kSegmentEnds) {
    kernel = segment_ends_hopper_kernel<T, kN>, name = "segment_ends_hopper_kernel";
    threads = SegmentEndsShape<T, kN>::kThreads, smem = SegmentEndsShape<T, kN>::kSmemBytes;
  } else if constexpr (kHopper) {
    kernel = chunk_scan_hopper_kernel<T, kN>, name = "chunk_scan_hopper_kernel";
    threads = HopperShape<T, kN>::kThreads, smem = HopperShape<T, kN>::kSmemBytes;
  } else {
    kernel = chunk_scan_fused_kernel<T, kN, kSegmentEnds>, name = "chunk_scan_fused_kernel";
    threads = FusedShape<T, kN>::kThreads, smem = FusedShape<T, kN>::kSmemBytes;
  }
  allow_smem(kernel, smem);
  if constexpr (kHopper)  // all of shared memory, so that two blocks (state size 256: one) fit
    cuda_check(cudaFuncSetAttribute(kernel, cudaFuncAttributePreferredSharedMemoryCarveout,
                                    cudaSharedmemCarveoutMaxShared),
               "cudaFuncSetAttribute(shared memory carveout)");
  int parts = 1;  // blocks per segment
  if constexpr (kHopper && kSegmentEnds) parts = SegmentEndsShape<T, kN>::kParts;
  const dim3 grid(static_cast<unsigned>((kSegmentEnds ? a.nsegs - 1 : a.nsegs) * parts),
                  static_cast<unsigned>(a.p.nheads), static_cast<unsigned>(a.p.batch));
  launch(kernel, name, grid, threads, smem, stream, a, kHopper);
}

template <typename T, int kN, bool kHopper>
void launch_fused_passes(const Args& a, cudaStream_t stream) {
  const ForwardParams& p = a.p;
  if (a.nsegs > 1) {
    launch_fused_scan<T, kN, true, kHopper>(a, stream);
    constexpr int kPerBlock = kSegmentPassThreads * kSegmentPassElems;
    const dim3 grid(static_cast<unsigned>((p.headdim * kN + kPerBlock - 1) / kPerBlock),
                    static_cast<unsigned>(p.nheads), static_cast<unsigned>(p.batch));
    launch(segment_pass_kernel<kN>, "segment_pass_kernel", grid, kSegmentPassThreads, 0, stream, a, kHopper);
  }
  launch_fused_scan<T, kN, false, kHopper>(a, stream);
}

template <typename T>
void launch_fused(const Args& a, cudaStream_t stream, bool hopper) {
  launch_chunk_cumsum<128>(a, stream);
  const int cols = fused_state_cols(a.p.dstate);
  if constexpr (sizeof(T) == 2) {
    if (hopper) {
      if (cols == 64) return launch_fused_passes<T, 64, true>(a, stream);
      if (cols == 128) return launch_fused_passes<T, 128, true>(a, stream);
      return launch_fused_passes<T, 256, true>(a, stream);
    }
  }
  // The portable fused kernels: state sizes up to 128 (make_plan).
  cols == 64 ? launch_fused_passes<T, 64, false>(a, stream) : launch_fused_passes<T, 128, false>(a, stream);
}

}  // namespace mamba2ssd::cuda
