// Feasibility check for issue 7 (CUDA Tile C++): a tile vector add.
//
// One tile block handles TILE consecutive elements; the last block is partial
// (N is deliberately not a multiple of TILE) so the masked load/store path of
// ct::partition_view is exercised too.
//
// Before the tile kernel, a plain SIMT kernel from the same translation unit
// runs, so that "the runtime/driver pair works at all" and "tile kernels work"
// are told apart in the output.
//
// Build: see dev/cuda_tile/setup_toolchain.sh (nvcc >= 13.3, -enable-tile
// -std=c++20, an sm_80+ target).
//
// Exit status: 0 on PASS, 1 on a wrong result, 2 on any CUDA error.

#include <cuda_runtime.h>
#include <cuda_tile.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <vector>

#define CHECK_CUDA(call)                                                      \
  do {                                                                        \
    cudaError_t err_ = (call);                                                \
    if (err_ != cudaSuccess) {                                                \
      std::fflush(stdout);                                                    \
      std::fprintf(stderr, "CUDA error at %s:%d: %s\n  -> %s: %s\n",          \
                   __FILE__, __LINE__, #call, cudaGetErrorName(err_),         \
                   cudaGetErrorString(err_));                                 \
      std::exit(2);                                                           \
    }                                                                         \
  } while (0)

namespace ct = cuda::tiles;
using namespace ct::literals;

constexpr int kTile = 1024;

// Launched as <<<num_tiles, 1>>>: a tile kernel's block size must be 1; the
// compiler decides how many threads actually run one tile block.
__tile_global__ void tile_vector_add(const float* a, const float* b, float* c,
                                     int n) {
  auto blk = ct::bid().x;
  auto va = ct::partition_view{ct::tensor_span{a, ct::extents{n}},
                               ct::shape{1024_ic}};
  auto vb = ct::partition_view{ct::tensor_span{b, ct::extents{n}},
                               ct::shape{1024_ic}};
  auto vc = ct::partition_view{ct::tensor_span{c, ct::extents{n}},
                               ct::shape{1024_ic}};
  auto ta = va.load_masked(blk);
  auto tb = vb.load_masked(blk);
  vc.store_masked(ta + tb, blk);
}

// Plain SIMT kernel (ordinary __global__, launched with real threads).
__global__ void simt_iota(int* out, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) out[i] = 3 * i + 1;
}

static void simt_baseline() {
  const int n = 4096;
  int* d = nullptr;
  std::vector<int> h(n, 0);
  CHECK_CUDA(cudaMalloc(&d, n * sizeof(int)));
  simt_iota<<<(n + 255) / 256, 256>>>(d, n);
  CHECK_CUDA(cudaGetLastError());
  CHECK_CUDA(cudaDeviceSynchronize());
  CHECK_CUDA(cudaMemcpy(h.data(), d, n * sizeof(int), cudaMemcpyDeviceToHost));
  CHECK_CUDA(cudaFree(d));
  for (int i = 0; i < n; ++i) {
    if (h[i] != 3 * i + 1) {
      std::printf("[vector_add] SIMT baseline kernel: wrong value at %d\n", i);
      std::printf("[vector_add] FAIL\n");
      std::exit(1);
    }
  }
  std::printf("[vector_add] SIMT baseline kernel: OK\n");
}

int main() {
  // Versions first: these two calls work even without a usable device, so
  // the output says which driver/runtime pair failed if anything below does.
  int drv = 0, rt = 0;
  CHECK_CUDA(cudaDriverGetVersion(&drv));
  CHECK_CUDA(cudaRuntimeGetVersion(&rt));
  std::printf("[vector_add] driver API %d, runtime %d (0 = no driver found)\n",
              drv, rt);
  int dev = 0;
  CHECK_CUDA(cudaSetDevice(dev));
  cudaDeviceProp prop{};
  CHECK_CUDA(cudaGetDeviceProperties(&prop, dev));
  std::printf("[vector_add] device: %s (sm_%d%d)\n", prop.name, prop.major,
              prop.minor);

  simt_baseline();

  // Loading the tile module happens here at the latest; print what the
  // runtime reports for the tile kernel (a failure here is a load error).
  cudaFuncAttributes fa{};
  CHECK_CUDA(cudaFuncGetAttributes(&fa, tile_vector_add));
  std::printf("[vector_add] tile kernel attrs: maxThreadsPerBlock=%d numRegs=%d "
              "binaryVersion=%d ptxVersion=%d sharedSizeBytes=%zu\n",
              fa.maxThreadsPerBlock, fa.numRegs, fa.binaryVersion,
              fa.ptxVersion, fa.sharedSizeBytes);

  const int n = 1 << 20 | 123;  // not a multiple of kTile: last tile is masked
  std::vector<float> ha(n), hb(n), hc(n, -1.0f), ref(n);
  std::mt19937 rng(7);
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  for (int i = 0; i < n; ++i) {
    ha[i] = dist(rng);
    hb[i] = dist(rng);
    ref[i] = ha[i] + hb[i];
  }

  float *da = nullptr, *db = nullptr, *dc = nullptr;
  const size_t bytes = size_t(n) * sizeof(float);
  CHECK_CUDA(cudaMalloc(&da, bytes));
  CHECK_CUDA(cudaMalloc(&db, bytes));
  CHECK_CUDA(cudaMalloc(&dc, bytes));
  CHECK_CUDA(cudaMemcpy(da, ha.data(), bytes, cudaMemcpyHostToDevice));
  CHECK_CUDA(cudaMemcpy(db, hb.data(), bytes, cudaMemcpyHostToDevice));
  CHECK_CUDA(cudaMemset(dc, 0xff, bytes));  // NaN pattern: catches unwritten

  const int blocks = (n + kTile - 1) / kTile;
  tile_vector_add<<<blocks, 1>>>(da, db, dc, n);
  CHECK_CUDA(cudaGetLastError());
  CHECK_CUDA(cudaDeviceSynchronize());
  CHECK_CUDA(cudaMemcpy(hc.data(), dc, bytes, cudaMemcpyDeviceToHost));

  double max_err = 0.0;
  int bad = 0;
  for (int i = 0; i < n; ++i) {
    double e = std::fabs(double(hc[i]) - double(ref[i]));
    if (!(e <= 0.0)) {  // a + b in fp32 must be bit-exact; NaN counts as bad
      if (bad < 5)
        std::fprintf(stderr, "  mismatch at %d: got %g want %g\n", i, hc[i],
                     ref[i]);
      ++bad;
    }
    if (!(e <= max_err)) max_err = std::isnan(e) ? INFINITY : e;
  }
  CHECK_CUDA(cudaFree(da));
  CHECK_CUDA(cudaFree(db));
  CHECK_CUDA(cudaFree(dc));

  std::printf("[vector_add] n=%d tile=%d blocks=%d max_abs_err=%g bad=%d\n", n,
              kTile, blocks, max_err, bad);
  std::printf("[vector_add] %s\n", bad == 0 ? "PASS" : "FAIL");
  return bad == 0 ? 0 : 1;
}
