// Runs one scan problem forward and backward on the GPU, through either the
// C++ API or the C ABI, and checks every output against the reference:
// outputs are poisoned before the call, guard zones around every tensor must
// stay untouched, and the backward consumes the GPU's own y.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "compare.hpp"
#include "exphil/scan.hpp"
#include "scan_problems.hpp"

namespace exphil::test {

struct ScanCase {
  ScanOp op = ScanOp::linear_scan;
  DType dtype = DType::f32;
  ShapeCase shape{1, 1, 1};
  bool with_h0 = false;
  bool with_grad_h_final = false;
  DType state_dtype = DType::f32;  // h0, h_final, grad_h_final, grad_h0
  bool write_h_final = true;
  bool write_grad_h0 = true;
  std::size_t misalign_elements = 0;  // shifts every sequence tensor off 16-byte alignment
  InputRegime regime = InputRegime::typical;
  // linear_scan: the backward without b, reading its states from y.
  bool backward_without_b = false;
};

// A case with h0 and grad_h_final present, f32 state tensors.
ScanCase stateful_case(ScanOp op, DType dtype, ShapeCase shape);

// How the harness reaches the library. Each call enqueues work;
// synchronize() waits for it.
struct ScanRunner {
  std::function<Status(const ScanForwardArgs&)> forward;
  std::function<Status(const ScanBackwardArgs&)> backward;
  std::function<void()> synchronize;
};

struct TensorCheck {
  std::string name;
  Comparison comparison;
  bool guards_intact = true;
};

struct ScanCheck {
  uint64_t seed = 0;
  std::vector<TensorCheck> tensors;
  std::vector<std::vector<unsigned char>> outputs;  // raw bytes of every output, in order

  bool ok() const;
  std::string describe() const;  // one line per tensor
  double worst_ratio() const;
};

// Throws std::runtime_error if a call itself fails.
ScanCheck run_scan_case(const ScanCase& scan_case, const ScanRunner& runner, uint64_t seed);

std::string describe_case(const ScanCase& scan_case);

}  // namespace exphil::test
