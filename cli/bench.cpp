// mamba2ssd bench: the C++ forward alone over the benchmark shapes. On a GPU, each row is set
// against the floor max(bytes / copy bandwidth, flops / bf16 matmul rate) measured in the same run.
#include <algorithm>
#include <cstdio>

#include "commands.h"
#include "execute.h"
#include "metrics.h"
#include "report.h"

namespace mamba2ssd::cli {
namespace {

struct Shape {
  int64_t b, L, H, P, N, G, Q;
};

// The peers' table (docs/peers.md) plus the headline at chunk 256.
constexpr Shape kShapes[] = {
    {4, 4096, 8, 64, 128, 1, 128},  {4, 16384, 8, 64, 128, 1, 128}, {4, 65536, 8, 64, 128, 1, 128},
    {4, 16384, 8, 64, 64, 1, 128},  {4, 16384, 8, 64, 256, 1, 128}, {8, 2048, 80, 64, 128, 1, 128},
    {1, 8192, 80, 64, 128, 1, 128}, {2, 4096, 128, 64, 128, 8, 128}, {4, 16384, 8, 64, 128, 1, 256},
};
constexpr int kQuick[] = {0, 1, 5};  // 4x4096, the headline, Mamba-2 2.7B
constexpr int64_t kCpuShrink = 16;   // without a GPU: seqlen / 16

testing::ProblemConfig config_of(const Shape& s, uint64_t seed) {
  testing::ProblemConfig c;
  c.batch = s.b, c.seqlen = s.L, c.nheads = s.H, c.headdim = s.P, c.dstate = s.N, c.ngroups = s.G;
  c.chunk_size = s.Q;
  c.dtype = DType::kBF16;
  c.D_layout = DLayout::kPerHead;
  c.seed = seed;
  return c;
}

struct Row {
  testing::ProblemConfig config;
  Work work;
  Timing timing;
  double floor_s = 0.0;
  std::vector<testing::Comparison> cmps;
  std::string error;
  bool pass() const { return error.empty() && testing::all_pass(cmps); }
};

}  // namespace

int bench_command(const Args& args) {
  const Backend backend = impl_flag(args);
  const CudaPath path = path_flag(args, backend);
  const bool on_gpu = backend == Backend::kCuda;
  const int threads = threads_flag(args);
  const bool quick = args.has("--quick") || !on_gpu;
  const int repeats = static_cast<int>(args.get_int("--repeats", on_gpu ? 100 : 3, 1, 1000000));
  const int warmup = on_gpu ? 5 : backend == Backend::kReference ? 0 : 1;
  const bool json = args.has("--json");

  std::vector<Shape> shapes;
  if (quick) {
    for (int i : kQuick) shapes.push_back(kShapes[i]);
  } else {
    shapes.assign(std::begin(kShapes), std::end(kShapes));
  }
  if (!on_gpu)
    for (Shape& s : shapes) s.L /= kCpuShrink;

  gpu::Floor floor;
  const std::string device = describe_backend(backend, threads);
  if (on_gpu) floor = gpu::measure_floor();
  if (!json) {
    std::printf("mamba2ssd bench: %s, path %s; bf16, D per head; median of %d %s, %s\n", device.c_str(),
                to_string(path), repeats,
                on_gpu ? "launches (cudaEvents, L2 cleared before each)" : "runs",
                warmup ? fmt("after %d warm-up", warmup).c_str() : "no warm-up");
    if (on_gpu) {
      std::printf("floor: copy %s, bf16 matmul %s\n",
                  floor.copy_bytes_per_s > 0 ? fmt("%.0f GB/s (1 GiB cudaMemcpyAsync, read + write)", floor.copy_bytes_per_s * 1e-9).c_str()
                                             : ("not measured: " + floor.copy_error).c_str(),
                  floor.matmul_flops_per_s > 0 ? fmt("%.1f TFLOP/s (cublasGemmEx 8192^3)", floor.matmul_flops_per_s * 1e-12).c_str()
                                               : ("not measured: " + floor.matmul_error).c_str());
    } else {
      std::printf("no floor column: the floor is measured on a GPU, and this run has none; three rows at seqlen / %lld\n",
                  static_cast<long long>(kCpuShrink));
    }
    std::printf("%3s %6s %4s %4s %4s %3s %4s  %10s %9s %9s", "b", "L", "H", "P", "N", "G", "Q", "time", "GB/s",
                on_gpu ? "TFLOP/s" : "GFLOP/s");
    if (on_gpu) std::printf(" %10s %8s", "floor", "of floor");
    std::printf("  %s\n", "check (y rel L2, batch 0, heads 0..1)");
    std::fflush(stdout);
  }

  std::vector<Row> rows;
  for (const Shape& s : shapes) {
    Row r;
    r.config = config_of(s, 0);
    r.config.cuda_path = path;
    try {
      testing::HostProblem problem(r.config);
      r.work = count_work(problem.params());
      r.floor_s = on_gpu ? floor.floor_seconds(r.work.bytes, r.work.flops) : 0.0;
      const Execution e = execute(problem, backend, warmup, repeats, threads);
      r.timing = e.timing;
      reference::Slice slice;
      slice.batch_end = 1, slice.head_end = std::min<int64_t>(2, s.H);
      r.cmps = testing::compare_with_oracle(problem, e.outputs(problem), slice);
    } catch (const std::exception& ex) {
      r.error = ex.what();
    }
    if (!json) {
      std::printf("%3lld %6lld %4lld %4lld %4lld %3lld %4lld", static_cast<long long>(s.b), static_cast<long long>(s.L),
                  static_cast<long long>(s.H), static_cast<long long>(s.P), static_cast<long long>(s.N),
                  static_cast<long long>(s.G), static_cast<long long>(s.Q));
      if (!r.error.empty()) {
        std::printf("  error: %s\n", r.error.c_str());
      } else {
        const double t = r.timing.median();
        const double rate = r.work.flops / t * (on_gpu ? 1e-12 : 1e-9);
        std::printf("  %10s %9s %9s", fmt_time(t).c_str(), fmt_rate(r.work.bytes / t * 1e-9).c_str(), fmt_rate(rate).c_str());
        if (on_gpu) std::printf(" %10s %8.3f", fmt_time(r.floor_s).c_str(), r.floor_s / t);
        const std::string y = r.cmps.empty() ? "-" : fmt_sci(r.cmps.front().rel_l2);
        std::printf("  %s %s\n", r.pass() ? "PASS" : "FAIL", y.c_str());
      }
      std::fflush(stdout);
    }
    rows.push_back(std::move(r));
  }
  const bool pass = std::all_of(rows.begin(), rows.end(), [](const Row& r) { return r.pass(); });

  if (json) {
    std::vector<std::string> items;
    for (const Row& r : rows) {
      JsonObject o;
      o.raw("problem", config_json(r.config).dump());
      if (r.error.empty()) {
        const double t = r.timing.median();
        std::vector<std::string> errs;
        for (const auto& c : r.cmps) errs.push_back(comparison_json(c).dump());
        o.num("time_s", t)
            .num("time_min_s", r.timing.min())
            .num("time_max_s", r.timing.max())
            .num("bytes", r.work.bytes)
            .num("flops", r.work.flops)
            .num("GBps", r.work.bytes / t * 1e-9)
            .num("TFLOPps", r.work.flops / t * 1e-12);
        if (on_gpu) o.num("floor_s", r.floor_s).num("fraction_of_floor", r.floor_s / t);
        o.raw("errors", json_array(errs));
      } else {
        o.str("error", r.error);
      }
      o.boolean("pass", r.pass());
      items.push_back(o.dump());
    }
    JsonObject out;
    out.str("command", "bench").str("backend", to_string(backend)).str("device", device);
    out.integer("warmup", warmup).integer("repeats", repeats).boolean("quick", quick);
    if (on_gpu) {
      JsonObject f;
      f.num("copy_GBps", floor.copy_bytes_per_s * 1e-9).num("copy_bytes", floor.copy_bytes);
      f.num("matmul_TFLOPps", floor.matmul_flops_per_s * 1e-12);
      if (!floor.copy_error.empty()) f.str("copy_error", floor.copy_error);
      if (!floor.matmul_error.empty()) f.str("matmul_error", floor.matmul_error);
      out.raw("floor", f.dump());
    } else {
      out.integer("seqlen_divided_by", kCpuShrink);
    }
    out.raw("rows", json_array(items)).boolean("pass", pass);
    std::printf("%s\n", out.dump().c_str());
  }
  return pass ? 0 : 1;
}

}  // namespace mamba2ssd::cli
