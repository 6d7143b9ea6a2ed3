// The launches of fwd_pass_state and compute_out for one element type; included by
// launch_tile_<dtype>.cu only.
#pragma once

#include "cuda/common/check.h"
#include "cuda_tile/launch_tile.h"
#include "cuda_tile/ssd_tile.cuh"

namespace mamba2ssd::cuda_tile {

template <typename T, int Q>
void launch_pass_state(const TileRun& r, cudaStream_t stream) {
  const ForwardParams& p = r.p;
  const int64_t tiles = (p.headdim / kStateP) * ((p.dstate + kStateN - 1) / kStateN);
  const dim3 grid(static_cast<unsigned>(tiles), static_cast<unsigned>(p.nheads), static_cast<unsigned>(p.batch));
  fwd_pass_state_tile<T, Q, kStateP, kStateN><<<grid, 1, 0, stream>>>(
      static_cast<const T*>(p.x), p.x_stride.s0, p.x_stride.s1, p.x_stride.s2,
      static_cast<const T*>(p.B), p.B_stride.s0, p.B_stride.s1, p.B_stride.s2,
      p.initial_states, p.initial_states_stride.s0, p.initial_states_stride.s1, p.initial_states_stride.s2,
      p.final_states, p.final_states_stride.s0, p.final_states_stride.s1, p.final_states_stride.s2,
      r.ws_dt, r.ws_g, r.ws_seq, r.ws_states, p.seqlen, p.nheads, p.headdim, p.dstate, p.nheads / p.ngroups,
      r.layout.nchunks, r.layout.lpad);
  cuda_check(cudaGetLastError(), "fwd_pass_state_tile launch");
}

template <typename T, int Q, int P>
void launch_compute_out(const TileRun& r, cudaStream_t stream) {
  const ForwardParams& p = r.p;
  const dim3 grid(static_cast<unsigned>(r.layout.nchunks), static_cast<unsigned>(p.nheads),
                  static_cast<unsigned>(p.batch));
  compute_out_tile<T, Q, P, kOutN><<<grid, 1, 0, stream>>>(
      static_cast<const T*>(p.x), p.x_stride.s0, p.x_stride.s1, p.x_stride.s2,
      static_cast<const T*>(p.z), p.z_stride.s0, p.z_stride.s1, p.z_stride.s2,
      static_cast<T*>(p.y), p.y_stride.s0, p.y_stride.s1, p.y_stride.s2,
      static_cast<const T*>(p.B), p.B_stride.s0, p.B_stride.s1, p.B_stride.s2,
      static_cast<const T*>(p.C), p.C_stride.s0, p.C_stride.s1, p.C_stride.s2,
      p.D, p.D ? static_cast<int>(p.D_layout) : 0, r.ws_dt, r.ws_g, r.ws_seq, r.ws_states, p.seqlen, p.nheads,
      p.dstate, p.nheads / p.ngroups, r.layout.nchunks, r.layout.lpad);
  cuda_check(cudaGetLastError(), "compute_out_tile launch");
}

template <typename T, int Q>
void launch_chunked(const TileRun& r, cudaStream_t stream) {
  launch_pass_state<T, Q>(r, stream);
  switch (r.p.headdim) {
    case 32: return launch_compute_out<T, Q, 32>(r, stream);
    case 64: return launch_compute_out<T, Q, 64>(r, stream);
    default: return launch_compute_out<T, Q, 128>(r, stream);
  }
}

template <typename T>
void launch_state_and_output(const TileRun& r, cudaStream_t stream) {
  if (r.layout.chunk == 64) launch_chunked<T, 64>(r, stream);
  else launch_chunked<T, 128>(r, stream);
}

}  // namespace mamba2ssd::cuda_tile
