// The forward's CUDA paths behind one small host interface (CUTLASS's can-implement / workspace /
// run): why a path cannot run a call, how it would run it (the plan, whose total() is the
// workspace it needs), and the launch. dispatch.cpp holds the one ordered registry that auto walks.
// Every function takes a call that validate() accepted.
#pragma once

#include <string>

#include "cuda/common/device.h"
#include "cuda/fwd/plan.h"

namespace mamba2ssd::cuda {

struct FwdPath {
  CudaPath id;
  bool auto_picks;  // auto takes the first path of the registry that picks and runs a call
  // Whether it writes ForwardParams::saved_states itself for p (null: never); where it does not,
  // forward_cuda runs a walk of their own after it (launch_saved_states_walk).
  bool (*saves_states)(const ForwardParams& p);
  std::string (*refusal)(const ForwardParams& p, const DeviceInfo& d);  // empty: it runs p
  FwdPlan (*plan)(const ForwardParams& p, const DeviceInfo& d);
  void (*launch)(const ForwardParams& p, const FwdPlan& plan, void* workspace, void* stream);
};

extern const FwdPath kSm90Path;         // hopper: the fused walk on TMA and wgmma (hopper_path.cu)
extern const FwdPath kFusedPath;        // fused: the state stays on chip (fused_path.cu)
extern const FwdPath kThreeKernelPath;  // the seed's three kernels, every feature (three_kernel_path.cu)
extern const FwdPath kCudaTilePath;     // the seed's kernels in CUDA Tile C++ (src/cuda_tile)

// The three-kernel path's chunk for p (the forward's and the packed prefill's): 64 if asked for, else
// 128 where its tiles fit the device's shared memory per block (fp32 with head dim 128 does not on an
// sm_80), else 64.
int64_t three_kernel_chunk(const ForwardParams& p, const DeviceInfo& d);

// True if this build holds sm_90a code of the wgmma kernels (hopper_path.cu).
bool sm90_kernels_built();

// The packed prefill on the hopper path (src/cuda/prefill; kSm90Path.refusal decides whether it
// runs): the plan over `nchunks` padded chunks of Sm90Step::kChunk tokens (chunk_cumsum's sections,
// one segment), and the launch of chunk_cumsum and the walk on args carrying the chunk map and the
// cache (FwdArgs::prefill), after padded_chunks_kernel.
struct FwdArgs;
FwdPlan sm90_prefill_plan(const ForwardParams& p, const DeviceInfo& d, int64_t nchunks);
void launch_sm90_prefill(const ForwardParams& p, const FwdArgs& a, void* stream);

}  // namespace mamba2ssd::cuda
