// Central finite differences: how every reference backward is checked
// against its own forward (test/unit/test_*reference*.cpp).
#pragma once

#include <cmath>

namespace exphil::test {

// dL/dv by a central difference, v an element of the problem that `loss`
// (a callable returning L) reads. The step is 1e-6 max(1, |v|); v is
// restored afterwards.
template <class Loss>
double central_difference(double& v, Loss&& loss) {
  const double saved = v;
  const double eps = 1e-6 * std::fmax(1.0, std::fabs(saved));
  v = saved + eps;
  const double up = loss();
  v = saved - eps;
  const double down = loss();
  v = saved;
  return (up - down) / (2 * eps);
}

// Whether an analytic gradient matches its central difference. The
// difference is off by O(eps^2) truncation plus about 1e-16 |L| / eps
// rounding, near 1e-10 for the tests' losses of order 1 (the worst seen over
// hundreds of seeds is below 1% of this bound), while a wrong term is off
// by a sizeable fraction of the gradient.
inline bool matches_central_difference(double analytic, double numeric) {
  return std::fabs(analytic - numeric) <= 1e-6 + 1e-5 * std::fabs(numeric);
}

}  // namespace exphil::test
