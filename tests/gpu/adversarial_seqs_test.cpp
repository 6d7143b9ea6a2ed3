// GPU input safety: forward_cuda never reads the contents of cu_seqlens or seq_idx on the host (no
// sync in the launch path), so the kernels must stay inside every buffer whatever those contents
// are (docs/reliability.md, "Device contents"). Each case overwrites them with hostile values
// (decreasing, negative, past the end, 2^62, the int extremes, all zeros) and runs every CUDA path
// that takes the call; every buffer (inputs, outputs, the workspace) sits between two guard regions
// filled with a byte pattern, and the outputs are poisoned with NaN. Checked: no CUDA error, every
// guard byte untouched (a write past an end inside the allocation, which memcheck cannot see), and
// every output element written and finite (unwritten poison is NaN). Meant to be run under
// compute-sanitizer --tool memcheck too, which sees reads and writes past the allocations.
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <limits>
#include <map>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "api/internal.h"
#include "test_matrix.h"
#include "testing/problem.h"

namespace mamba2ssd::testing {
namespace {

constexpr std::size_t kGuard = 4096;  // bytes each side; keeps cudaMalloc's 256-byte alignment
constexpr uint8_t kPattern = 0xA5;

void ok(cudaError_t err, const std::string& what) {
  if (err != cudaSuccess) throw std::runtime_error(what + ": " + cudaGetErrorName(err) + ": " + cudaGetErrorString(err));
}

// One device buffer between two guard regions of kPattern.
struct Guarded {
  uint8_t* base = nullptr;
  std::size_t bytes = 0;  // the payload's
  explicit Guarded(std::size_t n) : bytes(n) {
    ok(cudaMalloc(reinterpret_cast<void**>(&base), n + 2 * kGuard), "cudaMalloc");
    ok(cudaMemset(base, kPattern, n + 2 * kGuard), "cudaMemset(guards)");
  }
  Guarded(const Guarded&) = delete;
  Guarded& operator=(const Guarded&) = delete;
  ~Guarded() { cudaFree(base); }
  void* payload() const { return base + kGuard; }
  // The whole allocation, guards included.
  std::vector<uint8_t> all() const {
    std::vector<uint8_t> h(bytes + 2 * kGuard);
    ok(cudaMemcpy(h.data(), base, h.size(), cudaMemcpyDeviceToHost), "cudaMemcpy(download)");
    return h;
  }
  // Describes the first changed guard byte, or "" if both guards are intact.
  std::string broken_guard() const {
    const std::vector<uint8_t> h = all();
    for (std::size_t i = 0; i < kGuard; ++i)
      if (h[i] != kPattern) return "written " + std::to_string(kGuard - i) + " bytes before the start";
    for (std::size_t i = 0; i < kGuard; ++i)
      if (h[kGuard + bytes + i] != kPattern) return "written " + std::to_string(i) + " bytes past the end";
    return "";
  }
};

// A HostProblem on the GPU with every buffer and the workspace guarded, outputs poisoned (0xff: NaN).
class GuardedProblem {
 public:
  GuardedProblem(const HostProblem& host, CudaPath path) {
    for (const auto& [name, buf] : host.buffers) {
      auto& g = bufs_[name] = std::make_unique<Guarded>(buf.size());
      if (HostProblem::is_output(name)) ok(cudaMemset(g->payload(), 0xff, buf.size()), "cudaMemset(poison)");
      else ok(cudaMemcpy(g->payload(), buf.data(), buf.size(), cudaMemcpyHostToDevice), "cudaMemcpy(upload)");
    }
    p_ = host.params([this](const std::string& name) { return bufs_.at(name)->payload(); });
    p_.cuda_path = path;
    workspace_ = std::make_unique<Guarded>(cuda_workspace_bytes(p_));
  }
  void run() {
    forward_cuda(p_, workspace_->payload(), workspace_->bytes, nullptr);
    ok(cudaGetLastError(), "launch");
    ok(cudaDeviceSynchronize(), "cudaDeviceSynchronize after forward_cuda");
  }
  // Every broken guard, one line each.
  std::string broken_guards() const {
    std::string out;
    for (const auto& [name, g] : bufs_)
      if (std::string why = g->broken_guard(); !why.empty()) out += name + ": " + why + "\n";
    if (std::string why = workspace_->broken_guard(); !why.empty()) out += "workspace: " + why + "\n";
    return out;
  }
  void* payload(const std::string& name) const { return bufs_.at(name)->payload(); }
  std::map<std::string, std::vector<uint8_t>> outputs() const {
    std::map<std::string, std::vector<uint8_t>> out;
    for (const auto& [name, g] : bufs_)
      if (HostProblem::is_output(name)) {
        const std::vector<uint8_t> h = g->all();
        out[name].assign(h.begin() + kGuard, h.begin() + kGuard + g->bytes);
      }
    return out;
  }

