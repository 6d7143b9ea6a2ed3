// The fp64 oracle: the contract's sequential recurrence, as plainly as it can be written. It is the
// ground truth for every test of the project (C++ and Python, CPU and GPU) and for the CLI's checks.
#pragma once

#include <cstdint>
#include <limits>
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
// The same as forward64(load_inputs(p, slice), slice's tokens), kept in a Result: memory for the
// slice's inputs in fp64 (x and z of its batch rows and heads, B and C of their groups, all tokens).
Result run(const ForwardParams& p, Slice slice = {});

// The inputs of a call in fp64, dense and row-major: what the recurrence reads. The finite-difference
// tests edit them directly (perturbations an fp32 input could not hold), so the oracle's forward and
// backward run on these, never on ForwardParams. An empty optional tensor is absent.
struct Inputs64 {
  int64_t batch = 0, seqlen = 0, nheads = 0, headdim = 0, ngroups = 0, dstate = 0;  // b L H P G N
  std::vector<int64_t> group;           // [H]: the group of B and C that head h reads
  std::vector<double> x;                // [b, L, H, P]
  std::vector<double> dt;               // [b, L, H], raw: before bias, softplus and clamp
  std::vector<double> A;                // [H]
  std::vector<double> B, C;             // [b, L, G, N]
  DLayout D_layout = DLayout::kNone;
  std::vector<double> D;                // [H] or [H, P] as D_layout says; empty: none
  std::vector<double> z;                // [b, L, H, P]; empty: no gate
  std::vector<double> dt_bias;          // [H]; empty: none
  bool dt_softplus = false;
  double dt_min = 0.0, dt_max = std::numeric_limits<double>::infinity();
  std::vector<double> initial_states;   // [b, H, P, N]; empty: zeros
  std::vector<int64_t> seq;             // [b, L]: sequence id of every token (a change resets the state)
  std::vector<int64_t> cu_seqlens;      // [S + 1]; empty: no packed sequences, no varlen states

  int64_t nseqs() const { return cu_seqlens.empty() ? 0 : static_cast<int64_t>(cu_seqlens.size()) - 1; }
  // Offsets of rows (the last dimension starts there).
  int64_t token_head(int64_t b, int64_t t, int64_t h) const { return (b * seqlen + t) * nheads + h; }
  int64_t x_row(int64_t b, int64_t t, int64_t h) const { return token_head(b, t, h) * headdim; }
  int64_t BC_row(int64_t b, int64_t t, int64_t h) const { return ((b * seqlen + t) * ngroups + group[h]) * dstate; }
  int64_t state_at(int64_t i, int64_t h) const { return (i * nheads + h) * headdim * dstate; }  // [*, H, P, N]
  double D_at(int64_t h, int64_t p) const {
    return D_layout == DLayout::kPerHead ? D[h] : D_layout == DLayout::kPerHeadDim ? D[h * headdim + p] : 0.0;
  }
};

// Loads the slice's batch rows and heads of p (and the groups those heads read), all tokens.
// Checks cu_seqlens (Error); p must otherwise be valid.
Inputs64 load_inputs(const ForwardParams& p, const Slice& slice = {});

// The preprocessed step of one token and head, and its derivative with respect to the raw dt
// (0 where the clamp holds d at a bound).
struct Step {
  double d = 0.0, dd_ddt = 0.0;
};
Step dt_step(const Inputs64& in, int64_t b, int64_t t, int64_t h);

// The forward's outputs in fp64, y kept for tokens [token_begin, token_begin + ntokens).
struct Outputs64 {
  int64_t token_begin = 0, ntokens = 0;
  std::vector<double> y;                // [b, ntokens, H, P]
  std::vector<double> final_states;     // [b, H, P, N]
  std::vector<double> varlen_states;    // [S, H, P, N]; an empty sequence's is zero
};
// The recurrence of docs/contract.md; token_end -1 keeps y to the last token.
Outputs64 forward64(const Inputs64& in, int64_t token_begin = 0, int64_t token_end = -1);

// The gradients of the loss sum(dout * y) + sum(dfinal * final_states) + sum(dvarlen * varlen_states)
// with respect to every input, shaped like the inputs (an absent input has an empty gradient).
struct Grads64 {
  std::vector<double> dx, ddt, dA, dB, dC, dD, dz, ddt_bias, dinitial_states;
  // For the gradients that sum over every token, the root sum of squares of the terms each element
  // sums (dA: d exp(A d) <h_{t-1}, lam_t> per token; ddt_bias: ddt per token, each counted as the
  // larger of itself and its ddt_terms; dD: dy x per element), and for ddt its terms' (x_p lamB_p
  // per p and A exp(A d) <h_{t-1}, lam_t>, times d'(dt)): the scale of such a sum's rounding error,
  // which does not shrink when its terms cancel.
  std::vector<double> dA_terms, ddt_bias_terms, dD_terms, ddt_terms;
};
// The reverse recurrence of ssd-backward.md, token by token. dout is [b, L, H, P]; dfinal_states
// [b, H, P, N] and dvarlen_states [S, H, P, N] may be empty (zero). Keeps the states of one
// (batch row, head) at a time: (L + 1) P N doubles.
Grads64 backward64(const Inputs64& in, const std::vector<double>& dout,
                   const std::vector<double>& dfinal_states, const std::vector<double>& dvarlen_states);

// Loads p (inputs and cotangents) and runs backward64. p must be valid (validate(p)).
Grads64 run_backward(const BackwardParams& p);

}  // namespace mamba2ssd::reference
