// The gated-RNN (GRU, LSTM, sLSTM) reference: its backward against central
// finite differences of its forward, for every input element, with and
// without each optional input and final-state gradient (the sLSTM's also
// at max()'s ties, where a central difference across the kink sees the
// mean of the two sides, which is Nx's half-and-half rule), and its forward
// against a step worked out by hand; the stack's backward likewise. This is what makes the reference
// trustworthy as the judge of the GPU kernels (test/gpu/test_gated_rnn.cpp).
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
                               bool h0, bool c0, std::mt19937_64& rng, bool n0 = false,
                               bool m0 = false) {
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
  if (c0 && kind != GatedRnnKind::gru) p.c0 = random_values(n(B * H), -1, 1, DType::f32, rng);
  // n0 on both sides of 1 (and below 0): the clamp max(|n|, 1) active and not.
  if (n0 && kind == GatedRnnKind::slstm) p.n0 = random_values(n(B * H), -1.5, 2, DType::f32, rng);
  if (m0 && kind == GatedRnnKind::slstm) p.m0 = random_values(n(B * H), -1, 1, DType::f32, rng);
  return p;
}

double dot(const std::vector<double>& a, const std::vector<double>& b) {
  double s = 0;
  for (std::size_t i = 0; i < a.size() && i < b.size(); ++i) s += a[i] * b[i];
  return s;
}

std::size_t sz(int64_t v) { return static_cast<std::size_t>(v); }

// Every element of `grad` (the analytic gradient of `loss` in `input`)
// against a central difference of `loss` at that element (its relative
// step `step`: finite_difference.hpp).
template <class Loss>
void check_central_differences(std::vector<double>& input, const std::vector<double>& grad,
                               const char* name, const Loss& loss,
                               double step = exphil::test::kCentralDifferenceStep) {
  REQUIRE(grad.size() == input.size());
  for (std::size_t i = 0; i < input.size(); ++i) {
    const double numeric = central_difference(input[i], loss, step);
    INFO(name << "[" << i << "]: analytic " << grad[i] << ", numeric " << numeric);
    CHECK(matches_central_difference(grad[i], numeric));
  }
}

// An sLSTM problem's backward against central differences of the loss
// y.wy + the final states . their weights, for every input element (absent
// optional inputs at their defaults, where their gradients are defined).
// `step`: the central differences' (finite_difference.hpp; smaller where
// the problem sits on a kink).
void check_slstm_against_differences(GatedRnnProblem p, bool finals, std::mt19937_64& rng,
                                     double step = exphil::test::kCentralDifferenceStep) {
  const std::vector<double> wy = random_values(sz(p.sequence_size()), -1, 1, DType::f32, rng);
  std::vector<double> wh, wc, wn, wm;
  if (finals) {
    wh = random_values(sz(p.state_size()), -1, 1, DType::f32, rng);
    wc = random_values(sz(p.state_size()), -1, 1, DType::f32, rng);
    wn = random_values(sz(p.state_size()), -1, 1, DType::f32, rng);
    wm = random_values(sz(p.state_size()), -1, 1, DType::f32, rng);
  }
  if (p.h0.empty()) p.h0.assign(sz(p.state_size()), 0.0);
  if (p.c0.empty()) p.c0.assign(sz(p.state_size()), 0.0);
  if (p.n0.empty()) p.n0.assign(sz(p.state_size()), 1.0);
  if (p.m0.empty()) p.m0.assign(sz(p.state_size()), 0.0);
  if (p.bias.empty()) p.bias.assign(sz(p.gate_width()), 0.0);
  const auto loss = [&] {
    const auto f = exphil::reference::gated_rnn_forward(p);
    return dot(wy, f.y) + dot(wh, f.h_final) + dot(wc, f.c_final) + dot(wn, f.n_final) +
           dot(wm, f.m_final);
  };
  const auto g = exphil::reference::gated_rnn_backward(p, wy, wh, wc, wn, wm);
  const auto check = [&](std::vector<double>& input, const std::vector<double>& grad, const char* name) {
    check_central_differences(input, grad, name, loss, step);
  };
  check(p.wx, g.wx, "wx");
  check(p.R, g.R, "R");
  check(p.bias, g.bias, "bias");
  check(p.h0, g.h0, "h0");
  check(p.c0, g.c0, "c0");
  check(p.n0, g.n0, "n0");
  check(p.m0, g.m0, "m0");
  CHECK(g.rh == g.wx);  // no gate scales its recurrent part
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
                             const char* name) { check_central_differences(input, grad, name, loss); };
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

