#include "selective_scan_problems.hpp"

#include <cstddef>
#include <sstream>

#include "dtype_codec.hpp"
#include "scan_problems.hpp"

namespace exphil::test {

std::string describe(const SelectiveScanCase& c) {
  std::ostringstream out;
  out << "B" << c.batch << " T" << c.steps << " D" << c.channels << " N" << c.states
      << (c.dt_bias ? " +bias" : "") << (c.softplus ? " +softplus" : "")
      << (c.clamp ? " +clamp" : "") << (c.skip ? " +skip" : "") << (c.gate ? " +gate" : "")
      << (c.h0 ? " +h0" : "");
  return out.str();
}

reference::SelectiveScanProblem random_selective_scan_problem(const SelectiveScanCase& c,
                                                              DType dtype, std::mt19937_64& rng) {
  reference::SelectiveScanProblem p;
  p.batch = c.batch;
  p.steps = c.steps;
  p.channels = c.channels;
  p.states = c.states;
  p.softplus = c.softplus;
  p.clamp = c.clamp;
  if (c.clamp) {
    // Both bounds lie inside the range of u, so that some steps are clamped
    // on each side: u = dt in (0.01, 2) falls about 2% below [0.05, 0.5] and
    // 75% above; u = softplus(dt) in (0.049, 1.31) about 19% below
    // [0.1, 0.9] and 16% above (dt_bias shifts these per channel). Rounded
    // to f32, as the kernels take them (exphil_selective_scan_options).
    p.dt_min = round_to(c.softplus ? 0.1 : 0.05, DType::f32);
    p.dt_max = round_to(c.softplus ? 0.9 : 0.5, DType::f32);
  }

  const auto sequence = static_cast<std::size_t>(p.sequence_size());
  const auto projection = static_cast<std::size_t>(p.projection_size());
  const auto channels = static_cast<std::size_t>(p.channels);
  p.x = random_values(sequence, -1, 1, dtype, rng);
  p.dt = c.softplus ? random_values(sequence, -3, 1, dtype, rng)
                    : random_values(sequence, 0.01, 2, dtype, rng);
  p.A = random_values(channels * static_cast<std::size_t>(p.states), -2, -0.01, DType::f32, rng);
  p.B = random_values(projection, -1, 1, dtype, rng);
  p.C = random_values(projection, -1, 1, dtype, rng);
  // With neither softplus nor clamp a negative u would make exp(delta A) > 1
  // and the state grow without bound over long T; keep u positive there.
  if (c.dt_bias)
    p.dt_bias = c.softplus || c.clamp ? random_values(channels, -1, 1, DType::f32, rng)
                                      : random_values(channels, 0, 0.5, DType::f32, rng);
  if (c.skip) p.D = random_values(channels, -1, 1, DType::f32, rng);
  if (c.gate) p.z = random_values(sequence, -3, 3, dtype, rng);
  if (c.h0) p.h0 = random_values(static_cast<std::size_t>(p.state_size()), -1, 1, DType::f32, rng);
  return p;
}

}  // namespace exphil::test
