// The reference backward against central finite differences of the
// reference forward, for every op, with and without h0 and a final-state
// gradient. This is what makes the reference trustworthy as the judge of
// the GPU backward.
#include <catch2/catch.hpp>

#include <cmath>
#include <random>
#include <vector>

#include "finite_difference.hpp"
#include "scan_problems.hpp"
#include "scan_reference.hpp"

using exphil::ScanOp;
using exphil::reference::ScanProblem;

namespace {

// L = sum(w_y * y) + sum(w_f * h_final)
double loss(const ScanProblem& p, const std::vector<double>& w_y, const std::vector<double>& w_f) {
  const auto r = exphil::reference::scan_forward(p);
  double l = 0.0;
  for (std::size_t i = 0; i < w_y.size(); ++i) l += w_y[i] * r.y[i];
  for (std::size_t i = 0; i < w_f.size(); ++i) l += w_f[i] * r.h_final[i];
  return l;
}

// Central difference of the loss with respect to v (an element of p).
double finite_difference(ScanProblem& p, double& v, const std::vector<double>& w_y,
                         const std::vector<double>& w_f) {
  return exphil::test::central_difference(v, [&] { return loss(p, w_y, w_f); });
}

void check_close(double analytic, double numeric, const char* what, std::size_t i) {
  INFO(what << "[" << i << "]: analytic " << analytic << ", finite difference " << numeric);
  CHECK(exphil::test::matches_central_difference(analytic, numeric));
}

void check_gradients(ScanOp op, exphil::test::ShapeCase shape, bool with_h0, bool with_grad_final) {
  const uint64_t seed = exphil::test::test_seed();
  INFO("op " << exphil::scan_op_name(op) << ", B " << shape.batch << " T " << shape.steps << " H "
             << shape.width << ", h0 " << with_h0 << ", grad_h_final " << with_grad_final
             << ", seed " << seed);
  std::mt19937_64 rng(seed);
  ScanProblem p =
      exphil::test::random_scan_problem(op, shape, exphil::DType::f32, with_h0, exphil::DType::f32, rng);
  const auto w_y = exphil::test::random_values(static_cast<std::size_t>(p.sequence_size()), -1, 1,
                                               exphil::DType::f32, rng);
  const auto w_f = with_grad_final
                       ? exphil::test::random_values(static_cast<std::size_t>(p.state_size()), -1, 1,
                                                     exphil::DType::f32, rng)
                       : std::vector<double>{};
  const auto grads = exphil::reference::scan_backward(p, w_y, w_f);

  for (int k = 0; k < exphil::scan_input_count(op); ++k)
    for (std::size_t i = 0; i < p.inputs[k].size(); ++i)
      check_close(grads.grad_inputs[k][i], finite_difference(p, p.inputs[k][i], w_y, w_f),
                  exphil::scan_input_name(op, k), i);

  if (with_h0) {
    for (std::size_t i = 0; i < p.h0.size(); ++i)
      check_close(grads.grad_h0[i], finite_difference(p, p.h0[i], w_y, w_f), "h0", i);
  } else {
    // The gradient with respect to an implicit zero state: perturb a zero h0.
    p.h0.assign(static_cast<std::size_t>(p.state_size()), 0.0);
    for (std::size_t i = 0; i < p.h0.size(); ++i)
      check_close(grads.grad_h0[i], finite_difference(p, p.h0[i], w_y, w_f), "h0 (zero)", i);
  }
}

}  // namespace

TEST_CASE("reference backward matches finite differences of the reference forward", "[reference]") {
  for (ScanOp op : exphil::kAllScanOps) {
    for (const exphil::test::ShapeCase shape : {exphil::test::ShapeCase{2, 5, 3}, {1, 1, 4}, {3, 9, 1}}) {
      check_gradients(op, shape, true, true);
      check_gradients(op, shape, false, false);
      check_gradients(op, shape, true, false);
    }
  }
}

TEST_CASE("reference forward follows each op's definition", "[reference]") {
  // One step from a known state, computed by hand.
  const double h_prev = 0.5;
  const double ab[] = {0.8, -0.3};
  CHECK(exphil::reference::scan_step(ScanOp::linear_scan, ab, h_prev) == Approx(0.8 * 0.5 - 0.3));
  const double gru[] = {0.0, 2.0};  // z = 0.5
  CHECK(exphil::reference::scan_step(ScanOp::min_gru, gru, h_prev) == Approx(0.5 * 0.5 + 0.5 * 2.0));
  const double lstm[] = {0.0, 0.0, 2.0};  // f = i = 0.5, s = 1 + 1e-6
  CHECK(exphil::reference::scan_step(ScanOp::min_lstm, lstm, h_prev) ==
        Approx((0.5 * 0.5 + 0.5 * 2.0) / (1.0 + 1e-6)));
  const double liquid[] = {2.0, 1.0};  // e = exp(-0.5)
  CHECK(exphil::reference::scan_step(ScanOp::liquid, liquid, h_prev) ==
        Approx(1.0 + (0.5 - 1.0) * std::exp(-0.5)));
  const double gru_activated[] = {0.25, 2.0};  // z given
  CHECK(exphil::reference::scan_step(ScanOp::min_gru_activated, gru_activated, h_prev) ==
        Approx(0.75 * 0.5 + 0.25 * 2.0));
  const double lstm_activated[] = {0.25, 0.5, 2.0};  // f, i given; s = f + (i + 1e-6)
  CHECK(exphil::reference::scan_step(ScanOp::min_lstm_activated, lstm_activated, h_prev) ==
        Approx((0.25 * 0.5 + 0.5 * 2.0) / (0.75 + 1e-6)));
  const double diag[] = {0.0, -0.3};  // sigmoid(0) = 0.5
  CHECK(exphil::reference::scan_step(ScanOp::diag_linear, diag, h_prev) == Approx(0.5 * 0.5 - 0.3));
  const double elu_above[] = {0.0, 2.0};  // z = 0.5, c = 1 + 2
  CHECK(exphil::reference::scan_step(ScanOp::elu_gru, elu_above, h_prev) ==
        Approx(0.5 * 0.5 + 0.5 * 3.0));
  const double elu_below[] = {0.0, -1.0};  // c = 1 + (exp(-1) - 1)
  CHECK(exphil::reference::scan_step(ScanOp::elu_gru, elu_below, h_prev) ==
        Approx(0.5 * 0.5 + 0.5 * std::exp(-1.0)));
}
