// The GPU code this build carries (build_info().gpu_targets, parsed from the nvcc -gencode flags):
// every NVIDIA GPU from sm_80 up must find code in it, SASS for sm_80 (and its minor versions),
// sm_90a (the Hopper path) and the Blackwell data-center GPUs sm_100 and sm_103, and PTX (a
// compute_XY entry) that a GPU newer than the build JIT-compiles. Without it such a GPU fails every
// call with "no kernel image". Also: a GPU below sm_80 is refused by name (current_device()).
#include <gtest/gtest.h>

#include <cstdio>
#include <set>
#include <sstream>
#include <string>
#include <utility>

#include "mamba2ssd/mamba2ssd.h"
#ifdef MAMBA2SSD_HAVE_CUDA
#include "cuda/common/device.h"
#endif

namespace mamba2ssd {
namespace {

std::set<std::string> targets() {
  std::set<std::string> out;
  std::istringstream in(build_info().gpu_targets);
  for (std::string t; in >> t;) out.insert(t);
  return out;
}

TEST(GpuTargets, CoverEveryGpuFromSm80Up) {
  const BuildInfo info = build_info();
  if (!info.cuda) GTEST_SKIP() << "built without the CUDA backend: no GPU code to list";
  const std::set<std::string> t = targets();
  std::printf("GPU targets of this build: %s\n", info.gpu_targets);
  ASSERT_FALSE(t.empty()) << "a CUDA build carries GPU code";
  for (const std::string& name : t)
    EXPECT_TRUE(name.rfind("sm_", 0) == 0 || name.rfind("compute_", 0) == 0) << "unexpected target " << name;
#ifdef MAMBA2SSD_GENCODE_OVERRIDDEN
  GTEST_SKIP() << "MAMBA2SSD_CUDA_GENCODE is set by hand in this build (targets: " << info.gpu_targets
               << "); the default's targets are checked in a build that keeps it";
#endif
  for (const char* sass : {"sm_80", "sm_90a", "sm_100", "sm_103"})
    EXPECT_TRUE(t.count(sass)) << "no " << sass << " code in \"" << info.gpu_targets << "\"";
  // PTX at most as new as the oldest supported GPU, so that every GPU from sm_80 up can JIT it.
  bool ptx = false;
  for (const std::string& name : t)
    if (name.rfind("compute_", 0) == 0) ptx = ptx || name == "compute_80";
  EXPECT_TRUE(ptx) << "no compute_80 PTX in \"" << info.gpu_targets << "\": a GPU newer than the build has no code";
}

TEST(GpuTargets, RefusesGpusBelowSm80ByName) {
#ifndef MAMBA2SSD_HAVE_CUDA
  GTEST_SKIP() << "built without the CUDA backend";
#else
  // The check current_device() makes on the real GPU, asked of the architectures around the line.
  EXPECT_EQ(cuda::unsupported_arch(7, 5), "this GPU is sm_75; mamba2ssd's CUDA backend needs sm_80 or newer");
  EXPECT_NE(cuda::unsupported_arch(7, 0).find("sm_70"), std::string::npos);
  EXPECT_NE(cuda::unsupported_arch(6, 1).find("sm_61"), std::string::npos);
  for (auto [major, minor] : {std::pair{8, 0}, {8, 6}, {8, 9}, {9, 0}, {10, 0}, {10, 3}, {12, 0}})
    EXPECT_EQ(cuda::unsupported_arch(major, minor), "") << major << "." << minor;
#endif
}

}  // namespace
}  // namespace mamba2ssd
