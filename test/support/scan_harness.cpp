#include "scan_harness.hpp"

#include <cmath>
#include <memory>
#include <random>
#include <sstream>
#include <stdexcept>

#include "device_buffer.hpp"
#include "scan_reference.hpp"

namespace exphil::test {

namespace {

using Owned = std::unique_ptr<DeviceTensor>;

void require_ok(const Status& s, const char* what) {
  if (!s.ok()) throw std::runtime_error(std::string(what) + " failed: " + s.message());
}

}  // namespace

bool ScanCheck::ok() const {
  for (const TensorCheck& t : tensors)
    if (!t.comparison.ok || !t.guards_intact) return false;
  return !tensors.empty();
}

double ScanCheck::worst_ratio() const {
  double w = 0.0;
  for (const TensorCheck& t : tensors) w = t.comparison.worst_ratio > w ? t.comparison.worst_ratio : w;
  return w;
}

std::string ScanCheck::describe() const {
  std::ostringstream out;
  out << "seed " << seed << " (rerun with EXPHIL_TEST_SEED=" << seed << ")\n";
  for (const TensorCheck& t : tensors) {
    out << "  " << t.comparison.describe(t.name);
    if (!t.guards_intact) out << " -- GUARD ZONE OVERWRITTEN";
    out << "\n";
  }
  return out.str();
}

ScanCase stateful_case(ScanOp op, DType dtype, ShapeCase shape) {
  ScanCase c;
  c.op = op;
  c.dtype = dtype;
  c.shape = shape;
  c.with_h0 = true;
  c.with_grad_h_final = true;
  return c;
}

std::string describe_case(const ScanCase& c) {
  std::ostringstream out;
  out << scan_op_name(c.op) << " " << dtype_name(c.dtype) << " B=" << c.shape.batch
      << " T=" << c.shape.steps << " H=" << c.shape.width << (c.with_h0 ? " +h0" : "")
      << (c.with_grad_h_final ? " +grad_h_final" : "") << " state=" << dtype_name(c.state_dtype)
      << (c.write_h_final ? "" : " no-h_final") << (c.write_grad_h0 ? "" : " no-grad_h0")
      << (c.misalign_elements ? " misaligned" : "")
      << (c.regime == InputRegime::long_memory ? " long-memory" : "")
      << (c.backward_without_b ? " backward-without-b" : "");
  return out.str();
}

ScanCheck run_scan_case(const ScanCase& c, const ScanRunner& runner, uint64_t seed) {
  std::mt19937_64 rng(seed);
  const reference::ScanProblem problem =
      random_scan_problem(c.op, c.shape, c.dtype, c.with_h0, c.state_dtype, rng, c.regime);
  const auto seq_count = static_cast<std::size_t>(problem.sequence_size());
  const auto state_count = static_cast<std::size_t>(problem.state_size());
  const std::vector<double> grad_y = random_values(seq_count, -1, 1, c.dtype, rng);
  const std::vector<double> grad_h_final =
      c.with_grad_h_final ? random_values(state_count, -1, 1, c.state_dtype, rng)
                          : std::vector<double>{};
  const reference::ScanForwardResult ref_fwd = reference::scan_forward(problem);
  const reference::ScanBackwardResult ref_bwd =
      reference::scan_backward(problem, grad_y, grad_h_final);

  const std::vector<int64_t> seq = {c.shape.batch, c.shape.steps, c.shape.width};
  const std::vector<int64_t> state = {c.shape.batch, c.shape.width};
  const std::size_t shift = c.misalign_elements * dtype_size(c.dtype);
  const int n = scan_input_count(c.op);

  Owned x[kMaxScanInputs], grad_x[kMaxScanInputs];
  for (int k = 0; k < n; ++k) {
    x[k] = std::make_unique<DeviceTensor>(problem.inputs[k], c.dtype, seq, shift);
    grad_x[k] = std::make_unique<DeviceTensor>(c.dtype, seq, shift);
  }
  Owned h0 = c.with_h0 ? std::make_unique<DeviceTensor>(problem.h0, c.state_dtype, state) : nullptr;
  Owned y = std::make_unique<DeviceTensor>(c.dtype, seq, shift);
  Owned h_final = c.write_h_final ? std::make_unique<DeviceTensor>(c.state_dtype, state) : nullptr;
  Owned gy = std::make_unique<DeviceTensor>(grad_y, c.dtype, seq, shift);
  Owned g_final = c.with_grad_h_final
                      ? std::make_unique<DeviceTensor>(grad_h_final, c.state_dtype, state)
                      : nullptr;
  Owned g_h0 = c.write_grad_h0 ? std::make_unique<DeviceTensor>(c.state_dtype, state) : nullptr;

  ScanForwardArgs fwd;
  fwd.op = c.op;
  for (int k = 0; k < n; ++k) fwd.inputs[k] = x[k]->ptr();
  fwd.h0 = h0 ? h0->ptr() : nullptr;
  fwd.y = y->ptr();
  fwd.h_final = h_final ? h_final->ptr() : nullptr;
  require_ok(runner.forward(fwd), "forward");
  runner.synchronize();

  ScanBackwardArgs bwd;
  bwd.op = c.op;
  for (int k = 0; k < n; ++k) {
    bwd.inputs[k] = x[k]->ptr();
    bwd.grad_inputs[k] = grad_x[k]->ptr();
  }
  if (c.backward_without_b) bwd.inputs[1] = nullptr;
  bwd.h0 = fwd.h0;
  bwd.y = y->ptr();
  bwd.grad_y = gy->ptr();
  bwd.grad_h_final = g_final ? g_final->ptr() : nullptr;
  bwd.grad_h0 = g_h0 ? g_h0->ptr() : nullptr;
  require_ok(runner.backward(bwd), "backward");
  runner.synchronize();

  ScanCheck check;
  check.seed = seed;
  auto record = [&](const std::string& name, const DeviceTensor& t, const std::vector<double>& ref,
                    Tolerance tol, double scale) {
    check.tensors.push_back({name, compare(t.values(), ref, tol, scale), t.guards_intact()});
    check.outputs.push_back(t.raw());
  };
  // Scales per family (tolerance.hpp): the states, and all gradients. Every
  // op's last input (b, the candidate, the target) is what a step adds to
  // or moves the state toward, so it counts among the states, as does h0:
  // liquid at T = 1 computes target + (h0 - target) e, which can cancel to
  // 1e-4 from terms of order 1.
  const double state_scale =
      std::fmax(std::fmax(max_abs(ref_fwd.y), max_abs(ref_fwd.h_final)),
                std::fmax(max_abs(problem.h0), max_abs(problem.inputs[n - 1])));
  double grad_scale = max_abs(ref_bwd.grad_h0);
  for (int k = 0; k < n; ++k) grad_scale = std::fmax(grad_scale, max_abs(ref_bwd.grad_inputs[k]));
  // The forward keeps its state in f32, so h_final is only rounded to its own
  // dtype; the gradients are built from y and carry y's rounding.
  record("y", *y, ref_fwd.y, tolerance_for(c.dtype), state_scale);
  if (h_final) record("h_final", *h_final, ref_fwd.h_final, tolerance_for(c.state_dtype), state_scale);
  for (int k = 0; k < n; ++k)
    record(scan_grad_input_name(c.op, k), *grad_x[k], ref_bwd.grad_inputs[k], tolerance_for(c.dtype),
           grad_scale);
  if (g_h0) record("grad_h0", *g_h0, ref_bwd.grad_h0, tolerance_for(c.dtype), grad_scale);
  // Inputs must come back untouched, guard zones included.
  for (int k = 0; k < n; ++k)
    check.tensors.push_back({scan_input_name(c.op, k),
                             compare(x[k]->values(), problem.inputs[k], Tolerance{0, 0}),
                             x[k]->guards_intact()});
  return check;
}

}  // namespace exphil::test
