// A consumer of the installed mamba2ssd: one small forward (fp32, 2 x 200 tokens, 4 heads, head dim
// 32, state 16, D per head) on the CPU, and on the GPU when the library has the CUDA backend and a
// GPU is visible, each compared with the library's fp64 oracle (forward_reference). One line per
// backend; exit status 0 only if every run is within the tolerance.
#include <mamba2ssd/mamba2ssd.h>
#include <mamba2ssd/version.h>

#ifdef MAMBA2SSD_HAVE_CUDA  // defined by the target when the library has the CUDA backend
#include <cuda_runtime_api.h>
#endif

#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <vector>

namespace {

using namespace mamba2ssd;

constexpr int64_t kBatch = 2, kSeqlen = 200, kHeads = 4, kHeadDim = 32, kGroups = 1, kState = 16;
constexpr double kTolerance = 2e-3;  // relative L2 against the oracle, the project's bar for fp32

// The inputs on the host, and a ForwardParams over any copy of them (host or device pointers).
struct Problem {
  std::vector<float> x, dt, A, B, C, D;

  Problem() {
    std::mt19937 rng(7);
    std::normal_distribution<float> normal(0.0f, 1.0f);
    std::uniform_real_distribution<float> step(0.01f, 0.1f), decay(-1.5f, -0.5f);
    auto fill = [&](std::vector<float>& v, int64_t n, auto& dist) {
      v.resize(n);
      for (float& e : v) e = dist(rng);
    };
    fill(x, kBatch * kSeqlen * kHeads * kHeadDim, normal);
    fill(dt, kBatch * kSeqlen * kHeads, step);
    fill(A, kHeads, decay);
    fill(B, kBatch * kSeqlen * kGroups * kState, normal);
    fill(C, kBatch * kSeqlen * kGroups * kState, normal);
    fill(D, kHeads, normal);
  }

  int64_t y_size() const { return static_cast<int64_t>(x.size()); }
  int64_t states_size() const { return kBatch * kHeads * kHeadDim * kState; }

