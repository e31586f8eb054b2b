// Elementwise comparison of a result with its reference under a Tolerance,
// with a report that says where and by how much it failed.
#pragma once

#include <cstddef>
#include <string>
#include <vector>

#include "tolerance.hpp"

namespace exphil::test {

struct Comparison {
  bool ok = true;
  std::size_t count = 0;
  std::size_t failures = 0;     // includes non-finite results
  std::size_t worst_index = 0;
  double worst_ratio = 0.0;     // max |got - ref| / allowed; <= 1 passes
  double worst_got = 0.0, worst_ref = 0.0;
  double scale = 0.0;           // what atol is relative to

  std::string describe(const std::string& what) const;
};

// `scale` as tolerance.hpp defines it; by default max |ref| of this tensor.
Comparison compare(const std::vector<double>& got, const std::vector<double>& ref, Tolerance tol,
                   double scale = -1.0);

double max_abs(const std::vector<double>& values);

}  // namespace exphil::test
