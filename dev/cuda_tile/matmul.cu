// Feasibility check for issue 7 (CUDA Tile C++): a tile matmul on ct::mma.
//
// C[M,N] (fp32) = A[M,K] * B[K,N], all row-major. One tile block computes one
// BM x BN tile of C and walks K in BK steps; each step loads an A tile and a B
// tile through ct::partition_view and accumulates with ct::mma into an fp32
// accumulator tile. The compiler picks the threads, shared memory, copies and
// the tensor-core instructions.
//
// Cases (all with an fp32 accumulator), in the order they run:
//   f16_nohint  __half inputs, no alignment hints: tileiras 13.5 emits plain
//               16-bit LDG loads + HGMMA (wgmma) on sm_90a -- no TMA.
//   f16         __half inputs with ct::assume_aligned / ct::assume_divisible
//               hints: TMA (UTMALDG/UTMASTG) + HGMMA.
//   bf16        __nv_bfloat16, hints: TMA + HGMMA.BF16.
//   tf32        float loaded, ct::element_cast to __nv_tf32, hints:
//               TMA + HGMMA.TF32.
//   f32         float inputs, hints: tileiras lowers this to FFMA (exact fp32).
// The host reference is computed in double from the (rounded) inputs.
//
// Usage: matmul            run every case in this process
//        matmul CASE...    run only the named cases (run_on_gpu.sh runs each
//                          in its own process, so one sticky error cannot hide
//                          the others)
//
// Exit status: 0 when every case run passes, 1 on a wrong result, 2 on any
// CUDA error (the error name and string are printed), 3 on a bad argument.

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <cuda_tf32.h>
#include <cuda_tile.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
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

constexpr int BM = 64, BN = 64, BK = 32;

// Launched as <<<dim3(N / BN, M / BM), 1>>> (a tile kernel is launched with
// one "thread" per block; the compiler fixes the real block size). M, N, K
// must be multiples of the tile sizes (the host checks), so the unmasked
// load/store is used.
template <typename T, bool kTf32, bool kHints>
__tile_global__ void tile_matmul(const T* a, const T* b, float* c, int m,
                                 int n, int k) {
  using namespace ct::literals;
  if constexpr (kHints) {
    // cudaMalloc'd buffers are 256-byte aligned and the sizes are tile
    // multiples, so every row starts 16-byte aligned: this is what lets the
    // compiler use TMA.
    a = ct::assume_aligned(a, 16_ic);
    b = ct::assume_aligned(b, 16_ic);
    c = ct::assume_aligned(c, 16_ic);
    m = ct::assume_divisible(m, 64_ic);
    n = ct::assume_divisible(n, 64_ic);
    k = ct::assume_divisible(k, 32_ic);
  }
  const int bn = ct::bid().x;
  const int bm = ct::bid().y;
  auto va = ct::partition_view{ct::tensor_span{a, ct::extents{m, k}},
                               ct::shape<BM, BK>{}};
  auto vb = ct::partition_view{ct::tensor_span{b, ct::extents{k, n}},
                               ct::shape<BK, BN>{}};
  auto vc = ct::partition_view{ct::tensor_span{c, ct::extents{m, n}},
                               ct::shape<BM, BN>{}};
  auto acc = ct::zeros<ct::tile<float, ct::shape<BM, BN>>>();
  const int ksteps = k / BK;
  for (int kk = 0; kk < ksteps; ++kk) {
    auto ta = va.load(bm, kk);
    auto tb = vb.load(kk, bn);
    if constexpr (kTf32)
      acc = ct::mma(ct::element_cast<__nv_tf32>(ta),
                    ct::element_cast<__nv_tf32>(tb), acc);
    else
      acc = ct::mma(ta, tb, acc);
  }
  vc.store(acc, bm, bn);
}

static float to_float(__half h) { return __half2float(h); }
static float to_float(__nv_bfloat16 h) { return __bfloat162float(h); }
static float to_float(float f) { return f; }
static void from_float(float f, __half& h) { h = __float2half_rn(f); }
static void from_float(float f, __nv_bfloat16& h) { h = __float2bfloat16_rn(f); }
static void from_float(float f, float& o) { o = f; }

