// Three-kernel path, kernel 2 (the seed's fwd_pass_state): one block per (batch, head, 32-row
// P-tile, 32-column N-tile) walks the chunks in order. For each chunk it stores the state entering
// it, then applies the jump
//   h <- exp2(g_last) h + X^T (B * w),   w_j = dt_j exp2(g_last - g_j)
// as a tensor-core product (K = chunk). Tokens of an earlier sequence than the chunk's last token
// are masked out of w, and the carried state is dropped when a sequence starts inside the chunk.
// The next chunk's X, B, dt and g load (cp.async) while this one multiplies.
#pragma once

#include "cuda/common/launch.h"
#include "cuda/fwd/args.cuh"
#include "cuda/fwd/state_steps.cuh"
#include "cuda/tile/copy.cuh"
#include "cuda/tile/mma.cuh"

namespace mamba2ssd::cuda {

constexpr int kStateTile = 32;  // P and N extent of one block's state tile

// The walks' state tiles of a head (both extents rounded up: the rows and columns past the head dim
// and the state size are masked).
inline unsigned state_tiles(const Geometry& geo) {
  auto tiles = [](int64_t extent) { return (extent + kStateTile - 1) / kStateTile; };
  return static_cast<unsigned>(tiles(geo.dstate) * tiles(geo.headdim));
}

template <typename T, int kChunk>
struct ChunkStatesShape {
  static constexpr int kWarps = kStateTile / 16;  // one 16-row m-tile of P per warp
  static constexpr int kThreads = kWarps * 32;
  static constexpr int kLd = kStateTile + 8;      // padded rows: conflict-free fragment loads
  struct SharedStorage {
    alignas(16) T X[2][kChunk][kLd];  // x of the chunk, columns p0 .. p0 + 31 (double-buffered)
    alignas(16) T B[2][kChunk][kLd];  // B of the chunk, columns n0 .. n0 + 31
    alignas(16) float g[2][kChunk];
    float dt[2][kChunk];
    int32_t seq[2][kChunk];
    float w[kChunk];  // token weights of the state jump
  };
  static constexpr int kSmemBytes = sizeof(SharedStorage);
};

// The walk's edges beyond the forward's: how many of the chunks it walks, and what happens at the
// entry of chunk c (before the state entering it is stored) and at its exit (after the jump), with
// the block's state visited as for_each_element does (f(fragment, element, p index, n index)). The
// forward's are empty; the packed prefill loads and stores its requests' states there, and stops at
// its last request's chunk (src/cuda/prefill/request_edges.cuh).
struct NoChunkEdges {
  __device__ int64_t chunks(const FwdArgs& a) const { return a.scan.nchunks; }
  template <typename ForEach>
  __device__ void enter(const FwdArgs&, int64_t, int64_t, ForEach&&) const {}
  template <typename ForEach>
  __device__ void exit(const FwdArgs&, int64_t, int64_t, ForEach&&) const {}
};

// The walk of one block: state tile `tile` (P-tile tile / n_tiles, N-tile tile % n_tiles) of head
// `head`, batch row `row`; smem_bytes holds the Shape's SharedStorage. A device function, so that the
// backward runs it in one launch beside its own walk (bwd/chunk_dstates_sm80.cuh). The states go to
// a.chunk_states as StateT: fp32 for the forward (varlen_states_sm80 reads them), T for the backward,
// whose products round them to T anyway (half the bytes). k3xTf32: fp32 products as 3xTF32.
// edges: NoChunkEdges or the packed prefill's (above).
template <typename T, int kChunk, typename StateT = float, bool k3xTf32 = false, typename Edges = NoChunkEdges>
__device__ __forceinline__ void chunk_states_walk(const FwdArgs& a, unsigned tile, unsigned head, unsigned row,
                                                  unsigned char* smem_bytes, const Edges& edges = {}) {
  using Shape = ChunkStatesShape<T, kChunk>;
  constexpr int kLd = Shape::kLd;
  const Geometry& geo = a.geo;
  const FwdTensors& io = a.io;
  const int64_t n_tiles = (geo.dstate + kStateTile - 1) / kStateTile;
  const int n0 = static_cast<int>(tile % n_tiles) * kStateTile;
  const int p0 = static_cast<int>(tile / n_tiles) * kStateTile;
  const int64_t h = head, b = row;
  const int64_t grp = geo.group_of(h);

  auto& smem = *reinterpret_cast<typename Shape::SharedStorage*>(smem_bytes);

  const T* x = static_cast<const T*>(io.x) + b * io.x_stride.s0 + h * io.x_stride.s2 + p0;
  const T* B = static_cast<const T*>(io.B) + b * io.B_stride.s0 + grp * io.B_stride.s2 + n0;
  auto stage_chunk = [&](int64_t c, int buf) {
    const ChunkTokens tokens = chunk_tokens<kChunk>(a, c);
    const int p_cols = static_cast<int>(geo.headdim) - p0;  // (zeros past the head dim)
    tile::stage<T, kChunk, kStateTile, Shape::kThreads>(
        smem.X[buf][0], kLd, {x + tokens.t0 * io.x_stride.s1, io.x_stride.s1, tokens.rows, p_cols, io.x_aligned});
    tile::stage<T, kChunk, kStateTile, Shape::kThreads>(
        smem.B[buf][0], kLd,
        {B + tokens.t0 * io.B_stride.s1, io.B_stride.s1, tokens.rows, static_cast<int>(geo.dstate) - n0, io.B_aligned});
    stage_chunk_scalars<kChunk, Shape::kThreads>(a, b, h, c, smem.g[buf], smem.dt[buf], smem.seq[buf]);
    tile::cp_async_commit();
  };

  // This warp's 16 x 32 piece of the state: rows p0 + m0 .., columns n0 + 8 * nt ..
  const int m0 = tile::warp_id() * 16;
  tile::FragC acc[kStateTile / 8];
  auto for_each_element = [&](auto&& f) {  // f(fragment, element, p index, n index)
#pragma unroll
    for (int nt = 0; nt < kStateTile / 8; ++nt)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int pi = p0 + m0 + tile::frag_row(e), ni = n0 + nt * 8 + tile::frag_col(e);
        if (pi < geo.headdim && ni < geo.dstate) f(acc[nt], e, pi, ni);
      }
  };
  if (io.initial_states)
    for_each_element([&](tile::FragC& f, int e, int pi, int ni) {
      f.v[e] = io.initial_states[state_offset(io.initial_states_stride, b, h, pi, ni)];
    });

