// Random selective-scan problems: inputs drawn in the ranges Mamba models
// use, rounded to the dtype the GPU will see (f32 for A, dt_bias, D, h0), so
// that the reference and the kernels start from the same values.
#pragma once

#include <cstdint>
#include <random>
#include <string>

#include "exphil/tensor.hpp"
#include "selective_scan_reference.hpp"

namespace exphil::test {

struct SelectiveScanCase {
  int64_t batch = 1, steps = 1, channels = 1, states = 1;  // B, T, D, N
  bool dt_bias = false;
  bool softplus = false;
  bool clamp = false;
  bool skip = false;     // D present
  bool gate = false;     // z present
  bool h0 = false;
};

// "B2 T33 D5 N16 +bias +softplus ..." for test messages.
std::string describe(const SelectiveScanCase& c);

// Ranges: x, B, C in U(-1, 1); A = -U(0.01, 2) per (d, n); h0, D and
// dt_bias in U(-1, 1) with softplus or clamp, U(0, 0.5) with neither
// (so that delta stays positive); z in U(-3, 3). dt: with softplus U(-3, 1); without
// U(0.01, 2) (the user's benchmark). With clamp: [dt_min, dt_max] =
// [0.05, 0.5] without softplus, [0.1, 0.9] with it, so that some steps
// are clamped on each side and some are not.
reference::SelectiveScanProblem random_selective_scan_problem(const SelectiveScanCase& c,
                                                              DType dtype, std::mt19937_64& rng);

}  // namespace exphil::test