 private:
  std::map<std::string, std::unique_ptr<Guarded>> bufs_;
  std::unique_ptr<Guarded> workspace_;
  ForwardParams p_;
};

// Non-finite elements of an output: y in the problem's dtype, the states fp32. The buffers are the
// views' whole extents (padding of strided layouts included): with contiguous layouts every byte
// is an element the backend must write.
int64_t nonfinite(const std::string& name, const std::vector<uint8_t>& bytes, DType dtype) {
  int64_t bad = 0;
  if (name == "y" && dtype != DType::kF32) {
    const uint16_t mask = dtype == DType::kBF16 ? 0x7F80 : 0x7C00;
    for (std::size_t i = 0; i + 1 < bytes.size(); i += 2) {
      uint16_t u;
      std::memcpy(&u, &bytes[i], 2);
      bad += (u & mask) == mask;
    }
  } else {
    for (std::size_t i = 0; i + 3 < bytes.size(); i += 4) {
      uint32_t u;
      std::memcpy(&u, &bytes[i], 4);
      bad += (u & 0x7F800000u) == 0x7F800000u;
    }
  }
  return bad;
}

// Packed sequences of 50, 150 and 133 tokens (S = 3, L = 333): bf16, head dim 64, state size 64,
// so that the fused and hopper paths take it too.
ProblemConfig packed(bool seq_idx, bool cu_seqlens, bool varlen_states, int64_t chunk = 128) {
  ProblemConfig c;
  c.batch = 1, c.seqlen = 333, c.nheads = 4, c.headdim = 64, c.dstate = 64, c.ngroups = 2;
  c.chunk_size = chunk, c.dtype = DType::kBF16;
  c.seqlens = {50, 150, 133};
  c.seq_idx = seq_idx, c.cu_seqlens = cu_seqlens, c.varlen_states = varlen_states;
  c.seed = 2026;
  return c;
}

constexpr int64_t kI64Min = std::numeric_limits<int64_t>::min(), kI64Max = std::numeric_limits<int64_t>::max();
constexpr int32_t kI32Min = std::numeric_limits<int32_t>::min(), kI32Max = std::numeric_limits<int32_t>::max();

// Hostile cu_seqlens for S = 3, L = 333 (4 offsets), by name.
const std::vector<std::pair<std::string, std::vector<int64_t>>>& bad_cu_seqlens() {
  static const std::vector<std::pair<std::string, std::vector<int64_t>>> v = {
      {"decreasing", {0, 300, 100, 333}},
      {"all_decreasing", {333, 200, 100, 0}},
      {"negative", {0, -7, -1000000, 333}},
      {"negative_start", {-50, 20, 40, 333}},
      {"past_the_end", {0, 100, 5000, int64_t{1} << 40}},
      {"huge_2to62", {0, int64_t{1} << 62, int64_t{1} << 62, int64_t{1} << 62}},
      {"int64_extremes", {kI64Min, kI64Max, kI64Min, kI64Max}},
      {"zeros", {0, 0, 0, 0}},
      {"ends_early", {0, 10, 20, 30}},
  };
  return v;
}

// Hostile seq_idx for L tokens, by name.
std::vector<std::pair<std::string, std::vector<int32_t>>> bad_seq_idx(int64_t L) {
  std::vector<std::pair<std::string, std::vector<int32_t>>> v;
  auto add = [&](const std::string& name, auto f) {
    std::vector<int32_t> s(L);
    for (int64_t t = 0; t < L; ++t) s[t] = f(t);
    v.emplace_back(name, s);
  };
  add("decreasing", [&](int64_t t) { return static_cast<int32_t>(L - t); });
  add("negative", [](int64_t t) { return static_cast<int32_t>(-1 - t); });
  add("int32_extremes", [](int64_t t) { return t % 2 ? kI32Max : kI32Min; });
  add("zeros", [](int64_t) { return 0; });
  add("every_token_its_own", [](int64_t t) { return static_cast<int32_t>(t); });
  add("huge", [](int64_t t) { return kI32Max - static_cast<int32_t>(t % 3); });
  add("random", [](int64_t t) { return static_cast<int32_t>((t * 2654435761u) ^ 0x9E3779B9u); });
  return v;
}

// Every path that takes the config.
std::vector<CudaPath> paths_of(const ProblemConfig& c) {
  std::vector<CudaPath> out;
  for (CudaPath path : {CudaPath::kThreeKernel, CudaPath::kFused, CudaPath::kHopper, CudaPath::kAuto})
    if (path_applies(c, path)) out.push_back(path);
  return out;
}

template <typename T>
void overwrite(HostProblem& host, const std::string& name, const std::vector<T>& values) {
  std::vector<uint8_t>& buf = host.buffers.at(name);
  ASSERT_EQ(buf.size(), values.size() * sizeof(T)) << name;
  std::memcpy(buf.data(), values.data(), buf.size());
}

// Runs the problem on `path` and checks: no error, guards intact, every output finite.
void expect_safe(const HostProblem& host, CudaPath path, const std::string& what) {
  SCOPED_TRACE(what + " on " + to_string(path));
  GuardedProblem dev(host, path);
  ASSERT_NO_THROW(dev.run());
  EXPECT_EQ(dev.broken_guards(), "");
  for (const auto& [name, bytes] : dev.outputs())
    EXPECT_EQ(nonfinite(name, bytes, host.config.dtype), 0) << name << ": non-finite elements (or never written)";
}

// expect_safe, and on the fused walks also with two segments: blocks that walk several chunks read
// the id of the token before their first one (and, with varlen states, store carried states from
// inside the segment).
void expect_safe_walks(const HostProblem& host, CudaPath path, const std::string& what) {
  expect_safe(host, path, what);
  if (path == CudaPath::kFused || path == CudaPath::kHopper) {
    const ForcedSegments forced(2);
    expect_safe(host, path, what + " segments 2");
  }
}

TEST(AdversarialSeqs, ControlMatchesOracle) {
  // The harness itself: with well-formed contents the guarded buffers give the oracle's results on
  // every path (so that the hostile cases below run what a real call runs).
  for (ProblemConfig c : {packed(false, true, true), packed(false, true, false), packed(true, false, false),
                          packed(true, true, true)}) {
    const HostProblem host(c);
    for (CudaPath path : paths_of(c)) {
      SCOPED_TRACE(c.describe() + " on " + to_string(path));
      GuardedProblem dev(host, path);
      ASSERT_NO_THROW(dev.run());
      EXPECT_EQ(dev.broken_guards(), "");
      for (const Comparison& cmp : compare_with_oracle(host, dev.outputs()))
        EXPECT_TRUE(cmp.pass()) << cmp.name << " rel_l2 " << cmp.rel_l2 << " nonfinite " << cmp.nonfinite;
    }
  }
}

TEST(AdversarialSeqs, SeqIdxStartingBelowZeroMatchesTheContract) {
  // Non-decreasing ids that start below 0 and reach 0 (-1 x 20, then 0): the contract resets at
  // token 0 (its id is not 0) and again at the first 0, so the initial state reaches no token. The
  // kernels' "0 before token 0" must not match those 0s (stored_sequence_id). Every path, against
  // the oracle, also with two segments on the fused walks.
  ProblemConfig c = packed(true, false, false);
  c.initial_states = true;
  std::vector<int32_t> ids(static_cast<std::size_t>(c.seqlen), 0);
  for (int t = 0; t < 20; ++t) ids[t] = -1;
  HostProblem host(c);
  overwrite(host, "seq_idx", ids);
  for (CudaPath path : paths_of(c))
    for (int64_t segments : {int64_t{0}, int64_t{2}}) {
      if (segments && path != CudaPath::kFused && path != CudaPath::kHopper) continue;
      SCOPED_TRACE(std::string(to_string(path)) + (segments ? " segments 2" : ""));
      const ForcedSegments forced(segments);  // set back when an ASSERT leaves the scope too
      GuardedProblem dev(host, path);
      ASSERT_NO_THROW(dev.run());
      EXPECT_EQ(dev.broken_guards(), "");
      for (const Comparison& cmp : compare_with_oracle(host, dev.outputs()))
        EXPECT_TRUE(cmp.pass()) << cmp.name << " rel_l2 " << cmp.rel_l2 << " nonfinite " << cmp.nonfinite;
    }
}

TEST(AdversarialSeqs, CuSeqlensAloneWithVarlenStates) {
  // cu_seqlens alone: chunk_cumsum's binary search makes the sequence ids and, on the fused walks,
  // each chunk's carried sequence; varlen_states_sm80 reads the offsets themselves. Chunks of 64
  // and 128 (the three-kernel path's two instances).
  for (int64_t chunk : {64, 128}) {
    const ProblemConfig c = packed(false, true, true, chunk);
    for (const auto& [name, values] : bad_cu_seqlens()) {
      HostProblem host(c);
      overwrite(host, "cu_seqlens", values);
      for (CudaPath path : paths_of(c)) expect_safe_walks(host, path, "cu_seqlens " + name + " chunk " + std::to_string(chunk));
    }
  }
}

TEST(AdversarialSeqs, CuSeqlensAloneEveryPath) {
  // Without varlen states.
  const ProblemConfig c = packed(false, true, false);
  for (const auto& [name, values] : bad_cu_seqlens()) {
    HostProblem host(c);
    overwrite(host, "cu_seqlens", values);
    for (CudaPath path : paths_of(c)) expect_safe_walks(host, path, "cu_seqlens " + name);
  }
}

TEST(AdversarialSeqs, SeqIdxAloneEveryPath) {
  const ProblemConfig c = packed(true, false, false);
  for (const auto& [name, values] : bad_seq_idx(c.seqlen)) {
    HostProblem host(c);
    overwrite(host, "seq_idx", values);
    for (CudaPath path : paths_of(c)) expect_safe_walks(host, path, "seq_idx " + name);
  }
}

TEST(AdversarialSeqs, BothWithVarlenStates) {
  // seq_idx and cu_seqlens both given and disagreeing: the ids come from seq_idx, varlen_states
  // reads the offsets; each hostile cu_seqlens against each hostile seq_idx.
  const ProblemConfig c = packed(true, true, true);
  ASSERT_FALSE(paths_of(c).empty());
  for (const auto& [cu_name, cu] : bad_cu_seqlens())
    for (const auto& [idx_name, idx] : bad_seq_idx(c.seqlen)) {
      HostProblem host(c);
      overwrite(host, "cu_seqlens", cu);
      overwrite(host, "seq_idx", idx);
      for (CudaPath path : paths_of(c)) expect_safe_walks(host, path, "cu_seqlens " + cu_name + ", seq_idx " + idx_name);
    }
}

TEST(AdversarialSeqs, ChecksCanFail) {
  // The checks see what they are there to see: outputs never written (still NaN poison) count as
  // non-finite, and a one-byte write past an output's end (what an unclamped index would do inside
  // the allocation, where memcheck sees nothing) breaks its guard.
  const HostProblem host(packed(false, true, true));
  GuardedProblem dev(host, CudaPath::kThreeKernel);
  for (const auto& [name, bytes] : dev.outputs()) EXPECT_GT(nonfinite(name, bytes, host.config.dtype), 0) << name;
  dev.run();
  ASSERT_EQ(dev.broken_guards(), "");
  const uint8_t one = 0;
  ok(cudaMemcpy(static_cast<uint8_t*>(dev.payload("y")) + host.buffers.at("y").size(), &one, 1,
                cudaMemcpyHostToDevice),
     "cudaMemcpy(spoil)");
  EXPECT_EQ(dev.broken_guards(), "y: written 0 bytes past the end\n");
}

}  // namespace
}  // namespace mamba2ssd::testing
