// The CUDA packed prefill (mamba2ssd.h, "Packed prefill"; docs/serving.md, "CUDA packed prefill"):
// the forward's kernels over the requests laid out chunk-aligned (request_edges.cuh), on the hopper
// path where it takes the call (16-bit inputs, TMA-aligned tensors, an sm_90 GPU), else on the
// three-kernel path:
//   padded_chunks  (where each chunk's tokens are, from cu_seqlens on the device: no host sync)
//   -> chunk_cumsum  (dt and its within-chunk sums, in padded coordinates: padding has dt = 0)
//   -> hopper: segment_scan_sm90 in its kPrefill form (hopper_path.cu, sm90_prefill_plan): segments
//      of whole requests, or segments over the padded chunks (segment_ends_sm90 and segment_entries
//      before the walk, deferred_states after it)
//      three-kernel: chunk_states_sm80 (PrefillEdges) -> chunk_outputs_sm80
//   -> empty_requests  (the slots of requests without tokens)
// Every walk enters a request from its slot and stores its states there; the inputs are read, and
// y written, in place through the chunk map, never copied. The workspace depends on the token and
// request counts only: sum_s ceil(len_s / chunk) <= L / chunk + S chunks.
#include <cub/block/block_scan.cuh>

#include <limits>
#include <string>

#include "api/internal.h"
#include "cuda/common/chunk_cumsum.cuh"
#include "cuda/common/device.h"
#include "cuda/common/dtype_dispatch.cuh"
#include "cuda/common/launch.h"
#include "cuda/fwd/args.cuh"
#include "cuda/fwd/check_inputs.h"
#include "cuda/fwd/chunk_outputs_sm80.cuh"
#include "cuda/fwd/chunk_states_sm80.cuh"
#include "cuda/fwd/paths.h"
#include "cuda/fwd/plan.h"
#include "cuda/prefill/request_edges.cuh"

