// The fp64 oracle: the contract's sequential recurrence, as plainly as it can be written. It is the
// ground truth for every test of the project (C++ and Python, CPU and GPU) and for the CLI's checks.
#pragma once

#include <cstdint>
#include <vector>

#include "mamba2ssd/mamba2ssd.h"

namespace mamba2ssd::reference {

// Which part of the answer to compute: batch rows [batch_begin, batch_end), heads
// [head_begin, head_end), and y kept for tokens [token_begin, token_end). -1 means "to the end".
// The recurrence always runs from token 0; only what is stored is cut.
struct Slice {
  int64_t batch_begin = 0, batch_end = -1;
  int64_t head_begin = 0, head_end = -1;
  int64_t token_begin = 0, token_end = -1;
};

// The oracle's answer in fp64, for the slice (sizes nb = batch rows, nh = heads, nt = tokens kept).
struct Result {
  Slice slice;                        // resolved: no -1 left
  int64_t nb = 0, nt = 0, nh = 0, headdim = 0, dstate = 0, nseqs = 0;
  std::vector<double> y;              // [nb, nt, nh, P]
  std::vector<double> final_states;   // [nb, nh, P, N]
  std::vector<double> varlen_states;  // [S, nh, P, N], only with cu_seqlens

  double& y_at(int64_t b, int64_t t, int64_t h, int64_t p) {
    return y[((b * nt + t) * nh + h) * headdim + p];
  }
  double& state_at(std::vector<double>& s, int64_t i, int64_t h, int64_t p, int64_t n) {
    return s[((i * nh + h) * headdim + p) * dstate + n];
  }
};

// Runs the recurrence on host memory. p must be valid (validate(p)); outputs of p are not touched.
Result run(const ForwardParams& p, Slice slice = {});

}  // namespace mamba2ssd::reference
