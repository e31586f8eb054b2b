#include "scan_problems.hpp"

#include <cstdint>
#include <cstdio>
#include <cstdlib>

#include "dtype_codec.hpp"

namespace exphil::test {

uint64_t test_seed() {
  if (const char* s = std::getenv("EXPHIL_TEST_SEED")) return std::strtoull(s, nullptr, 0);
  std::random_device device;
  return (static_cast<uint64_t>(device()) << 32) ^ device();
}

int64_t max_test_elements() {
  const char* s = std::getenv("EXPHIL_TEST_MAX_ELEMENTS");
  if (s && *s) return std::strtoll(s, nullptr, 0);
  return INT64_MAX;
}

bool within_test_size(ShapeCase shape) {
  const bool fits = shape.batch * shape.steps * shape.width <= max_test_elements();
  if (!fits)
    std::printf("left out (EXPHIL_TEST_MAX_ELEMENTS=%lld): B=%lld T=%lld H=%lld\n",
                static_cast<long long>(max_test_elements()), static_cast<long long>(shape.batch),
                static_cast<long long>(shape.steps), static_cast<long long>(shape.width));
  return fits;
}

std::vector<double> random_values(std::size_t n, double lo, double hi, DType dtype,
                                  std::mt19937_64& rng) {
  std::uniform_real_distribution<double> dist(lo, hi);
  std::vector<double> v(n);
  for (double& x : v) x = round_to(dist(rng), dtype);
  return v;
}

reference::ScanProblem random_scan_problem(ScanOp op, ShapeCase shape, DType dtype, bool with_h0,
                                           DType state_dtype, std::mt19937_64& rng,
                                           InputRegime regime) {
  reference::ScanProblem p;
  p.op = op;
  p.batch = shape.batch;
  p.steps = shape.steps;
  p.width = shape.width;
  const auto n = static_cast<std::size_t>(p.sequence_size());
  struct Range { double lo, hi; };
  Range ranges[kMaxScanInputs] = {};
  switch (op) {
    case ScanOp::linear_scan: ranges[0] = {-1, 1}; ranges[1] = {-1, 1}; break;
    case ScanOp::min_gru: ranges[0] = {-4, 4}; ranges[1] = {-2, 2}; break;
    case ScanOp::min_lstm: ranges[0] = {-4, 4}; ranges[1] = {-4, 4}; ranges[2] = {-2, 2}; break;
    case ScanOp::liquid: ranges[0] = {0.5, 8}; ranges[1] = {-2, 2}; break;
    // Gates after the sigmoid: sigmoid([-4, 4]) is about [0.018, 0.982].
    case ScanOp::min_gru_activated: ranges[0] = {0.02, 0.98}; ranges[1] = {-2, 2}; break;
    case ScanOp::min_lstm_activated:
      ranges[0] = {0.02, 0.98}; ranges[1] = {0.02, 0.98}; ranges[2] = {-2, 2}; break;
    case ScanOp::diag_linear: ranges[0] = {-4, 4}; ranges[1] = {-1, 1}; break;
    // The candidate on both sides of elu's kink.
    case ScanOp::elu_gru: ranges[0] = {-4, 4}; ranges[1] = {-2, 2}; break;
  }
  if (regime == InputRegime::long_memory) {
    switch (op) {
      case ScanOp::linear_scan: ranges[0] = {0.99, 1}; break;
      case ScanOp::min_gru: ranges[0] = {-9, -5}; break;
      case ScanOp::min_lstm: ranges[0] = {5, 9}; ranges[1] = {-9, -5}; break;
      case ScanOp::liquid: ranges[0] = {50, 400}; break;
      // sigmoid([-9, -5]) and sigmoid([5, 9]) as above
      case ScanOp::min_gru_activated: ranges[0] = {1.2e-4, 6.7e-3}; break;
      case ScanOp::min_lstm_activated:
        ranges[0] = {0.9933, 0.99988}; ranges[1] = {1.2e-4, 6.7e-3}; break;
      case ScanOp::diag_linear: ranges[0] = {5, 9}; break;  // sigmoid(a) within 7e-3 of 1
      case ScanOp::elu_gru: ranges[0] = {-9, -5}; break;
    }
  }
  for (int k = 0; k < scan_input_count(op); ++k)
    p.inputs[k] = random_values(n, ranges[k].lo, ranges[k].hi, dtype, rng);
  if (with_h0)
    p.h0 = random_values(static_cast<std::size_t>(p.state_size()), -1, 1, state_dtype, rng);
  return p;
}

}  // namespace exphil::test
