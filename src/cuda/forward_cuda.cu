// The CUDA forward: workspace layout, the one dispatch from runtime values to kernel instances, and
// the launches of the three kernels (plus varlen states). Nothing here synchronizes or allocates:
// the call can be captured in a CUDA graph.
//
// Chunk length: the kernels run with chunk 64 or 128. A requested chunk of 256 runs as chunks of
// 128; the function computed is the same (chunking is a way to organize the scan, not part of it).
#include <cuda_runtime_api.h>

#include <string>

#include "api/internal.h"
#include "cuda/check.h"
#include "cuda/launch.h"
#include "cuda/tile/copy.cuh"

namespace mamba2ssd {
namespace {

using cuda::Args;
using cuda::launch_all;

constexpr std::size_t kAlign = 256;
std::size_t round_up(std::size_t n) { return (n + kAlign - 1) / kAlign * kAlign; }

int kernel_chunk(const ForwardParams& p) { return p.chunk_size == 64 ? 64 : 128; }

// Byte sizes of the workspace sections, in order: dt, g, seq, states.
struct WorkspaceLayout {
  std::size_t dt, g, seq, states;
  std::size_t total() const { return dt + g + seq + states; }
};

WorkspaceLayout workspace_layout(const ForwardParams& p) {
  const int64_t q = kernel_chunk(p), nchunks = (p.seqlen + q - 1) / q, lpad = nchunks * q;
  const bool resets = p.seq_idx || p.cu_seqlens;
  WorkspaceLayout w;
  w.dt = round_up(sizeof(float) * p.batch * p.nheads * lpad);
  w.g = w.dt;
  w.seq = resets ? round_up(sizeof(int32_t) * p.batch * lpad) : 0;
  w.states = round_up(sizeof(float) * p.batch * nchunks * p.nheads * p.headdim * p.dstate);
  return w;
}

// The one dispatch: dtype x chunk. Head dim is dispatched inside, at compute_out.
void dispatch(const Args& a, cudaStream_t stream) {
  const bool q64 = kernel_chunk(a.p) == 64;
  switch (a.p.dtype) {
    case DType::kBF16:
      return q64 ? launch_all<__nv_bfloat16, 64>(a, stream) : launch_all<__nv_bfloat16, 128>(a, stream);
    case DType::kF16:
      return q64 ? launch_all<__half, 64>(a, stream) : launch_all<__half, 128>(a, stream);
    case DType::kF32:
      return q64 ? launch_all<float, 64>(a, stream) : launch_all<float, 128>(a, stream);
  }
}

bool aligned4(const void* ptr, const Strides4& s, DType t) {
  const int64_t e = static_cast<int64_t>(dtype_size(t));
  return tile::aligned16(ptr, s.s0, e) && tile::aligned16(ptr, s.s1, e) && tile::aligned16(ptr, s.s2, e);
}

}  // namespace

std::size_t cuda_workspace_bytes(const ForwardParams& p) {
  validate(p);
  return workspace_layout(p).total();
}

void forward_cuda(const ForwardParams& p, void* workspace, std::size_t workspace_bytes, void* stream) {
  validate(p);
  const WorkspaceLayout w = workspace_layout(p);
  if (!workspace) throw Error("workspace is null");
  if (workspace_bytes < w.total())
    throw Error("workspace_bytes is " + std::to_string(workspace_bytes) + ", needs at least " +
                std::to_string(w.total()) + " (cuda_workspace_bytes)");
  if (reinterpret_cast<uintptr_t>(workspace) % kAlign != 0) throw Error("workspace must be 256-byte aligned");
  if (p.nheads > 65535 || p.batch > 65535 || p.nseqs > 2147483647)
    throw Error("nheads and batch must be at most 65535 for the CUDA backend, got nheads " +
                std::to_string(p.nheads) + ", batch " + std::to_string(p.batch));

  Args a{};
  a.p = p;
  const int64_t q = kernel_chunk(p);
  a.nchunks = (p.seqlen + q - 1) / q;
  a.lpad = a.nchunks * q;
  a.resets = p.seq_idx || p.cu_seqlens;
  char* base = static_cast<char*>(workspace);
  a.ws.dt = reinterpret_cast<float*>(base);
  a.ws.g = reinterpret_cast<float*>(base + w.dt);
  a.ws.seq = a.resets ? reinterpret_cast<int32_t*>(base + w.dt + w.g) : nullptr;
  a.ws.states = reinterpret_cast<float*>(base + w.dt + w.g + w.seq);
  a.x_aligned = aligned4(p.x, p.x_stride, p.dtype);
  a.B_aligned = aligned4(p.B, p.B_stride, p.dtype);
  a.C_aligned = aligned4(p.C, p.C_stride, p.dtype);
  dispatch(a, static_cast<cudaStream_t>(stream));
}

}  // namespace mamba2ssd