  const int64_t nchunks = edges.chunks(a);
  if (nchunks > 0) stage_chunk(0, 0);
  int32_t seq_prev = 0;
  for (int64_t c = 0; c < nchunks; ++c) {
    edges.enter(a, c, h, for_each_element);
    // The state entering chunk c, for chunk_outputs_sm80.
    StateT* out = reinterpret_cast<StateT*>(a.chunk_states) + chunk_state_index(a, b, c, h);
    if constexpr (sizeof(StateT) == 4) {
      for_each_element([&](tile::FragC& f, int e, int pi, int ni) { out[pi * geo.dstate + ni] = f.v[e]; });
    } else {  // 16-bit states: elements e and e + 1 are adjacent columns, stored as one pair
      for_each_element([&](tile::FragC& f, int e, int pi, int ni) {
        if (e % 2 == 0) tile::store_pair(out + pi * geo.dstate + ni, true, {f.v[e], f.v[e + 1]});
      });
    }
    const int buf = c & 1;
    if (c + 1 < nchunks) {
      stage_chunk(c + 1, buf ^ 1);
      tile::cp_async_wait<1>();
    } else {
      tile::cp_async_wait<0>();
    }
    __syncthreads();

    // The chunk's decay and token weights; a sequence boundary cuts what crosses it.
    const float* g = smem.g[buf];
    const float* dt = smem.dt[buf];
    const int32_t* seq = smem.seq[buf];
    const StateJump jump(g, seq, kChunk, seq_prev);
    jump.weights<kChunk, Shape::kThreads>(g, dt, seq, smem.w);
    seq_prev = seq[kChunk - 1];
    __syncthreads();
#pragma unroll
    for (auto& f : acc)
      for (float& v : f.v) v *= jump.decay;
    add_state_jump<T, kChunk, kStateTile / 8, 4, k3xTf32>(acc, smem.X[buf][0], kLd, smem.B[buf][0], kLd, smem.w, m0, 0);
    edges.exit(a, c, h, for_each_element);
    __syncthreads();  // buffers and weights are rewritten next iteration
  }

  if (io.final_states)
    for_each_element([&](tile::FragC& f, int e, int pi, int ni) {
      io.final_states[state_offset(io.final_states_stride, b, h, pi, ni)] = f.v[e];
    });
}

template <typename T, int kChunk, bool k3xTf32, typename Edges>
__global__ void __launch_bounds__(ChunkStatesShape<T, kChunk>::kThreads)
chunk_states_sm80_kernel(FwdArgs a) {
  extern __shared__ __align__(16) unsigned char smem_bytes[];
  chunk_states_walk<T, kChunk, float, k3xTf32>(a, blockIdx.x, blockIdx.y, blockIdx.z, smem_bytes, Edges{});
}

// The walk of every state tile, head and batch row, in stream order after chunk_cumsum.
template <typename T, int kChunk, bool k3xTf32, typename Edges = NoChunkEdges>
void launch_chunk_states(const FwdArgs& a, cudaStream_t stream) {
  using Shape = ChunkStatesShape<T, kChunk>;
  auto kernel = chunk_states_sm80_kernel<T, kChunk, k3xTf32, Edges>;
  allow_smem(kernel, Shape::kSmemBytes);
  const Geometry& geo = a.geo;
  launch(kernel, "chunk_states_sm80_kernel",
         dim3(state_tiles(geo), static_cast<unsigned>(geo.nheads), static_cast<unsigned>(geo.batch)),
         Shape::kThreads, Shape::kSmemBytes, stream, a);
}

}  // namespace mamba2ssd::cuda
