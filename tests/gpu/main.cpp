// GPU test entry: without a CUDA device, say so and exit 77 (CTest: skipped).
#include <gtest/gtest.h>

#include <cstdio>

#include "mamba2ssd/mamba2ssd.h"

int main(int argc, char** argv) {
  if (!mamba2ssd::cuda_available()) {
    std::printf("SKIPPED: no CUDA device visible; the GPU tests need one\n");
    return 77;
  }
  ::testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}