namespace mamba2ssd {
namespace cuda {
namespace {

// The chunk map: padded[c] for every chunk the workspace holds, and how many hold requests (count);
// with segments of whole requests, each request's first chunk too (request_chunks[S]: the count)
// and each segment's first request (request_groups[K]: S).
// One block: the requests' chunk counts, scanned a block of requests at a time; each thread then
// writes its request's entries. A request's tokens come from packed_tokens (clamped to [0, L]), and
// chunks past the map's end are dropped, so hostile cu_seqlens cannot write outside it (nor name a
// chunk past it as a request's first).
constexpr int kPaddedChunksThreads = 256;
struct PaddedChunksArgs {
  SeqInputs seqs;
  int64_t seqlen, chunk, nchunks;
  PaddedChunk* padded;  // [nchunks]
  int64_t* count;
  int64_t* request_chunks;  // [S + 1] or null
  int32_t* request_groups;  // [groups + 1] or null
  int64_t groups;
};
__global__ void __launch_bounds__(kPaddedChunksThreads) padded_chunks_kernel(PaddedChunksArgs a) {
  using Scan = cub::BlockScan<int64_t, kPaddedChunksThreads>;
  __shared__ typename Scan::TempStorage scan;
  int64_t base = 0;  // chunks of the requests before this block of them
  for (int64_t s0 = 0; s0 < a.seqs.nseqs; s0 += kPaddedChunksThreads) {
    const int64_t s = s0 + threadIdx.x;
    const TokenRange r = s < a.seqs.nseqs ? packed_tokens(a.seqs, a.seqlen, s) : TokenRange{0, 0};
    const int64_t len = r.end - r.start, n = (len + a.chunk - 1) / a.chunk;
    int64_t first = 0, total = 0;
    Scan(scan).ExclusiveSum(n, first, total);
    first += base;
    if (a.request_chunks && s < a.seqs.nseqs) a.request_chunks[s] = first < a.nchunks ? first : a.nchunks;
    for (int64_t j = 0; j < n && first + j < a.nchunks; ++j) {
      const int64_t rows = len - j * a.chunk < a.chunk ? len - j * a.chunk : a.chunk;
      a.padded[first + j] = {r.start + j * a.chunk, static_cast<int32_t>(rows), static_cast<int32_t>(s)};
    }
    base += total;
    __syncthreads();  // the scan's storage is reused
  }
  const int64_t used = base < a.nchunks ? base : a.nchunks;
  for (int64_t c = used + threadIdx.x; c < a.nchunks; c += kPaddedChunksThreads) a.padded[c] = {0, 0, -1};
  if (threadIdx.x == 0) {
    *a.count = used;
    if (a.request_chunks) a.request_chunks[a.seqs.nseqs] = used;
  }
  if (!a.request_groups) return;
  __syncthreads();  // every request's first chunk is written
  // Request s goes to segment floor(K m / used) of K, m its middle chunk (non-decreasing in s), so
  // that a segment holds about used / K chunks, give or take a request; request_groups[k] is the
  // first request of segment k or of a later one (S if none).
  auto segment_of = [&](int64_t s) -> int64_t {
    if (s < 0) return -1;
    const int64_t middle2 = a.request_chunks[s] + a.request_chunks[s + 1];  // twice the middle chunk
    const int64_t k = used > 0 ? middle2 * a.groups / (2 * used) : 0;
    return k < a.groups - 1 ? k : a.groups - 1;
  };
  for (int64_t s = threadIdx.x; s < a.seqs.nseqs; s += kPaddedChunksThreads)
    for (int64_t k = segment_of(s - 1) + 1; k <= segment_of(s); ++k) a.request_groups[k] = static_cast<int32_t>(s);
  if (threadIdx.x == 0)
    for (int64_t k = segment_of(a.seqs.nseqs - 1) + 1; k <= a.groups; ++k)
      a.request_groups[k] = static_cast<int32_t>(a.seqs.nseqs);
}

// A request of no tokens has no chunk: its slot gets its starting state here (zero for a new
// request; a slot it reads keeps its state). One block per request, nothing for the others.
__global__ void __launch_bounds__(256) empty_requests_kernel(FwdArgs a) {
  const int64_t s = blockIdx.x;
  const TokenRange r = packed_tokens(a.seqs, a.geo.seqlen, s);
  const PrefillCache& cache = a.prefill;
  const int64_t slot = cache.index(cache.slots[s]);
  if (r.end > r.start || slot < 0 || cache.reads(s)) return;
  const int P = static_cast<int>(a.geo.headdim), N = static_cast<int>(a.geo.dstate);
  for (int64_t h = 0; h < a.geo.nheads; ++h)
    cache.with_head(slot, h, [&](auto head) {
      for (int i = static_cast<int>(threadIdx.x); i < P * N; i += static_cast<int>(blockDim.x))
        head.store(i / N, i % N, 0.0f);
    });
}

// The path's sections over the padded chunks (FwdPlan), then the chunk map, its count and, with
// segments of whole requests, the requests' first chunks and the segments' first requests.
struct PrefillPlan {
  FwdPlan fwd;
  std::size_t padded = 0, count = 0, request_chunks = 0, request_groups = 0;
  std::size_t total() const { return fwd.total() + padded + count + request_chunks + request_groups; }
};

// The hopper path if it takes the call and the caller allows it (auto or hopper), else the
// three-kernel path (auto or three_kernel); throws Error naming the refusals otherwise.
CudaPath choose(const PrefillParams& p, const DeviceInfo& d) {
  const ForwardParams& f = p.fwd;
  const CudaPath asked = f.cuda_path;
  if (asked != CudaPath::kAuto && asked != CudaPath::kHopper && asked != CudaPath::kThreeKernel)
    throw Error(std::string("backend cuda: fwd.cuda_path ") + to_string(asked) +
                " does not run the packed prefill (auto, hopper and three_kernel do)");
  std::string hopper_why =
      asked == CudaPath::kThreeKernel ? "not asked for"
      : f.dtype == DType::kF32        ? "it needs bf16 or fp16 inputs (dtype fp32)"
      : !pair_aligned(p.state, p.state_stride, p.state_dtype)
          ? "it needs a state cache whose rows hold pairs of elements (a base aligned to two elements and even strides)"
          : kSm90Path.refusal(f, d);
  if (hopper_why.empty()) return CudaPath::kHopper;
  if (asked == CudaPath::kHopper)
    throw Error("backend cuda: fwd.cuda_path hopper cannot run this packed prefill: " + hopper_why);
  if (std::string why = kThreeKernelPath.refusal(f, d); !why.empty())
    throw Error("backend cuda: the packed prefill cannot run: " + why);
  return CudaPath::kThreeKernel;
}

PrefillPlan plan_prefill(const PrefillParams& p, CudaPath path, const DeviceInfo& d) {
  const ForwardParams& f = p.fwd;
  PrefillPlan plan;
  if (path == CudaPath::kHopper) {
    plan.fwd = sm90_prefill_plan(f, d, f.seqlen / 128 + f.nseqs);
  } else {
    FwdPlan& w = plan.fwd;
    w.path = CudaPath::kThreeKernel;
    w.chunk = three_kernel_chunk(f, d);  // (as in the forward: a requested 256 runs as 128)
    w.nchunks = f.seqlen / w.chunk + f.nseqs;
    w.lpad = w.nchunks * w.chunk;
    w.dt = w.g = round_up(sizeof(float) * f.nheads * w.lpad);
    w.chunk_states = round_up(sizeof(float) * f.headdim * f.dstate * w.nchunks * f.nheads);
  }
  plan.padded = round_up(sizeof(PaddedChunk) * plan.fwd.nchunks);
  plan.count = round_up(sizeof(int64_t));
  if (plan.fwd.request_segments) {
    plan.request_chunks = round_up(sizeof(int64_t) * (f.nseqs + 1));
    plan.request_groups = round_up(sizeof(int32_t) * (plan.fwd.nsegs + 1));
  }
  return plan;
}

// What runs any call: the size and memory checks beyond validate(), and the plan.
PrefillPlan checked_plan(const PrefillParams& p) {
  validate(p);
  if (!is_device_pointer(p.state))
    throw Error("backend cuda: state is not device memory (the CUDA packed prefill reads and writes the cache on the GPU)");
  if (p.fwd.seqlen / 64 + p.fwd.nseqs > std::numeric_limits<int32_t>::max())
    throw Error("backend cuda: the packed prefill's chunk grid takes at most 2^31 - 1 chunks (seqlen " +
                std::to_string(p.fwd.seqlen) + ", nseqs " + std::to_string(p.fwd.nseqs) + ")");
  const DeviceInfo d = current_device();
  return plan_prefill(p, choose(p, d), d);
}

template <typename T, int kChunk, bool k3xTf32>
void launch_three_kernel(const FwdArgs& a, cudaStream_t stream) {
  launch_chunk_cumsum<kChunk>(a, stream);
  launch_chunk_states<T, kChunk, k3xTf32, PrefillEdges>(a, stream);
  launch_chunk_outputs<T, kChunk, k3xTf32>(a, stream);
}

}  // namespace
}  // namespace cuda

std::size_t cuda_prefill_workspace_bytes(const PrefillParams& p) { return cuda::checked_plan(p).total(); }

void prefill_cuda(const PrefillParams& p, void* workspace, std::size_t workspace_bytes, void* stream) {
  const cuda::PrefillPlan plan = cuda::checked_plan(p);
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
  auto* padded = reinterpret_cast<cuda::PaddedChunk*>(after);
  auto* count = reinterpret_cast<int64_t*>(after + plan.padded);
  char* requests = after + plan.padded + plan.count;
  auto* request_chunks = plan.request_chunks ? reinterpret_cast<int64_t*>(requests) : nullptr;
  auto* request_groups = plan.request_groups ? reinterpret_cast<int32_t*>(requests + plan.request_chunks) : nullptr;
  cuda::FwdArgs a = cuda::make_fwd_args(p.fwd, plan.fwd, workspace);
  a.scan.resets = false;  // each chunk holds one request: nothing inside a chunk resets
  a.scan.seq = nullptr;
  a.scan.padded = padded, a.scan.padded_count = count;
  a.prefill = {p.state,
               p.state_stride,
               p.state_dtype,
               cuda::pair_aligned(p.state, p.state_stride, p.state_dtype),
               p.nslots,
               p.slots,
               p.has_initial_state,
               p.pad_slot_id,
               p.state_every,
               p.intermediate_slots,
               p.max_intermediate,
               request_chunks,
               request_groups};

  cuda::launch(cuda::padded_chunks_kernel, "padded_chunks_kernel", dim3(1), cuda::kPaddedChunksThreads, 0, s,
               cuda::PaddedChunksArgs{a.seqs, a.geo.seqlen, plan.fwd.chunk, plan.fwd.nchunks, padded, count,
                                      request_chunks, request_groups, plan.fwd.nsegs});
  if (plan.fwd.path == CudaPath::kHopper) {
    cuda::launch_sm90_prefill(p.fwd, a, stream);
  } else {
    cuda::dispatch_dtype_math(p.fwd.dtype, p.fwd.fp32_math, [&](auto t, auto three_tf32) {
      using T = decltype(t);
      constexpr bool k3xTf32 = decltype(three_tf32)::value;
      plan.fwd.chunk == 64 ? cuda::launch_three_kernel<T, 64, k3xTf32>(a, s)
                           : cuda::launch_three_kernel<T, 128, k3xTf32>(a, s);
    });
  }
  cuda::launch(cuda::empty_requests_kernel, "empty_requests_kernel", dim3(static_cast<unsigned>(p.fwd.nseqs)), 256, 0,
               s, a);
}

}  // namespace mamba2ssd