// The stack (ops gru_stack and lstm_stack): its backward against central
// differences of the loss sum of every layer's y, h_final and c_final
// against random weights, for every input element of every layer; the
// optional inputs (bias, W_bias, h0, c0) and the gradients of the lower
// layers' y and of the final states each present or absent.
TEST_CASE("gated RNN reference: the stack's backward matches central differences of its forward",
          "[reference][gated_rnn]") {
  std::mt19937_64 rng(exphil::test::test_seed());
  for (GatedRnnKind kind : {GatedRnnKind::gru, GatedRnnKind::lstm})
    for (unsigned options = 0; options < 8; ++options) {
      const bool inputs = options & 1, lower = options & 2, finals = options & 4;
      INFO((kind == GatedRnnKind::gru ? "GRU" : "LSTM") << " stack, optional inputs " << inputs
                                                        << ", lower y's gradients " << lower
                                                        << ", final states' gradients " << finals);
      const std::size_t L = 3;
      const int64_t B = 2, T = 3, H = 3;
      exphil::reference::GatedRnnStackProblem p;
      p.kind = kind;
      p.batch = B, p.steps = T, p.hidden = H;
      std::vector<double> wy;
      std::vector<std::vector<double>> wy_lower, wh, wc;
      for (std::size_t l = 0; l < L; ++l) {
        GatedRnnProblem q = random_problem(kind, B, T, H, inputs, inputs, inputs, rng);
        if (l == 0) p.wx = q.wx;
        p.R.push_back(q.R), p.bias.push_back(q.bias), p.h0.push_back(q.h0), p.c0.push_back(q.c0);
        if (l > 0) {
          p.W.push_back(random_values(sz(H * q.gate_width()), -0.9, 0.9, DType::f32, rng));
          p.W_bias.push_back(inputs ? random_values(sz(q.gate_width()), -0.5, 0.5, DType::f32, rng)
                                    : std::vector<double>{});
        }
        const auto weights = [&](bool wanted, int64_t size) {
          return wanted ? random_values(sz(size), -1, 1, DType::f32, rng) : std::vector<double>{};
        };
        if (l + 1 < L) wy_lower.push_back(weights(lower, B * T * H));
        else wy = weights(true, B * T * H);
        wh.push_back(weights(finals, B * H));
        wc.push_back(weights(finals && kind == GatedRnnKind::lstm, B * H));
      }
      const auto loss = [&] {
        const auto f = exphil::reference::gated_rnn_stack_forward(p);
        double v = dot(wy, f[L - 1].y);
        for (std::size_t l = 0; l < L; ++l) {
          if (l + 1 < L) v += dot(wy_lower[l], f[l].y);
          v += dot(wh[l], f[l].h_final) + dot(wc[l], f[l].c_final);
        }
        return v;
      };
      const auto g = exphil::reference::gated_rnn_stack_backward(p, wy, wy_lower, wh, wc);
      check_central_differences(p.wx, g.wx, "wx", loss);
      for (std::size_t l = 0; l < L; ++l) {
        INFO("layer " << l);
        check_central_differences(p.R[l], g.R[l], "R", loss);
        // Absent optional inputs have their gradients at the default, which
        // differences can only see present.
        if (inputs) {
          check_central_differences(p.bias[l], g.bias[l], "bias", loss);
          check_central_differences(p.h0[l], g.h0[l], "h0", loss);
          if (kind == GatedRnnKind::lstm) check_central_differences(p.c0[l], g.c0[l], "c0", loss);
        }
        if (l == 0) continue;
        check_central_differences(p.W[l - 1], g.W[l - 1], "W", loss);
        if (inputs) check_central_differences(p.W_bias[l - 1], g.W_bias[l - 1], "W_bias", loss);
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

TEST_CASE("sLSTM reference: backward matches central differences of the forward",
          "[reference][gated_rnn]") {
  std::mt19937_64 rng(exphil::test::test_seed());
  for (unsigned options = 0; options < 64; ++options) {
    const bool bias = options & 1, h0 = options & 2, c0 = options & 4, n0 = options & 8,
               m0 = options & 16, finals = options & 32;
    INFO("sLSTM options " << options);
    check_slstm_against_differences(
        random_problem(GatedRnnKind::slstm, 2, 4, 3, bias, h0, c0, rng, n0, m0), finals, rng);
  }
  // Large pre-activations: the stabiliser far from 0 and i', f' far below 1.
  // (With n0 = 1, an i' below the difference step at t = 0 would put n_1
  // within the step of the clamp's kink at 1, which the difference would
  // straddle: n0 is drawn here.)
  for (int k = 0; k < 4; ++k) {
    GatedRnnProblem p = random_problem(GatedRnnKind::slstm, 2, 6, 3, true, true, true, rng, true, true);
    for (double& v : p.wx) v *= 6;
    INFO("sLSTM large pre-activations " << k);
    check_slstm_against_differences(p, true, rng);
  }
}

// Ties built exactly (h0 = 0, no bias, m0 = 0 at t = 0, so pre = wx there):
// the central difference straddles the kink and sees the mean of the two
// sides' derivatives, which is what Nx's half-and-half rule gives.
TEST_CASE("sLSTM reference: max()'s ties take Nx's rule, half to each side",
          "[reference][gated_rnn]") {
  std::mt19937_64 rng(exphil::test::test_seed());
  // The ties sit on max()'s kink: a smaller step (finite_difference.hpp).
  constexpr double kTieStep = 1e-8;
  SECTION("m's tie, with the clamp active after it") {
    // log_f + m0 = log_i: i' = f' = 1, so n_1 = n0 + 1, below 1 in magnitude
    // for n0 in (-2, 0): h_1 = o c_1 depends on m_1, and the split matters.
    GatedRnnProblem p = random_problem(GatedRnnKind::slstm, 2, 3, 3, false, false, true, rng);
    p.n0 = random_values(sz(p.state_size()), -1.7, -0.3, DType::f32, rng);
    const int64_t H = p.hidden;
    for (int64_t b = 0; b < p.batch; ++b)
      for (int64_t u = 0; u < H; ++u) p.wx[sz((b * p.steps) * 4 * H + H + u)] = p.wx[sz(b * p.steps * 4 * H + u)];
    GatedRnnProblem first = p;  // step 0 alone: its m is log_i, its n is n0 + 1
    first.steps = 1;
    first.wx.resize(sz(p.batch * 4 * H));
    for (int64_t b = 0; b < p.batch; ++b)
      for (int64_t k = 0; k < 4 * H; ++k) first.wx[sz(b * 4 * H + k)] = p.wx[sz(b * p.steps * 4 * H + k)];
    const auto f = exphil::reference::gated_rnn_forward(first);
    for (int64_t b = 0; b < p.batch; ++b)
      for (int64_t u = 0; u < H; ++u) {
        REQUIRE(f.m_final[sz(b * H + u)] == first.wx[sz(b * 4 * H + u)]);
        REQUIRE(f.n_final[sz(b * H + u)] == p.n0[sz(b * H + u)] + 1.0);
        REQUIRE(std::fabs(f.n_final[sz(b * H + u)]) < 1.0);
      }
    check_slstm_against_differences(p, true, rng, kTieStep);
  }
  SECTION("|n| = 1") {
    // n0 = 0 and log_i well above log_f: i' = 1 and n_1 = f' * 0 + 1 = 1.
    GatedRnnProblem p = random_problem(GatedRnnKind::slstm, 2, 3, 3, false, false, true, rng);
    p.n0.assign(sz(p.state_size()), 0.0);
    const int64_t H = p.hidden;
    for (int64_t b = 0; b < p.batch; ++b)
      for (int64_t u = 0; u < H; ++u) p.wx[sz(b * p.steps * 4 * H + u)] = p.wx[sz(b * p.steps * 4 * H + H + u)] + 1.0;
    GatedRnnProblem first = p;
    first.steps = 1;
    first.wx.resize(sz(p.batch * 4 * H));
    for (int64_t b = 0; b < p.batch; ++b)
      for (int64_t k = 0; k < 4 * H; ++k) first.wx[sz(b * 4 * H + k)] = p.wx[sz(b * p.steps * 4 * H + k)];
    for (double n : exphil::reference::gated_rnn_forward(first).n_final) REQUIRE(n == 1.0);
    check_slstm_against_differences(p, true, rng, kTieStep);
  }
}

TEST_CASE("sLSTM reference: one step by hand, and Edifice's initial states", "[reference][gated_rnn]") {
  GatedRnnProblem p;
  p.kind = GatedRnnKind::slstm;
  p.batch = p.steps = p.hidden = 1;
  p.wx = {0.1, -0.2, 0.3, 0.4};
  p.R = {0.5, -0.4, 0.7, -0.1};
  p.h0 = {0.6};
  p.c0 = {-0.3};
  p.n0 = {1.5};
  p.m0 = {0.2};
  const auto sig = [](double x) { return 1 / (1 + std::exp(-x)); };
  const double li = 0.1 + 0.3, lf = -0.2 - 0.24, z = std::tanh(0.3 + 0.42), o = sig(0.4 - 0.06);
  const double m = std::max(lf + 0.2, li);  // li
  const double i = std::exp(li - m), f = std::exp(lf + 0.2 - m);
  const double c = f * -0.3 + i * z, n = f * 1.5 + i;
  const auto r = exphil::reference::gated_rnn_forward(p);
  CHECK(r.m_final[0] == Approx(m).epsilon(1e-14));
  CHECK(r.c_final[0] == Approx(c).epsilon(1e-14));
  CHECK(r.n_final[0] == Approx(n).epsilon(1e-14));
  CHECK(r.y[0] == Approx(o * c / std::max(std::fabs(n), 1.0)).epsilon(1e-14));
  CHECK(r.h_final[0] == r.y[0]);

  // Absent states are Edifice's: h0 = 0, c0 = 0, n0 = 1, m0 = 0.
  GatedRnnProblem q = p;
  q.h0 = q.c0 = q.n0 = q.m0 = {};
  GatedRnnProblem e = p;
  e.h0 = {0.0};
  e.c0 = {0.0};
  e.n0 = {1.0};
  e.m0 = {0.0};
  CHECK(exphil::reference::gated_rnn_forward(q).y == exphil::reference::gated_rnn_forward(e).y);
}