  static ForwardParams params(const float* x, const float* dt, const float* A, const float* B, const float* C,
                              const float* D, float* y, float* final_states) {
    ForwardParams p;
    p.batch = kBatch, p.seqlen = kSeqlen, p.nheads = kHeads, p.headdim = kHeadDim;
    p.ngroups = kGroups, p.dstate = kState, p.chunk_size = 64, p.dtype = DType::kF32;
    p.x = x, p.x_stride = contiguous_strides(kBatch, kSeqlen, kHeads, kHeadDim);
    p.dt = dt, p.dt_stride = contiguous_strides(kBatch, kSeqlen, kHeads), p.A = A;
    p.B = B, p.B_stride = contiguous_strides(kBatch, kSeqlen, kGroups, kState);
    p.C = C, p.C_stride = contiguous_strides(kBatch, kSeqlen, kGroups, kState);
    p.D_layout = DLayout::kPerHead, p.D = D;
    p.y = y, p.y_stride = contiguous_strides(kBatch, kSeqlen, kHeads, kHeadDim);
    p.final_states = final_states, p.final_states_stride = contiguous_strides(kBatch, kHeads, kHeadDim, kState);
    return p;
  }
};

double rel_l2(const std::vector<float>& out, const std::vector<float>& ref) {
  double diff = 0.0, norm = 0.0;
  for (std::size_t i = 0; i < ref.size(); ++i) {
    const double d = static_cast<double>(out[i]) - ref[i];
    diff += d * d;
    norm += static_cast<double>(ref[i]) * ref[i];
  }
  return std::sqrt(diff / norm);  // NaN in out gives NaN, which fails the comparison below
}

// Prints "<name>: y ... final states ...: PASS|FAIL" and returns whether both are within the bar.
bool report(const char* name, const std::vector<float>& y, const std::vector<float>& y_ref,
            const std::vector<float>& h, const std::vector<float>& h_ref) {
  const double ey = rel_l2(y, y_ref), eh = rel_l2(h, h_ref);
  const bool pass = ey <= kTolerance && eh <= kTolerance;
  std::printf("%s: rel. L2 error against the fp64 oracle: y %.2e, final states %.2e (tolerance %.0e): %s\n",
              name, ey, eh, kTolerance, pass ? "PASS" : "FAIL");
  return pass;
}

#ifdef MAMBA2SSD_HAVE_CUDA
void check(cudaError_t err, const char* what) {
  if (err != cudaSuccess) throw CudaError(std::string(what) + ": " + cudaGetErrorString(err));
}

// The same call on device copies of the inputs; y and the final states come back to the host.
void forward_on_gpu(const Problem& pb, std::vector<float>& y, std::vector<float>& h) {
  std::vector<void*> buffers;
  auto upload = [&](const std::vector<float>& v) {
    void* d = nullptr;
    check(cudaMalloc(&d, v.size() * sizeof(float)), "cudaMalloc");
    buffers.push_back(d);
    check(cudaMemcpy(d, v.data(), v.size() * sizeof(float), cudaMemcpyHostToDevice), "cudaMemcpy");
    return static_cast<float*>(d);
  };
  try {
    float* x = upload(pb.x);
    float* dt = upload(pb.dt);
    float* A = upload(pb.A);
    float* B = upload(pb.B);
    float* C = upload(pb.C);
    float* D = upload(pb.D);
    float* dy = upload(y);
    float* dh = upload(h);
    forward(Problem::params(x, dt, A, B, C, D, dy, dh), Backend::kCuda);  // synchronizes
    check(cudaMemcpy(y.data(), dy, y.size() * sizeof(float), cudaMemcpyDeviceToHost), "cudaMemcpy");
    check(cudaMemcpy(h.data(), dh, h.size() * sizeof(float), cudaMemcpyDeviceToHost), "cudaMemcpy");
  } catch (...) {
    for (void* d : buffers) cudaFree(d);
    throw;
  }
  for (void* d : buffers) cudaFree(d);
}
#endif

int run() {
  const BuildInfo info = build_info();
  std::printf("mamba2ssd %s (headers %s), CUDA backend: %s%s\n", info.version, MAMBA2SSD_VERSION_STRING,
              info.cuda ? "yes, GPU code " : "no", info.gpu_targets);
  if (std::strcmp(info.version, MAMBA2SSD_VERSION_STRING) != 0) {
    std::printf("FAIL: the headers and the library disagree on the version\n");
    return 1;
  }

  const Problem pb;
  std::vector<float> y_ref(pb.y_size()), h_ref(pb.states_size());
  forward_reference(Problem::params(pb.x.data(), pb.dt.data(), pb.A.data(), pb.B.data(), pb.C.data(), pb.D.data(),
                                    y_ref.data(), h_ref.data()));

  std::vector<float> y(pb.y_size()), h(pb.states_size());
  forward(Problem::params(pb.x.data(), pb.dt.data(), pb.A.data(), pb.B.data(), pb.C.data(), pb.D.data(), y.data(),
                          h.data()),
          Backend::kCpu);
  bool pass = report("cpu", y, y_ref, h, h_ref);

  if (!cuda_available()) {
    std::printf("gpu: skipped (%s)\n", info.cuda ? "no CUDA device visible" : "no CUDA backend in this build");
    return pass ? 0 : 1;
  }
#ifdef MAMBA2SSD_HAVE_CUDA
  std::vector<float> y_gpu(pb.y_size(), NAN), h_gpu(pb.states_size(), NAN);
  forward_on_gpu(pb, y_gpu, h_gpu);
  pass = report("gpu", y_gpu, y_ref, h_gpu, h_ref) && pass;
#endif
  return pass ? 0 : 1;
}

}  // namespace

int main() {
  try {
    return run();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "consumer: %s\n", e.what());
    return 1;
  }
}
