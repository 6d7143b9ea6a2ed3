// fp64 calls: the reference backend runs them exactly (every tensor read and written as a double, no
// fp32 rounding anywhere), and every other backend refuses them with an Error naming dtype and backend.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "api/internal.h"
#include "helpers.h"
#include "reference/reference.h"
#include "testing/problem.h"

namespace mamba2ssd::testing {
namespace {

// f() throws mamba2ssd::Error whose message holds every part.
template <typename F>
void expect_error(F&& f, const std::vector<std::string>& parts) {
  try {
    f();
    ADD_FAILURE() << "no exception; expected one mentioning \"" << parts.front() << "\"";
  } catch (const Error& e) {
    const std::string what = e.what();
    for (const std::string& part : parts)
      EXPECT_NE(what.find(part), std::string::npos) << "message \"" << what << "\" lacks \"" << part << "\"";
  }
}

// Every feature: groups, D per (head, dim), z, dt_bias, softplus, a dt limit that clamps, initial
// states, packed sequences with their varlen states.
ProblemConfig features() {
  ProblemConfig c;
  c.batch = 1, c.seqlen = 20, c.nheads = 4, c.ngroups = 2, c.headdim = 32, c.dstate = 16, c.chunk_size = 64;
  c.dtype = DType::kF32;
  c.z = true, c.D_layout = DLayout::kPerHeadDim, c.dt_bias = true, c.dt_softplus = true;
  c.dt_min = 0.001f, c.dt_max = 0.5f, c.initial_states = true, c.seqlens = {7, 13};
  return c;
}

// An fp64 call over dense buffers holding `in`'s values, with its outputs and gradients.
struct F64Call {
  reference::Inputs64 in;
  std::vector<double> y, final_states, varlen_states;
  std::vector<double> dout, dfinal, dvarlen;
  std::vector<double> dx, ddt, dA, dB, dC, dD, dz, ddt_bias, dinitial_states;
  ForwardParams p;
  BackwardParams bp;