// Returns true on PASS; exits on a CUDA error.
template <typename T, bool kTf32, bool kHints>
static bool run_case(const char* name, int m, int n, int k, double tol) {
  if (m % BM || n % BN || k % BK) {
    std::fprintf(stderr, "[matmul/%s] sizes must be tile multiples\n", name);
    std::exit(3);
  }
  std::vector<T> ha(size_t(m) * k), hb(size_t(k) * n);
  std::vector<float> hc(size_t(m) * n);
  std::mt19937 rng(1234 + m + n + k);
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  for (auto& x : ha) from_float(dist(rng), x);
  for (auto& x : hb) from_float(dist(rng), x);

  auto kernel = tile_matmul<T, kTf32, kHints>;
  // Loads the module if not yet loaded: a failure here is a load failure.
  cudaFuncAttributes fa{};
  CHECK_CUDA(cudaFuncGetAttributes(&fa, kernel));
  std::printf("[matmul/%s] tile kernel attrs: maxThreadsPerBlock=%d "
              "numRegs=%d binaryVersion=%d sharedSizeBytes=%zu\n",
              name, fa.maxThreadsPerBlock, fa.numRegs, fa.binaryVersion,
              fa.sharedSizeBytes);

  T *da = nullptr, *db = nullptr;
  float* dc = nullptr;
  CHECK_CUDA(cudaMalloc(&da, ha.size() * sizeof(T)));
  CHECK_CUDA(cudaMalloc(&db, hb.size() * sizeof(T)));
  CHECK_CUDA(cudaMalloc(&dc, hc.size() * sizeof(float)));
  CHECK_CUDA(cudaMemcpy(da, ha.data(), ha.size() * sizeof(T),
                        cudaMemcpyHostToDevice));
  CHECK_CUDA(cudaMemcpy(db, hb.data(), hb.size() * sizeof(T),
                        cudaMemcpyHostToDevice));
  CHECK_CUDA(cudaMemset(dc, 0xff, hc.size() * sizeof(float)));  // NaNs

  dim3 grid(n / BN, m / BM, 1);
  kernel<<<grid, 1>>>(da, db, dc, m, n, k);
  CHECK_CUDA(cudaGetLastError());
  CHECK_CUDA(cudaDeviceSynchronize());
  CHECK_CUDA(cudaMemcpy(hc.data(), dc, hc.size() * sizeof(float),
                        cudaMemcpyDeviceToHost));
  CHECK_CUDA(cudaFree(da));
  CHECK_CUDA(cudaFree(db));
  CHECK_CUDA(cudaFree(dc));

  double max_err = 0.0, max_ref = 0.0;
  long bad = 0;
  std::vector<double> row(n);
  for (int i = 0; i < m; ++i) {
    for (int j = 0; j < n; ++j) row[j] = 0.0;
    for (int p = 0; p < k; ++p) {
      const double av = to_float(ha[size_t(i) * k + p]);
      const T* brow = &hb[size_t(p) * n];
      for (int j = 0; j < n; ++j) row[j] += av * double(to_float(brow[j]));
    }
    for (int j = 0; j < n; ++j) {
      const double got = hc[size_t(i) * n + j];
      const double e = std::fabs(got - row[j]);
      if (!(e <= tol)) {  // NaN (unwritten output) counts as bad
        if (bad < 5)
          std::fprintf(stderr,
                       "  [%s] mismatch at (%d,%d): got %.6f want %.6f\n",
                       name, i, j, got, row[j]);
        ++bad;
      }
      if (std::isnan(e)) max_err = INFINITY;
      else if (e > max_err) max_err = e;
      if (std::fabs(row[j]) > max_ref) max_ref = std::fabs(row[j]);
    }
  }
  const bool ok = bad == 0;
  std::printf("[matmul/%s] M=%d N=%d K=%d tile=%dx%dx%d max_abs_err=%.3g "
              "(max |ref|=%.3g, tol=%.3g) bad=%ld %s\n",
              name, m, n, k, BM, BN, BK, max_err, max_ref, tol, bad,
              ok ? "PASS" : "FAIL");
  return ok;
}

struct Case {
  const char* name;
  bool (*run)();
};

// Tolerances: 16-bit inputs give exact products in fp32, only the fp32 sums
// round (K=512 sums of |x|<=1: ~1e-4 expected, 1e-2 allowed). TF32 keeps a
// 10-bit mantissa, so each product carries ~1e-3 relative error: a few 1e-2
// at K=256, 0.1 allowed. Plain fp32: ~1e-5 expected.
static const Case kCases[] = {
    {"f16_nohint",
     [] { return run_case<__half, false, false>("f16_nohint", 512, 384, 512, 1e-2); }},
    {"f16",
     [] { return run_case<__half, false, true>("f16", 512, 384, 512, 1e-2); }},
    {"bf16",
     [] { return run_case<__nv_bfloat16, false, true>("bf16", 512, 384, 512, 1e-2); }},
    {"tf32",
     [] { return run_case<float, true, true>("tf32", 256, 192, 256, 0.1); }},
    {"f32",
     [] { return run_case<float, false, true>("f32", 256, 192, 256, 1e-2); }},
};

int main(int argc, char** argv) {
  std::vector<const Case*> todo;
  for (int i = 1; i < argc; ++i) {
    const Case* found = nullptr;
    for (const Case& c : kCases)
      if (std::strcmp(argv[i], c.name) == 0) found = &c;
    if (!found) {
      std::fprintf(stderr, "unknown case '%s'; cases:", argv[i]);
      for (const Case& c : kCases) std::fprintf(stderr, " %s", c.name);
      std::fprintf(stderr, "\n");
      return 3;
    }
    todo.push_back(found);
  }
  if (todo.empty())
    for (const Case& c : kCases) todo.push_back(&c);

  // Versions first: these two calls work even without a usable device, so
  // the output says which driver/runtime pair failed if anything below does.
  int drv = 0, rt = 0;
  CHECK_CUDA(cudaDriverGetVersion(&drv));
  CHECK_CUDA(cudaRuntimeGetVersion(&rt));
  std::printf("[matmul] driver API %d, runtime %d (0 = no driver found)\n",
              drv, rt);
  int dev = 0;
  CHECK_CUDA(cudaSetDevice(dev));
  cudaDeviceProp prop{};
  CHECK_CUDA(cudaGetDeviceProperties(&prop, dev));
  std::printf("[matmul] device: %s (sm_%d%d)\n", prop.name, prop.major,
              prop.minor);

  bool ok = true;
  for (const Case* c : todo) ok &= c->run();
  std::printf("[matmul] %s\n", ok ? "PASS" : "FAIL");
  return ok ? 0 : 1;
}
