// Central finite differences: how every reference backward is checked
// against its own forward (test/unit/test_*reference*.cpp).
#pragma once

#include <cmath>

namespace exphil::test {

// dL/dv by a central difference, v an element of the problem that `loss`
// (a callable returning L) reads. The step is `step` max(1, |v|); v is
// restored afterwards.
//
// Where v sits on a kink of L (a tie of max(), whose two sides the
// difference straddles), the two sides' curvatures differ and the
// difference is off by O(step), not O(step^2): about 1e-6 at the default
// step, the size of matches_central_difference's bound (the sLSTM's tie
// tests failed it for about 1 seed in 80). Those tests take a step of 1e-8,
// where rounding is about 1e-8 |L|.
inline constexpr double kCentralDifferenceStep = 1e-6;

template <class Loss>
double central_difference(double& v, Loss&& loss, double step = kCentralDifferenceStep) {
  const double saved = v;
  const double eps = step * std::fmax(1.0, std::fabs(saved));
  v = saved + eps;
  const double up = loss();
  v = saved - eps;
  const double down = loss();
  v = saved;
  return (up - down) / (2 * eps);
}

// Whether an analytic gradient matches its central difference. Away from
// kinks the difference is off by O(eps^2) truncation plus about 1e-16 |L| /
// eps rounding, near 1e-10 for the tests' losses of order 1 at the default
// step (the worst seen over hundreds of seeds is below 1% of this bound),
// while a wrong term is off by a sizeable fraction of the gradient.
inline bool matches_central_difference(double analytic, double numeric) {
  return std::fabs(analytic - numeric) <= 1e-6 + 1e-5 * std::fabs(numeric);
}

}  // namespace exphil::test
