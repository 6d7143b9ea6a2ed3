// The CUDA Tile C++ forward: what it refuses, the workspace layout, the chunk_cumsum launches and
// the dispatch to the per-dtype launches of fwd_pass_state and compute_out. Nothing here
// synchronizes or allocates, so a call can be captured in a CUDA graph.
//
// Chunk length: the kernels run with chunk 64 or 128; a requested chunk of 256 runs as 128 (the
// function computed does not depend on the chunking).
#include <cuda_runtime_api.h>

#include <string>

#include "cuda/common/check.h"
#include "cuda_tile/forward_cuda_tile.h"
#include "cuda_tile/launch_tile.h"
#include "cuda_tile/ssd_tile.cuh"

namespace mamba2ssd::cuda_tile {
namespace {

constexpr std::size_t kAlign = 256;
std::size_t round_up(std::size_t n) { return (n + kAlign - 1) / kAlign * kAlign; }

template <typename DT, int Q>
void launch_chunk_cumsum(const TileRun& r, cudaStream_t stream) {
  const ForwardParams& p = r.p;
  const dim3 grid(static_cast<unsigned>(r.layout.nchunks), static_cast<unsigned>(p.nheads),
                  static_cast<unsigned>(p.batch));
  chunk_cumsum_tile<DT, Q><<<grid, 1, 0, stream>>>(
      static_cast<const DT*>(p.dt), p.dt_stride.s0, p.dt_stride.s1, p.dt_stride.s2, p.A, p.dt_bias,
      p.dt_softplus ? 1 : 0, p.dt_min, p.dt_max, p.seq_idx, p.seq_idx_stride.s0, p.seq_idx_stride.s1, p.seqlen,
      p.nheads, r.layout.lpad, r.ws_dt, r.ws_g, r.ws_seq);
  cuda_check(cudaGetLastError(), "chunk_cumsum_tile launch");
}

template <int Q>
void launch_chunk_cumsum_q(const TileRun& r, cudaStream_t stream) {
  switch (r.p.dt_dtype) {
    case DType::kF32: return launch_chunk_cumsum<float, Q>(r, stream);
    case DType::kF16: return launch_chunk_cumsum<__half, Q>(r, stream);
    case DType::kBF16: return launch_chunk_cumsum<__nv_bfloat16, Q>(r, stream);
  }
}

}  // namespace

std::string refusal(const ForwardParams& p) {
  if (p.varlen_states)
    return "cuda_path tile: varlen_states is not supported by the CUDA Tile C++ backend "
           "(use cuda_path three-kernel or fused)";
  if (p.cu_seqlens && !p.seq_idx)
    return "cuda_path tile: cu_seqlens without seq_idx is not supported by the CUDA Tile C++ backend "
           "(pass seq_idx as well, or use cuda_path three-kernel or fused)";
  if (p.headdim != 32 && p.headdim != 64 && p.headdim != 128)
    return "cuda_path tile: the CUDA Tile C++ backend takes head dim 32, 64 or 128, got " + std::to_string(p.headdim) +
           " (use cuda_path three-kernel, fused or hopper)";
  if (p.nheads > 65535 || p.batch > 65535)
    return "cuda_path tile: nheads and batch must be at most 65535, got nheads " + std::to_string(p.nheads) +
           ", batch " + std::to_string(p.batch);
  return {};
}

TileLayout tile_layout(const ForwardParams& p) {
  TileLayout l;
  l.chunk = p.chunk_size == 64 ? 64 : 128;
  l.nchunks = (p.seqlen + l.chunk - 1) / l.chunk;
  l.lpad = l.nchunks * l.chunk;
  const std::size_t tokens = static_cast<std::size_t>(p.batch * p.nheads * l.lpad);
  const std::size_t dt_bytes = round_up(sizeof(float) * tokens);
  const std::size_t seq_bytes = round_up(sizeof(int32_t) * static_cast<std::size_t>(p.batch * l.lpad));
  const std::size_t state_bytes =
      round_up(sizeof(float) * static_cast<std::size_t>(p.batch * l.nchunks * p.nheads * p.headdim * p.dstate));
  l.dt = 0;
  l.g = l.dt + dt_bytes;
  l.seq = l.g + dt_bytes;
  l.states = l.seq + seq_bytes;
  l.total = l.states + state_bytes;
  return l;
}

std::size_t workspace_bytes(const ForwardParams& p) {
  if (std::string why = refusal(p); !why.empty()) throw Error(why);
  return tile_layout(p).total;
}

void forward(const ForwardParams& p, void* workspace, std::size_t ws_bytes, void* stream) {
  if (std::string why = refusal(p); !why.empty()) throw Error(why);
  const TileLayout layout = tile_layout(p);
  if (!workspace) throw Error("workspace is null");
  if (ws_bytes < layout.total)
    throw Error("workspace_bytes is " + std::to_string(ws_bytes) + ", needs at least " +
                std::to_string(layout.total) + " (cuda_workspace_bytes with cuda_path tile)");
  if (reinterpret_cast<uintptr_t>(workspace) % kAlign != 0) throw Error("workspace must be 256-byte aligned");

  TileRun r;
  r.p = p;
  r.layout = layout;
  char* ws = static_cast<char*>(workspace);
  r.ws_dt = reinterpret_cast<float*>(ws + layout.dt);
  r.ws_g = reinterpret_cast<float*>(ws + layout.g);
  r.ws_seq = reinterpret_cast<int32_t*>(ws + layout.seq);
  r.ws_states = reinterpret_cast<float*>(ws + layout.states);
  const cudaStream_t s = static_cast<cudaStream_t>(stream);

  // 1. chunk_cumsum (instantiated here, by dt's dtype).
  if (layout.chunk == 64) launch_chunk_cumsum_q<64>(r, s);
  else launch_chunk_cumsum_q<128>(r, s);
  // 2. fwd_pass_state and 3. compute_out (by the dtype of x/B/C/z/y).
  switch (p.dtype) {
    case DType::kBF16: return launch_state_and_output<__nv_bfloat16>(r, s);
    case DType::kF16: return launch_state_and_output<__half>(r, s);
    case DType::kF32: return launch_state_and_output<float>(r, s);
  }
}

}  // namespace mamba2ssd::cuda_tile
