// The CPU backends' thread pool (src/cpu/parallel.h): every item runs once, and a thread count past
// the hardware's starts no more than four threads per hardware thread.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <climits>
#include <thread>
#include <vector>

#include "cpu/parallel.h"

namespace mamba2ssd::cpu {
namespace {

TEST(ParallelFor, EveryItemOnceAndAtMostFourThreadsPerHardwareThread) {
  const int hardware = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  for (int asked : {0, 1, 3, 4 * hardware, INT_MAX}) {
    SCOPED_TRACE(asked);
    constexpr int64_t kItems = 20000;
    std::vector<std::atomic<int>> runs(kItems);
    std::atomic<int> workers{0};
    parallel_for(kItems, asked, [&] {
      ++workers;
      return [&](int64_t i) { ++runs[static_cast<std::size_t>(i)]; };
    });
    for (int64_t i = 0; i < kItems; ++i) ASSERT_EQ(runs[static_cast<std::size_t>(i)].load(), 1) << "item " << i;
    EXPECT_GE(workers.load(), 1);
    EXPECT_LE(workers.load(), asked <= 0 ? hardware : std::min(asked, 4 * hardware));
  }
}

}  // namespace
}  // namespace mamba2ssd::cpu
