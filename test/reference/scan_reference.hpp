// CPU reference of the four scans, forward and backward, in double.
//
// Written from the ops' definitions step by step (not through the (a, b)
// factorisation the kernels use), and its backward is checked against
// central finite differences of its forward (test/unit). The GPU results
// are checked against it.
#pragma once

#include <cstdint>
#include <vector>

#include "exphil/scan.hpp"

namespace exphil::reference {

// One problem: sequence inputs [B, T, H] and an optional h0 [B, H], all
// row-major in double.
struct ScanProblem {
  ScanOp op = ScanOp::linear_scan;
  int64_t batch = 0, steps = 0, width = 0;
  std::vector<double> inputs[kMaxScanInputs];  // scan_input_count(op) of them
  std::vector<double> h0;                      // empty: zero initial state

  int64_t sequence_size() const { return batch * steps * width; }
  int64_t state_size() const { return batch * width; }
};

struct ScanForwardResult {
  std::vector<double> y;        // [B, T, H]
  std::vector<double> h_final;  // [B, H]
};

struct ScanBackwardResult {
  std::vector<double> grad_inputs[kMaxScanInputs];  // [B, T, H] each
  std::vector<double> grad_h0;                      // [B, H]
};

// h_t of one step from h_{t-1} and the op's inputs x[0..n) at that step.
double scan_step(ScanOp op, const double* x, double h_prev);

ScanForwardResult scan_forward(const ScanProblem& problem);

// grad_h_final empty: no gradient into the final state.
ScanBackwardResult scan_backward(const ScanProblem& problem, const std::vector<double>& grad_y,
                                 const std::vector<double>& grad_h_final);

}  // namespace exphil::reference
