#include "compare.hpp"

#include <cmath>
#include <cstdio>

namespace exphil::test {

double max_abs(const std::vector<double>& values) {
  double m = 0.0;
  for (double v : values) m = std::fmax(m, std::fabs(v));
  return m;
}

Comparison compare(const std::vector<double>& got, const std::vector<double>& ref, Tolerance tol,
                   double scale) {
  Comparison c;
  c.count = ref.size();
  if (got.size() != ref.size()) {
    c.ok = false;
    c.failures = ref.size();
    return c;
  }
  c.scale = scale >= 0.0 ? scale : max_abs(ref);
  for (std::size_t i = 0; i < ref.size(); ++i) {
    const double allowed = tol.atol * c.scale + tol.rtol * std::fabs(ref[i]);
    const double err = std::fabs(got[i] - ref[i]);
    // Non-finite results (poison left in place, overflow) always fail.
    const double ratio = std::isfinite(got[i]) ? (allowed > 0 ? err / allowed : (err > 0 ? INFINITY : 0.0))
                                               : INFINITY;
    if (!(ratio <= 1.0)) ++c.failures;
    if (!(ratio <= c.worst_ratio)) {
      c.worst_ratio = ratio;
      c.worst_index = i;
      c.worst_got = got[i];
      c.worst_ref = ref[i];
    }
  }
  c.ok = c.failures == 0;
  return c;
}

std::string Comparison::describe(const std::string& what) const {
  char buf[512];
  std::snprintf(buf, sizeof buf,
                "%s: %zu of %zu elements out of tolerance; worst at %zu: got %.9g, reference "
                "%.9g (error/allowed = %.3g, scale %.3g)",
                what.c_str(), failures, count, worst_index, worst_got, worst_ref, worst_ratio,
                scale);
  return buf;
}

}  // namespace exphil::test
