// Random scan problems: inputs drawn in each op's working range and rounded
// to the dtype the GPU will see, so the reference and the kernels start from
// the same values. Seeds are fresh each run unless EXPHIL_TEST_SEED is set.
#pragma once

#include <cstdint>
#include <random>
#include <vector>

#include "exphil/scan.hpp"
#include "scan_reference.hpp"

namespace exphil::test {

struct ShapeCase {
  int64_t batch, steps, width;
};

// A fresh seed (std::random_device), or EXPHIL_TEST_SEED when set.
uint64_t test_seed();

// Largest B * T * H a GPU test should run: EXPHIL_TEST_MAX_ELEMENTS when set
// (test/sanitize.sh sets it for racecheck, which instruments every
// shared-memory access and is too slow for the largest shapes), otherwise
// unlimited. Tests report every shape they leave out, and every test keeps
// small shapes on each kernel path, so a capped run still checks something.
int64_t max_test_elements();
bool within_test_size(ShapeCase shape);

// n values in U(lo, hi), each rounded to `dtype`.
std::vector<double> random_values(std::size_t n, double lo, double hi, DType dtype,
                                  std::mt19937_64& rng);

enum class InputRegime {
  // linear_scan a, b in U(-1, 1); gates and logits in U(-4, 4); candidates
  // and targets in U(-2, 2); tau in U(0.5, 8).
  typical,
  // a_t close to 1 (linear_scan a in U(0.99, 1), min_gru gate in U(-9, -5),
  // min_lstm forget in U(5, 9) and input in U(-9, -5), tau in U(50, 400)):
  // state and gradients carry across thousands of steps, so an error in
  // how pieces of the sequence are stitched together cannot decay away.
  long_memory,
};

// Inputs of `op` for `shape` rounded to `dtype`; h0 in U(-1, 1) (rounded to
// `state_dtype`) when with_h0.
reference::ScanProblem random_scan_problem(ScanOp op, ShapeCase shape, DType dtype, bool with_h0,
                                           DType state_dtype, std::mt19937_64& rng,
                                           InputRegime regime = InputRegime::typical);

}  // namespace exphil::test
