// The alignment rule of the API (include/mamba2ssd/mamba2ssd.h): every pointer is a multiple of its
// element's size (2 bytes for fp16/bf16, 4 for fp32 and int32, 8 for cu_seqlens' int64). A pointer
// that is not is refused by validate() with an Error naming the tensor, before any load: the CPU
// backends read rows as uint16_t/float, which at an odd address is undefined behaviour (UBSan's
// "misaligned address", scripts/sanitize_test.sh).
#include <gtest/gtest.h>

#include <algorithm>
#include <functional>
#include <string>
#include <vector>

#include "backward_helpers.h"
#include "helpers.h"

namespace mamba2ssd::testing {
namespace {

// Every tensor of a forward call: 16-bit x, B, C, z, y and dt; packed sequences with seq_idx.
ProblemConfig config_16bit() {
  ProblemConfig c;
  c.batch = 1, c.seqlen = 40, c.nheads = 2, c.headdim = 32, c.dstate = 16, c.chunk_size = 64;
  c.dtype = DType::kBF16, c.dt_dtype = DType::kF16;
  c.z = true, c.dt_bias = true, c.initial_states = true, c.D_layout = DLayout::kPerHeadDim;
  c.seqlens = {15, 25}, c.seq_idx = true;
  return c;
}

// A copy of one buffer of `problem` that starts `shift` bytes past an aligned address.
struct Shifted {
  Shifted(const std::vector<uint8_t>& buf, std::size_t shift) : storage(buf.size() + 16, 0xff), at(storage.data() + shift) {
    std::copy(buf.begin(), buf.end(), at);
  }
  std::vector<uint8_t> storage;
  uint8_t* at;
};

struct MisalignCase {
  std::string tensor;  // the buffer's name in HostProblem and the parameter's name in the message
  std::size_t shift;   // bytes
};

std::vector<MisalignCase> misalign_cases() {
  std::vector<MisalignCase> cases;
  for (const char* name : {"x", "B", "C", "z", "y", "dt"}) cases.push_back({name, 1});  // 16-bit: odd address
  for (const char* name : {"A", "D", "dt_bias", "initial_states", "final_states", "varlen_states", "seq_idx"})
    cases.push_back({name, 2});  // 4-byte elements at an address = 2 (mod 4)
  cases.push_back({"cu_seqlens", 4});  // int64 at 4 (mod 8)
  return cases;
}

void PrintTo(const MisalignCase& m, std::ostream* os) { *os << m.tensor << " + " << m.shift << " bytes"; }

class Misaligned : public ::testing::TestWithParam<MisalignCase> {};

// Both host backends refuse the call, naming the tensor, and write nothing.
TEST_P(Misaligned, ForwardRefusesNamingTheTensor) {
  const MisalignCase& m = GetParam();
  HostProblem problem(config_16bit());
  ASSERT_NO_THROW(validate(problem.params()));
  Shifted shifted(problem.buffers.at(m.tensor), m.shift);
  const std::vector<uint8_t> before(shifted.storage);
  const auto buffers_before = problem.buffers;
  const ForwardParams p = problem.params([&](const std::string& name) -> void* {
    return name == m.tensor ? static_cast<void*>(shifted.at) : problem.buffers.at(name).data();
  });
  const std::pair<const char*, std::function<void(const ForwardParams&)>> backends[] = {
      {"validate", [](const ForwardParams& q) { validate(q); }},
      {"cpu", [](const ForwardParams& q) { forward_cpu(q); }},
      {"reference", [](const ForwardParams& q) { forward_reference(q); }}};
  for (const auto& [backend, run] : backends) {
    try {
      run(p);
      ADD_FAILURE() << backend << ": no exception for " << m.tensor << " shifted by " << m.shift << " bytes";
    } catch (const Error& e) {
      const std::string what = e.what();
      EXPECT_EQ(what.rfind(m.tensor + ": address ", 0), 0u) << backend << ": " << what;
      EXPECT_NE(what.find("is not a multiple of its element size"), std::string::npos) << backend << ": " << what;
    }
  }
  EXPECT_TRUE(shifted.storage == before) << "the shifted buffer was written";
  EXPECT_TRUE(problem.buffers == buffers_before) << "a buffer was written";
}

INSTANTIATE_TEST_SUITE_P(Tensors, Misaligned, ::testing::ValuesIn(misalign_cases()),
                         [](const auto& info) { return info.param.tensor; });

// Aligned to the element but not to 16 bytes (rows at odd element offsets) is valid and runs.
TEST(Alignment, ElementAlignedIsEnough) {
  ProblemConfig c = config_16bit();
  c.misaligned = true;
  HostProblem problem(c);
  Shifted x(problem.buffers.at("x"), 2);
  ForwardParams p = problem.params();
  p.x = x.at;
  EXPECT_NO_THROW(forward_cpu(p));
  const reference::Result want = reference::run(p);
  for (const Comparison& cmp : compare_with(problem, problem.buffers, want)) EXPECT_TRUE(cmp.pass()) << cmp.name;
}

// The backward's cotangents and gradients follow the same rule.
TEST(Alignment, BackwardRefusesMisalignedDoutAndGradients) {
  BackwardProblem problem(config_16bit());
  ASSERT_NO_THROW(validate(problem.params()));
  for (const char* name : {"dout", "dx", "dB"}) {
    Shifted shifted(problem.buffers.at(name), 1);
    BackwardParams p = problem.params();
    if (std::string(name) == "dout") p.dout = shifted.at;
    if (std::string(name) == "dx") p.dx = shifted.at;
    if (std::string(name) == "dB") p.dB = shifted.at;
    for (const auto& run : {std::function<void()>([&] { backward_cpu(p); }),
                            std::function<void()>([&] { backward_reference(p); })}) {
      try {
        run();
        ADD_FAILURE() << "no exception for " << name << " at an odd address";
      } catch (const Error& e) {
        EXPECT_EQ(std::string(e.what()).rfind(std::string(name) + ": address ", 0), 0u) << e.what();
      }
    }
  }
}

}  // namespace
}  // namespace mamba2ssd::testing
