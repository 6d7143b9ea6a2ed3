// The CUDA packed prefill (mamba2ssd.h, "Packed prefill"; docs/serving.md, "CUDA packed prefill"):
// the three-kernel path's kernels over the requests laid out chunk-aligned (prefill_edges.cuh).
//   padded_chunks  (where each chunk's tokens are, from cu_seqlens on the device: no host sync)
//   -> chunk_cumsum      (dt and its within-chunk sums, in padded coordinates: padding has dt = 0)
//   -> chunk_states_sm80 (the walk, entering each request from its slot, storing its states)
//   -> chunk_outputs_sm80 (y, straight into the packed rows)
//   -> empty_requests    (the slots of requests without tokens)
// The inputs are read, and y written, in place through the chunk map: a padded chunk's tokens past
// its request's are staged as zeros, never copied. The workspace depends on the token and request
// counts only (ceil-free bound: sum ceil(len_s / chunk) <= L / chunk + S chunks).
#include <limits>
#include <string>

#include "api/internal.h"
#include "cuda/common/chunk_cumsum.cuh"
#include "cuda/common/dtype_dispatch.cuh"
#include "cuda/common/launch.h"
#include "cuda/fwd/args.cuh"
#include "cuda/fwd/check_inputs.h"
#include "cuda/fwd/chunk_outputs_sm80.cuh"
#include "cuda/fwd/chunk_states_sm80.cuh"
#include "cuda/fwd/plan.h"
#include "cuda/prefill/prefill_edges.cuh"

namespace mamba2ssd {
namespace cuda {
namespace {

constexpr std::size_t round_up(std::size_t n) { return (n + 255) / 256 * 256; }

// The forward's sections over the padded chunks (FwdPlan), then the chunk map and its count.
struct PrefillPlan {
  FwdPlan fwd;
  std::size_t padded = 0, count = 0;
  std::size_t total() const { return fwd.total() + padded + count; }
};

PrefillPlan plan_prefill(const PrefillParams& p) {
  const ForwardParams& f = p.fwd;
  PrefillPlan plan;
  FwdPlan& w = plan.fwd;
  w.path = CudaPath::kThreeKernel;
  w.chunk = f.chunk_size == 64 ? 64 : 128;  // (a requested 256 runs as 128, as in the forward)
  w.nchunks = f.seqlen / w.chunk + f.nseqs;
  w.lpad = w.nchunks * w.chunk;
  w.dt = w.g = round_up(sizeof(float) * f.nheads * w.lpad);
  w.chunk_states = round_up(sizeof(float) * f.headdim * f.dstate * w.nchunks * f.nheads);
  plan.padded = round_up(sizeof(PaddedChunk) * w.nchunks);
  plan.count = round_up(sizeof(int64_t));
  return plan;
}

// Why the prefill cannot run p on this build and device; empty if it can.
std::string refusal(const PrefillParams& p) {
  const ForwardParams& f = p.fwd;
  if (f.cuda_path != CudaPath::kAuto && f.cuda_path != CudaPath::kThreeKernel)
    return std::string("fwd.cuda_path ") + to_string(f.cuda_path) +
           " does not run the packed prefill (auto and three_kernel do: the prefill runs the three-kernel path)";
  if (std::string why = grid_refusal(f); !why.empty()) return "its grids: " + why;
  if (f.seqlen / 64 + f.nseqs > std::numeric_limits<int32_t>::max())
    return "its chunk grid takes at most 2^31 - 1 chunks (seqlen " + std::to_string(f.seqlen) + ", nseqs " +
           std::to_string(f.nseqs) + ")";
  if (!is_device_pointer(p.state))
    return "state is not device memory (the CUDA backend reads and writes the cache on the GPU)";
  return "";
}

template <typename T, int kChunk, bool k3xTf32>
void launch_kernels(const FwdArgs& a, const PrefillCache& cache, PaddedChunk* padded, int64_t* count,
                    cudaStream_t stream) {
  launch(padded_chunks_kernel, "padded_chunks_kernel", dim3(1), kPaddedChunksThreads, 0, stream,
         PaddedChunksArgs{a.seqs, a.geo.seqlen, kChunk, a.scan.nchunks, padded, count});
  launch_chunk_cumsum<kChunk>(a, stream);
  launch_chunk_states<T, kChunk, k3xTf32>(a, stream, PrefillEdges{cache, a.scan.padded, count, a.seqs, a.geo.seqlen});
  launch_chunk_outputs<T, kChunk, k3xTf32>(a, stream);
  launch(empty_requests_kernel, "empty_requests_kernel", dim3(static_cast<unsigned>(a.seqs.nseqs)), 256, 0, stream,
         EmptyRequestsArgs{cache, a.seqs, a.geo.seqlen, a.geo.nheads, a.geo.headdim, a.geo.dstate});
}

}  // namespace
}  // namespace cuda

std::size_t cuda_prefill_workspace_bytes(const PrefillParams& p) {
  validate(p);
  return cuda::plan_prefill(p).total();
}

void prefill_cuda(const PrefillParams& p, void* workspace, std::size_t workspace_bytes, void* stream) {
  validate(p);
  if (std::string why = cuda::refusal(p); !why.empty()) throw Error("backend cuda: the packed prefill cannot run: " + why);
  const cuda::PrefillPlan plan = cuda::plan_prefill(p);
  if (!workspace) throw Error("workspace is null");
  if (workspace_bytes < plan.total())
    throw Error("workspace_bytes is " + std::to_string(workspace_bytes) + ", needs at least " +
                std::to_string(plan.total()) + " (cuda_prefill_workspace_bytes)");
  if (reinterpret_cast<uintptr_t>(workspace) % 256 != 0) throw Error("workspace must be 256-byte aligned");
  const auto s = static_cast<cudaStream_t>(stream);
  if (p.fwd.check_inputs) {
    detail::require_input_status(p.fwd);
    cuda::launch_check_inputs(p.fwd, s);  // before the kernels: same stream
  }

  char* after = static_cast<char*>(workspace) + plan.fwd.total();
  cuda::FwdArgs a = cuda::make_fwd_args(p.fwd, plan.fwd, workspace);
  a.scan.resets = false;  // each chunk holds one request: nothing inside a chunk resets
  a.scan.seq = nullptr;
  auto* padded = reinterpret_cast<cuda::PaddedChunk*>(after);
  a.scan.padded = padded;
  auto* count = reinterpret_cast<int64_t*>(after + plan.padded);
  const cuda::PrefillCache cache{p.state,        p.state_stride,     p.state_dtype,        p.nslots,
                                 p.slots,        p.has_initial_state, p.pad_slot_id,       p.state_every,
                                 p.intermediate_slots, p.max_intermediate};
  cuda::dispatch_dtype_math(p.fwd.dtype, p.fwd.fp32_math, [&](auto t, auto three_tf32) {
    using T = decltype(t);
    constexpr bool k3xTf32 = decltype(three_tf32)::value;
    plan.fwd.chunk == 64 ? cuda::launch_kernels<T, 64, k3xTf32>(a, cache, padded, count, s)
                         : cuda::launch_kernels<T, 128, k3xTf32>(a, cache, padded, count, s);
  });
}

}  // namespace mamba2ssd
