// Whether the forward's CUDA paths fit the shared memory a block may take on the GPU at hand, a host
// computation that needs no GPU: on a GPU with less than the H200's 227 KiB (an A100's 163 KiB,
// an sm_86 or sm_89's 99 KiB) a path whose tiles do not fit refuses the call, so that auto goes on
// to one that fits (or says that none does), where the launch used to fail.
#include <gtest/gtest.h>

#include <cstdint>
#include <string>

#include "mamba2ssd/mamba2ssd.h"
#ifdef MAMBA2SSD_HAVE_CUDA
#include "cuda/fwd/paths.h"
#endif

namespace mamba2ssd {
namespace {

#ifdef MAMBA2SSD_HAVE_CUDA
// A GPU's multiprocessors, compute capability and opt-in shared memory per block, as
// cudaDeviceGetAttribute reports them.
cuda::DeviceInfo gpu(int sm_count, int major, int minor, int smem_per_block) {
  cuda::DeviceInfo d;
  d.sm_count = sm_count, d.major = major, d.minor = minor, d.smem_per_block = smem_per_block;
  return d;
}
const cuda::DeviceInfo kH200 = gpu(132, 9, 0, 232448), kA100 = gpu(108, 8, 0, 166912);
const cuda::DeviceInfo kL40 = gpu(142, 8, 9, 101376);  // sm_89

ForwardParams call(DType dtype, int64_t headdim, int64_t dstate, int64_t chunk = 128) {
  ForwardParams p;
  p.batch = 2, p.seqlen = 1000, p.nheads = 8, p.headdim = headdim, p.dstate = dstate, p.chunk_size = chunk;
  p.dtype = dtype;
  return p;
}

bool takes(const cuda::FwdPath& path, const ForwardParams& p, const cuda::DeviceInfo& d) {
  return path.refusal(p, d).empty();
}

TEST(DeviceFit, TheH200TakesEveryPortableForm) {
  for (DType t : {DType::kBF16, DType::kF16, DType::kF32})
    for (int64_t P : {32, 64, 80, 128}) {
      EXPECT_TRUE(takes(cuda::kFusedPath, call(t, P, 128), kH200)) << to_string(t) << " P " << P;
      EXPECT_TRUE(takes(cuda::kThreeKernelPath, call(t, P, 256), kH200)) << to_string(t) << " P " << P;
      EXPECT_EQ(cuda::three_kernel_chunk(call(t, P, 256), kH200), 128);
      EXPECT_EQ(cuda::three_kernel_chunk(call(t, P, 256, 64), kH200), 64);
    }
}

TEST(DeviceFit, AnA100RunsTheThreeKernelPathWhereTheFusedWalkDoesNotFit) {
  const ForwardParams p = call(DType::kBF16, 64, 128);  // the Mamba-2 layer's shape
  const std::string why = cuda::kFusedPath.refusal(p, kA100);
  EXPECT_NE(why.find("bytes of shared memory per block (dtype bf16, state size 128), this sm_80 GPU allows 166912"),
            std::string::npos)
      << why;
  EXPECT_TRUE(takes(cuda::kThreeKernelPath, p, kA100));
  EXPECT_EQ(cuda::three_kernel_chunk(p, kA100), 128);
  // fp32 with head dim 128: chunk 128's tiles (175616 bytes) do not fit, chunk 64's do.
  const ForwardParams f32 = call(DType::kF32, 128, 128);
  EXPECT_TRUE(takes(cuda::kThreeKernelPath, f32, kA100));
  EXPECT_EQ(cuda::three_kernel_chunk(f32, kA100), 64);
  EXPECT_EQ(cuda::kThreeKernelPath.plan(f32, kA100).chunk, 64);
}

TEST(DeviceFit, AnSm89GpuRefusesWhatDoesNotFitByName) {
  for (int64_t N : {64, 128})
    EXPECT_FALSE(takes(cuda::kFusedPath, call(DType::kBF16, 64, N), kL40)) << "N " << N;
  EXPECT_TRUE(takes(cuda::kThreeKernelPath, call(DType::kBF16, 64, 128), kL40));
  const std::string why = cuda::kThreeKernelPath.refusal(call(DType::kF32, 128, 128), kL40);
  EXPECT_NE(why.find("(dtype fp32, head dim 128, chunk 64), this sm_89 GPU allows 101376"), std::string::npos) << why;
}
#else
TEST(DeviceFit, NeedsTheCudaBackend) { GTEST_SKIP() << "built without the CUDA backend: no CUDA paths"; }
#endif

}  // namespace
}  // namespace mamba2ssd
