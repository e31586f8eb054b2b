// The gated-RNN (GRU, LSTM) reference: its backward against central finite
// differences of its forward, for every input element, with and without
// each optional input and final-state gradient, and its forward against a
// step worked out by hand. This is what makes the reference trustworthy as
// the judge of the GPU kernels (test/gpu/test_gated_rnn.cpp).
#include <catch2/catch.hpp>

#include <cmath>
#include <cstddef>
#include <random>
#include <vector>

#include "finite_difference.hpp"
#include "gated_rnn_reference.hpp"
#include "scan_problems.hpp"

using exphil::DType;
using exphil::reference::GatedRnnKind;
using exphil::reference::GatedRnnProblem;
using exphil::test::central_difference;
using exphil::test::matches_central_difference;
using exphil::test::random_values;

namespace {

GatedRnnProblem random_problem(GatedRnnKind kind, int64_t B, int64_t T, int64_t H, bool bias,
                               bool h0, bool c0, std::mt19937_64& rng) {
  GatedRnnProblem p;
  p.kind = kind;
  p.batch = B;
  p.steps = T;
  p.hidden = H;
  const auto n = [](int64_t v) { return static_cast<std::size_t>(v); };
  p.wx = random_values(n(B * T * p.gate_width()), -1.5, 1.5, DType::f32, rng);
  p.R = random_values(n(H * p.gate_width()), -0.9, 0.9, DType::f32, rng);
  if (bias) p.bias = random_values(n(p.gate_width()), -0.5, 0.5, DType::f32, rng);
  if (h0) p.h0 = random_values(n(B * H), -1, 1, DType::f32, rng);
  if (c0 && kind == GatedRnnKind::lstm) p.c0 = random_values(n(B * H), -1, 1, DType::f32, rng);
  return p;
}

double dot(const std::vector<double>& a, const std::vector<double>& b) {
  double s = 0;
  for (std::size_t i = 0; i < a.size() && i < b.size(); ++i) s += a[i] * b[i];
  return s;
}

}  // namespace

TEST_CASE("gated RNN reference: backward matches central differences of the forward",
          "[reference][gated_rnn]") {
  std::mt19937_64 rng(exphil::test::test_seed());
  for (GatedRnnKind kind : {GatedRnnKind::gru, GatedRnnKind::lstm}) {
    for (unsigned options = 0; options < 16; ++options) {
      const bool bias = options & 1, h0 = options & 2, c0 = options & 4, finals = options & 8;
      GatedRnnProblem p = random_problem(kind, 2, 3, 3, bias, h0, c0, rng);
      const auto n = [](int64_t v) { return static_cast<std::size_t>(v); };
      const std::vector<double> wy = random_values(n(p.sequence_size()), -1, 1, DType::f32, rng);
      std::vector<double> wh, wc;
      if (finals) {
        wh = random_values(n(p.state_size()), -1, 1, DType::f32, rng);
        if (kind == GatedRnnKind::lstm) wc = random_values(n(p.state_size()), -1, 1, DType::f32, rng);
      }
      // Absent h0/c0/bias: their gradient is still defined, at zero.
      if (p.h0.empty()) p.h0.assign(n(p.state_size()), 0.0);
      if (kind == GatedRnnKind::lstm && p.c0.empty()) p.c0.assign(n(p.state_size()), 0.0);
      if (p.bias.empty()) p.bias.assign(n(p.gate_width()), 0.0);
      const auto loss = [&] {
        const auto f = exphil::reference::gated_rnn_forward(p);
        return dot(wy, f.y) + dot(wh, f.h_final) + dot(wc, f.c_final);
      };
      const auto g = exphil::reference::gated_rnn_backward(p, wy, wh, wc);
      INFO((kind == GatedRnnKind::gru ? "GRU" : "LSTM") << " options " << options);
      const auto check = [&](std::vector<double>& input, const std::vector<double>& grad,
                             const char* name) {
        REQUIRE(grad.size() == input.size());
        for (std::size_t i = 0; i < input.size(); ++i) {
          const double numeric = central_difference(input[i], loss);
          INFO(name << "[" << i << "]: analytic " << grad[i] << ", numeric " << numeric);
          CHECK(matches_central_difference(grad[i], numeric));
        }
      };
      check(p.wx, g.wx, "wx");
      check(p.R, g.R, "R");
      check(p.bias, g.bias, "bias");
      check(p.h0, g.h0, "h0");
      if (kind == GatedRnnKind::lstm) check(p.c0, g.c0, "c0");
      // grad_rh is grad_wx but for the GRU's n gate, scaled by r there.
      const int64_t H = p.hidden, GH = p.gate_width();
      for (int64_t m = 0; m < p.batch * p.steps; ++m)
        for (int64_t c = 0; c < GH; ++c) {
          const std::size_t at = n(m * GH + c);
          if (kind == GatedRnnKind::lstm || c < 2 * H) CHECK(g.rh[at] == g.wx[at]);
        }
    }
  }
}

TEST_CASE("gated RNN reference: one step by hand", "[reference][gated_rnn]") {
  // H = 1, T = 1, B = 1: every gate is one number.
  GatedRnnProblem p;
  p.batch = p.steps = p.hidden = 1;
  p.kind = GatedRnnKind::gru;
  p.wx = {0.1, -0.2, 0.3};
  p.R = {0.5, -0.4, 0.7};
  p.bias = {0.0, 0.0, 0.25};
  p.h0 = {0.6};
  const auto sig = [](double x) { return 1 / (1 + std::exp(-x)); };
  const double r = sig(0.1 + 0.6 * 0.5), z = sig(-0.2 - 0.6 * 0.4);
  const double nn = std::tanh(0.3 + r * (0.6 * 0.7 + 0.25));
  const auto f = exphil::reference::gated_rnn_forward(p);
  CHECK(f.y[0] == Approx((1 - z) * nn + z * 0.6).epsilon(1e-14));

  p.kind = GatedRnnKind::lstm;
  p.wx = {0.1, -0.2, 0.3, 0.4};
  p.R = {0.5, -0.4, 0.7, -0.1};
  p.bias = {};
  p.c0 = {-0.3};
  const double i = sig(0.1 + 0.3), fg = sig(-0.2 - 0.24), g = std::tanh(0.3 + 0.42),
               o = sig(0.4 - 0.06);
  const double c = fg * -0.3 + i * g;
  const auto l = exphil::reference::gated_rnn_forward(p);
  CHECK(l.c_final[0] == Approx(c).epsilon(1e-14));
  CHECK(l.y[0] == Approx(o * std::tanh(c)).epsilon(1e-14));
}
