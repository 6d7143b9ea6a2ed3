// Host helpers of the GPU unit tests: a checked CUDA call, a device array freed at scope exit, the
// check after a launch, and the host's view of the element types (bits, conversion from float).
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <vector>

namespace mamba2ssd::testing {

inline void cuda_ok(cudaError_t err, const char* what) {
  if (err != cudaSuccess) throw std::runtime_error(std::string(what) + ": " + cudaGetErrorString(err));
}
#define CUDA_OK(call) ::mamba2ssd::testing::cuda_ok((call), #call)

// Development timings (the disabled *Timing tests): the median, in microseconds, of `runs`
// cudaEvent-timed calls of launch() on the default stream, after `warmup` untimed ones.
template <typename Launch>
double median_launch_us(Launch launch, int warmup = 3, int runs = 20) {
  cudaEvent_t start, stop;
  CUDA_OK(cudaEventCreate(&start));
  CUDA_OK(cudaEventCreate(&stop));
  for (int i = 0; i < warmup; ++i) launch();
  std::vector<float> ms;
  for (int i = 0; i < runs; ++i) {
    cudaEventRecord(start);
    launch();
    cudaEventRecord(stop);
    CUDA_OK(cudaEventSynchronize(stop));
    float t = 0;
    cudaEventElapsedTime(&t, start, stop);
    ms.push_back(t);
  }
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  std::sort(ms.begin(), ms.end());
  return 1000.0 * ms[ms.size() / 2];
}

// A device copy of a host vector (or count uninitialized elements), freed at scope exit.
template <typename T>
struct DeviceArray {
  T* p = nullptr;
  size_t n = 0;
  explicit DeviceArray(size_t count) : n(count) { CUDA_OK(cudaMalloc(&p, n * sizeof(T))); }
  explicit DeviceArray(const std::vector<T>& h) : DeviceArray(h.size()) {
    CUDA_OK(cudaMemcpy(p, h.data(), n * sizeof(T), cudaMemcpyHostToDevice));
  }
  DeviceArray(const DeviceArray&) = delete;
  DeviceArray& operator=(const DeviceArray&) = delete;
  ~DeviceArray() {
    if (p && cudaFree(p) != cudaSuccess) ADD_FAILURE() << "cudaFree failed";
  }
  void poison() { CUDA_OK(cudaMemset(p, 0xFF, n * sizeof(T))); }  // NaN in every float type
  std::vector<T> host() const {
    std::vector<T> h(n);
    CUDA_OK(cudaMemcpy(h.data(), p, n * sizeof(T), cudaMemcpyDeviceToHost));
    return h;
  }
};

// After a launch: its own error, then the kernel's.
inline void launched() {
  CUDA_OK(cudaGetLastError());
  CUDA_OK(cudaDeviceSynchronize());
}

// The bits of a 2- or 4-byte element, for exact comparisons.
template <typename T>
uint32_t bits(T v) {
  static_assert(sizeof(T) == 2 || sizeof(T) == 4);
  if constexpr (sizeof(T) == 2) {
    uint16_t u;
    std::memcpy(&u, &v, 2);
    return u;
  } else {
    uint32_t u;
    std::memcpy(&u, &v, 4);
    return u;
  }
}

// The host's from_float (round to nearest even).
template <typename T>
T host_from_float(float v) {
  if constexpr (std::is_same_v<T, __nv_bfloat16>) return __float2bfloat16_rn(v);
  else if constexpr (std::is_same_v<T, __half>) return __float2half_rn(v);
  else return v;
}

}  // namespace mamba2ssd::testing
