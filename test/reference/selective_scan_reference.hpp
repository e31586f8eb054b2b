// CPU reference of the selective scan (exphil.h, "selective_scan"), forward
// and backward, in double.
//
// Written step by step from the definition, with the backward derived by
// hand and checked against central finite differences of the forward
// (test/unit/test_selective_scan_reference.cpp). The GPU results are checked
// against it.
#pragma once

#include <cstdint>
#include <vector>

namespace exphil::reference {

// One problem, all row-major in double. Optional inputs are empty when
// absent.
struct SelectiveScanProblem {
  int64_t batch = 0, steps = 0, channels = 0, states = 0;  // B, T, D, N
  std::vector<double> x, dt;  // [B, T, D]
  std::vector<double> A;      // [D, N]
  std::vector<double> B, C;   // [B, T, N]
  std::vector<double> dt_bias;  // [D] or empty
  std::vector<double> D;        // [D] or empty
  std::vector<double> z;        // [B, T, D] or empty
  std::vector<double> h0;       // [B, D, N] or empty (zero initial state)
  bool softplus = false;
  bool clamp = false;
  double dt_min = 0.0, dt_max = 0.0;
  // The input term scaled by the mean of delta over the channels
  // (SelectiveScanInputScale::channel_mean); forward only.
  bool channel_mean_input_scale = false;

  int64_t sequence_size() const { return batch * steps * channels; }
  int64_t projection_size() const { return batch * steps * states; }
  int64_t state_size() const { return batch * channels * states; }
};

struct SelectiveScanForwardResult {
  std::vector<double> y;        // [B, T, D]
  std::vector<double> h_final;  // [B, D, N]
};

// Gradients of every input; those of absent optional inputs are empty.
// The gradients whose terms can cancel (x and dt, sums over the N states;
// A, dt_bias and D, sums over batch and time) also come with the sums of the
// absolute values of their terms: the scale of the rounding error a float
// sum of those terms makes, however much they cancel.
struct SelectiveScanBackwardResult {
  std::vector<double> x, dt, A, B, C, dt_bias, D, z, h0;
  // sum |term|, shaped as x, dt, A, dt_bias, D
  std::vector<double> x_terms, dt_terms, A_terms, dt_bias_terms, D_terms;
};

// delta of one channel and step from its raw dt (the definition in exphil.h).
double selective_scan_delta(const SelectiveScanProblem& p, double dt, int64_t channel);

SelectiveScanForwardResult selective_scan_forward(const SelectiveScanProblem& p);

// grad_y [B, T, D]; grad_h_final [B, D, N] or empty (no gradient into the
// final state). The gradient of h0 is returned only when h0 is present.
SelectiveScanBackwardResult selective_scan_backward(const SelectiveScanProblem& p,
                                                    const std::vector<double>& grad_y,
                                                    const std::vector<double>& grad_h_final);

}  // namespace exphil::reference