  explicit F64Call(reference::Inputs64 inputs) : in(std::move(inputs)) {
    const int64_t b = in.batch, L = in.seqlen, H = in.nheads, P = in.headdim, G = in.ngroups, N = in.dstate;
    const int64_t S = in.nseqs();
    p.batch = b, p.seqlen = L, p.nheads = H, p.headdim = P, p.ngroups = G, p.dstate = N, p.chunk_size = 64;
    p.dtype = p.dt_dtype = DType::kF64;
    // The API types these float*; in an fp64 call they hold doubles.
    auto f = [](const std::vector<double>& v) { return reinterpret_cast<const float*>(v.data()); };
    auto fw = [](std::vector<double>& v) { return reinterpret_cast<float*>(v.data()); };
    p.x = in.x.data(), p.x_stride = contiguous_strides(b, L, H, P);
    p.dt = in.dt.data(), p.dt_stride = contiguous_strides(b, L, H);
    p.A = f(in.A);
    p.B = in.B.data(), p.B_stride = contiguous_strides(b, L, G, N);
    p.C = in.C.data(), p.C_stride = contiguous_strides(b, L, G, N);
    p.D_layout = in.D_layout, p.D = f(in.D);
    p.z = in.z.data(), p.z_stride = p.x_stride;
    p.dt_bias = f(in.dt_bias), p.dt_softplus = in.dt_softplus;
    p.dt_min = static_cast<float>(in.dt_min), p.dt_max = static_cast<float>(in.dt_max);
    p.initial_states = f(in.initial_states), p.initial_states_stride = contiguous_strides(b, H, P, N);
    p.cu_seqlens = in.cu_seqlens.data(), p.nseqs = S;
    y.assign(in.x.size(), 0.0), final_states.assign(b * H * P * N, 0.0), varlen_states.assign(S * H * P * N, 0.0);
    p.y = y.data(), p.y_stride = p.x_stride;
    p.final_states = fw(final_states), p.final_states_stride = p.initial_states_stride;
    p.varlen_states = fw(varlen_states), p.varlen_states_stride = contiguous_strides(S, H, P, N);

    // Cotangents off the fp32 grid, so that any rounding through fp32 would show.
    std::mt19937_64 rng(7);
    std::normal_distribution<double> normal;
    auto draw = [&](std::vector<double>& v, std::size_t n) {
      v.resize(n);
      for (double& e : v) e = normal(rng);
    };
    draw(dout, y.size()), draw(dfinal, final_states.size()), draw(dvarlen, varlen_states.size());
    bp.fwd = p;
    bp.fwd.y = nullptr, bp.fwd.final_states = bp.fwd.varlen_states = nullptr;
    bp.dout = dout.data(), bp.dout_stride = p.x_stride;
    bp.dfinal_states = f(dfinal), bp.dfinal_states_stride = p.final_states_stride;
    bp.dvarlen_states = f(dvarlen), bp.dvarlen_states_stride = p.varlen_states_stride;
    dx.assign(in.x.size(), NAN), ddt.assign(in.dt.size(), NAN), dA.assign(H, NAN);
    dB.assign(in.B.size(), NAN), dC.assign(in.C.size(), NAN), dD.assign(in.D.size(), NAN);
    dz.assign(in.z.size(), NAN), ddt_bias.assign(H, NAN), dinitial_states.assign(in.initial_states.size(), NAN);
    bp.dx = dx.data(), bp.dx_stride = p.x_stride;
    bp.ddt = ddt.data(), bp.ddt_stride = p.dt_stride;
    bp.dA = fw(dA);
    bp.dB = dB.data(), bp.dB_stride = p.B_stride;
    bp.dC = dC.data(), bp.dC_stride = p.C_stride;
    bp.dD = fw(dD), bp.dz = dz.data(), bp.dz_stride = p.x_stride, bp.ddt_bias = fw(ddt_bias);
    bp.dinitial_states = fw(dinitial_states), bp.dinitial_states_stride = p.initial_states_stride;
  }
};

// The inputs of features() moved off the fp32 grid: each value plus a small offset that fp32 cannot hold.
reference::Inputs64 off_grid_inputs() {
  HostProblem problem(features());
  reference::Inputs64 in = reference::load_inputs(problem.params());
  double k = 0.0;
  for (std::vector<double>* v : {&in.x, &in.dt, &in.A, &in.B, &in.C, &in.D, &in.z, &in.dt_bias, &in.initial_states})
    for (double& e : *v) e += 1e-11 * std::sin(k += 1.0);
  return in;
}

TEST(F64, ReferenceForwardIsTheOracleExactly) {
  F64Call call(off_grid_inputs());
  forward_reference(call.p);
  const reference::Outputs64 want = reference::forward64(call.in);
  EXPECT_EQ(call.y, want.y);
  EXPECT_EQ(call.final_states, want.final_states);
  EXPECT_EQ(call.varlen_states, want.varlen_states);
  // The same through forward(), which must validate fp64 as the reference does.
  std::fill(call.y.begin(), call.y.end(), 0.0);
  EXPECT_EQ(forward(call.p, Backend::kReference), Backend::kReference);
  EXPECT_EQ(call.y, want.y);
}

TEST(F64, ReferenceBackwardIsTheOracleExactly) {
  F64Call call(off_grid_inputs());
  backward_reference(call.bp);
  const reference::Grads64 want = reference::backward64(call.in, call.dout, call.dfinal, call.dvarlen);
  EXPECT_EQ(call.dx, want.dx);
  EXPECT_EQ(call.ddt, want.ddt);
  EXPECT_EQ(call.dA, want.dA);
  EXPECT_EQ(call.dB, want.dB);
  EXPECT_EQ(call.dC, want.dC);
  EXPECT_EQ(call.dD, want.dD);
  EXPECT_EQ(call.dz, want.dz);
  EXPECT_EQ(call.ddt_bias, want.ddt_bias);
  EXPECT_EQ(call.dinitial_states, want.dinitial_states);
  EXPECT_EQ(backward(call.bp, Backend::kReference), Backend::kReference);
}

// Every backend but the reference refuses fp64, naming the dtype and (where it can) itself.
TEST(F64, OtherBackendsRefuse) {
  F64Call call(off_grid_inputs());
  expect_error([&] { forward_cpu(call.p); }, {"fp64", "backend cpu"});
  expect_error([&] { backward_cpu(call.bp); }, {"fp64", "backend cpu"});
  expect_error([&] { forward(call.p, Backend::kCpu); }, {"fp64", "backend cpu", "reference backend only"});
  expect_error([&] { backward(call.bp, Backend::kAuto); }, {"fp64", "backend cpu"});  // auto: host memory
  expect_error([&] { forward(call.p, Backend::kCuda); }, {"fp64", "backend cuda"});
  expect_error([&] { backward(call.bp, Backend::kCuda); }, {"fp64", "backend cuda"});
  expect_error([&] { validate(call.p); }, {"dtype fp64", "reference backend only"});
  expect_error([&] { validate(call.bp); }, {"dtype fp64", "reference backend only"});
  // The CUDA entry points validate first (the CUDA sources are the CUDA backend's; this pins the rule
  // they rely on: validate() refuses fp64, whatever calls it).
  expect_error([&] { cuda_backward_workspace_bytes(call.bp); }, {"fp64"});
  EXPECT_TRUE(std::all_of(call.y.begin(), call.y.end(), [](double v) { return v == 0.0; }));  // nothing ran
}

TEST(F64, HalfFp64CallsAreRefused) {
  F64Call call(off_grid_inputs());
  call.p.dt_dtype = DType::kF32;
  expect_error([&] { forward_reference(call.p); }, {"fp64 throughout", "dt_dtype fp32"});
  call.p.dt_dtype = DType::kF64, call.p.dtype = DType::kF32;
  expect_error([&] { forward_reference(call.p); }, {"fp64 throughout", "dtype fp32"});
}

// In an fp64 call the float* tensors hold doubles: 8-byte alignment, 8-byte elements in the extents.
TEST(F64, FloatTensorsAreDoubles) {
  F64Call call(off_grid_inputs());
  call.p.A = reinterpret_cast<const float*>(reinterpret_cast<const char*>(call.in.A.data()) + 4);
  expect_error([&] { forward_reference(call.p); }, {"A"});
  F64Call overlap(off_grid_inputs());
  // varlen_states placed half way into final_states: past its end if its elements were 4 bytes wide.
  overlap.p.varlen_states = overlap.p.final_states + overlap.final_states.size();
  expect_error([&] { forward_reference(overlap.p); }, {"overlaps"});
}

}  // namespace
}  // namespace mamba2ssd::testing
