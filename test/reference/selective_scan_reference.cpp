#include "selective_scan_reference.hpp"

#include <algorithm>
#include <cmath>
#include <stdexcept>
#include <cstddef>

namespace exphil::reference {

namespace {

double sigmoid(double v) { return 1.0 / (1.0 + std::exp(-v)); }

// log(1 + exp(v)), written so that exp never overflows for large v and
// small results keep their precision for very negative v.
double softplus(double v) { return std::fmax(v, 0.0) + std::log1p(std::exp(-std::fabs(v))); }

double silu(double v) { return v * sigmoid(v); }

// Flat offsets into the row-major tensors of one problem.
struct Layout {
  int64_t steps, channels, states;

  explicit Layout(const SelectiveScanProblem& p)
      : steps(p.steps), channels(p.channels), states(p.states) {}

  std::size_t sequence(int64_t b, int64_t t, int64_t d) const {  // x, dt, z, y
    return static_cast<std::size_t>((b * steps + t) * channels + d);
  }
  std::size_t projection(int64_t b, int64_t t, int64_t n) const {  // B, C
    return static_cast<std::size_t>((b * steps + t) * states + n);
  }
  std::size_t transition(int64_t d, int64_t n) const {  // A
    return static_cast<std::size_t>(d * states + n);
  }
  std::size_t state(int64_t b, int64_t d, int64_t n) const {  // h0, h_final
    return static_cast<std::size_t>((b * channels + d) * states + n);
  }
};

// delta and its derivative with respect to dt, which is also its derivative
// with respect to dt_bias (u = dt + dt_bias).
struct Delta {
  double value, slope;
};

Delta delta_with_slope(const SelectiveScanProblem& p, double dt, int64_t channel) {
  double u = p.dt_bias.empty() ? dt : dt + p.dt_bias[static_cast<std::size_t>(channel)];
  double slope = 1.0;
  if (p.softplus) {
    slope = sigmoid(u);  // softplus'(u)
    u = softplus(u);
  }
  if (p.clamp) {
    // As torch.clamp: the gradient passes where dt_min <= u <= dt_max, the
    // bounds included, and is zero where the clamp replaces u.
    if (u < p.dt_min || u > p.dt_max) slope = 0.0;
    u = std::clamp(u, p.dt_min, p.dt_max);
  }
  return {u, slope};
}

// The mean of delta over the channels at (b, t): the input term's scale
// with channel_mean_input_scale.
double channel_mean_delta(const SelectiveScanProblem& p, const Layout& at, int64_t b, int64_t t) {
  double sum = 0.0;
  for (int64_t d = 0; d < p.channels; ++d)
    sum += selective_scan_delta(p, p.dt[at.sequence(b, t, d)], d);
  return sum / static_cast<double>(p.channels);
}

// The states h_t[d, :] of one channel (b, d) for t = -1 (the initial
// state) to T - 1, N values each.
class ChannelStates {
 public:
  ChannelStates(const SelectiveScanProblem& p, const Layout& at, int64_t b, int64_t d)
      : states_(p.states), values_(static_cast<std::size_t>((p.steps + 1) * p.states)) {
    for (int64_t n = 0; n < p.states; ++n)
      mutable_h(-1)[n] = p.h0.empty() ? 0.0 : p.h0[at.state(b, d, n)];
    for (int64_t t = 0; t < p.steps; ++t) {
      const std::size_t i = at.sequence(b, t, d);
      const double delta = selective_scan_delta(p, p.dt[i], d);
      const double scale = p.channel_mean_input_scale ? channel_mean_delta(p, at, b, t) : delta;
      for (int64_t n = 0; n < p.states; ++n)
        mutable_h(t)[n] = std::exp(delta * p.A[at.transition(d, n)]) * h(t - 1)[n] +
                          scale * p.B[at.projection(b, t, n)] * p.x[i];
    }
  }

  const double* h(int64_t t) const { return &values_[offset(t)]; }

 private:
  double* mutable_h(int64_t t) { return &values_[offset(t)]; }
  std::size_t offset(int64_t t) const { return static_cast<std::size_t>((t + 1) * states_); }

  int64_t states_;  // N
  std::vector<double> values_;
};

// y_t[d] before the gate: sum_n C_t[n] h_t[d, n] + D[d] x_t[d].
double ungated_output(const SelectiveScanProblem& p, const Layout& at, int64_t b, int64_t t,
                      int64_t d, const double* h) {
  double y = 0.0;
  for (int64_t n = 0; n < p.states; ++n) y += p.C[at.projection(b, t, n)] * h[n];
  if (!p.D.empty()) y += p.D[static_cast<std::size_t>(d)] * p.x[at.sequence(b, t, d)];
  return y;
}

}  // namespace

double selective_scan_delta(const SelectiveScanProblem& p, double dt, int64_t channel) {
  return delta_with_slope(p, dt, channel).value;
}

SelectiveScanForwardResult selective_scan_forward(const SelectiveScanProblem& p) {
  const Layout at(p);
  SelectiveScanForwardResult r;
  r.y.resize(static_cast<std::size_t>(p.sequence_size()));
  r.h_final.resize(static_cast<std::size_t>(p.state_size()));
  for (int64_t b = 0; b < p.batch; ++b) {
    for (int64_t d = 0; d < p.channels; ++d) {
      const ChannelStates states(p, at, b, d);
      for (int64_t t = 0; t < p.steps; ++t) {
        const std::size_t i = at.sequence(b, t, d);
        const double y = ungated_output(p, at, b, t, d, states.h(t));
        r.y[i] = p.z.empty() ? y : y * silu(p.z[i]);
      }
      for (int64_t n = 0; n < p.states; ++n)
        r.h_final[at.state(b, d, n)] = states.h(p.steps - 1)[n];
    }
  }
  return r;
}

// Reverse-mode through one channel (b, d), step t = T-1 down to 0, carrying
// g[n] = dL/dh_t[d, n]: grad_h_final at the start, then each step adds what
// its own output contributes before passing the sum back through the decay.
//
// With s = sigmoid(z), y' = sum_n C[n] h_t[n] + D x the output before the
// gate, and a[n] = exp(delta A[n]):
//   y = y' silu(z):   dL/dz  = dL/dy * y' * s (1 + z (1 - s))
//                     dL/dy' = dL/dy * silu(z)               (dL/dy' = dL/dy without z)
//   y' :              dL/dD += dL/dy' x;  dL/dx += dL/dy' D;
//                     dL/dC[n] += dL/dy' h_t[n];  g[n] += dL/dy' C[n]
//   h_t[n] = a[n] h_{t-1}[n] + delta B[n] x:
//                     dL/ddelta = sum_n g[n] (A[n] a[n] h_{t-1}[n] + B[n] x)
//                     dL/dA[n] += g[n] delta a[n] h_{t-1}[n]
//                     dL/dB[n] += g[n] delta x;  dL/dx += sum_n g[n] delta B[n]
//                     g[n] <- g[n] a[n]                      (now dL/dh_{t-1})
//   delta = clamp(softplus(dt + dt_bias)), each stage only with its option:
//                     dL/ddt = dL/ddelta * [dt_min <= u <= dt_max] * sigmoid(dt + dt_bias)
//                     dL/ddt_bias += dL/ddt
//                     (u = softplus(dt + dt_bias), the value the clamp sees)
// After step 0, g is dL/dh0. The sums over b, t (D, dt_bias, A) and over d
// (B, C) accumulate into their gradients across the loops.
SelectiveScanBackwardResult selective_scan_backward(const SelectiveScanProblem& p,
                                                    const std::vector<double>& grad_y,
                                                    const std::vector<double>& grad_h_final) {
  if (p.channel_mean_input_scale)
    throw std::invalid_argument("the channel-mean input scale has no backward");
  const Layout at(p);
  const auto n_states = static_cast<std::size_t>(p.states);
  const auto sequence_size = static_cast<std::size_t>(p.sequence_size());
  const auto projection_size = static_cast<std::size_t>(p.projection_size());
  const auto channels = static_cast<std::size_t>(p.channels);
  SelectiveScanBackwardResult grad;
  grad.x.assign(sequence_size, 0.0);
  grad.x_terms.assign(sequence_size, 0.0);
  grad.dt.assign(sequence_size, 0.0);
  grad.dt_terms.assign(sequence_size, 0.0);
  grad.A.assign(channels * n_states, 0.0);
  grad.A_terms.assign(channels * n_states, 0.0);
  grad.B.assign(projection_size, 0.0);
  grad.C.assign(projection_size, 0.0);
  if (!p.dt_bias.empty()) grad.dt_bias.assign(channels, 0.0);
  if (!p.dt_bias.empty()) grad.dt_bias_terms.assign(channels, 0.0);
  if (!p.D.empty()) grad.D.assign(channels, 0.0);
  if (!p.D.empty()) grad.D_terms.assign(channels, 0.0);
  if (!p.z.empty()) grad.z.assign(sequence_size, 0.0);
  if (!p.h0.empty()) grad.h0.assign(static_cast<std::size_t>(p.state_size()), 0.0);

  std::vector<double> grad_h(n_states);  // g of the derivation above
  for (int64_t b = 0; b < p.batch; ++b) {
    for (int64_t d = 0; d < p.channels; ++d) {
      const auto channel = static_cast<std::size_t>(d);
      const ChannelStates states(p, at, b, d);
      for (int64_t n = 0; n < p.states; ++n)
        grad_h[static_cast<std::size_t>(n)] =
            grad_h_final.empty() ? 0.0 : grad_h_final[at.state(b, d, n)];

      for (int64_t t = p.steps - 1; t >= 0; --t) {
        const std::size_t i = at.sequence(b, t, d);
        const double x = p.x[i];
        const double* h_now = states.h(t);
        const double* h_prev = states.h(t - 1);

        double grad_ungated = grad_y[i];
        if (!p.z.empty()) {
          const double z = p.z[i], s = sigmoid(z);
          grad.z[i] = grad_y[i] * ungated_output(p, at, b, t, d, h_now) * s * (1.0 + z * (1.0 - s));
          grad_ungated = grad_y[i] * silu(z);
        }
        if (!p.D.empty()) {
          grad.D[channel] += grad_ungated * x;
          grad.D_terms[channel] += std::fabs(grad_ungated * x);
          grad.x[i] += grad_ungated * p.D[channel];
          grad.x_terms[i] += std::fabs(grad_ungated * p.D[channel]);
        }

        const Delta delta = delta_with_slope(p, p.dt[i], d);
        double grad_delta = 0.0, grad_delta_terms = 0.0;
        for (int64_t n = 0; n < p.states; ++n) {
          const std::size_t k = at.projection(b, t, n);
          const double A = p.A[at.transition(d, n)];
          const double decay = std::exp(delta.value * A);
          double& g = grad_h[static_cast<std::size_t>(n)];
          grad.C[k] += grad_ungated * h_now[n];
          g += grad_ungated * p.C[k];
          grad_delta += g * (A * decay * h_prev[n] + p.B[k] * x);
          grad_delta_terms += std::fabs(g * A * decay * h_prev[n]) + std::fabs(g * p.B[k] * x);
          grad.A[at.transition(d, n)] += g * delta.value * decay * h_prev[n];
          grad.A_terms[at.transition(d, n)] += std::fabs(g * delta.value * decay * h_prev[n]);
          grad.B[k] += g * delta.value * x;
          grad.x[i] += g * delta.value * p.B[k];
          grad.x_terms[i] += std::fabs(g * delta.value * p.B[k]);
          g *= decay;
        }
        grad.dt[i] = grad_delta * delta.slope;
        grad.dt_terms[i] = grad_delta_terms * std::fabs(delta.slope);
        if (!p.dt_bias.empty()) {
          grad.dt_bias[channel] += grad.dt[i];
          grad.dt_bias_terms[channel] += std::fabs(grad.dt[i]);
        }
      }

      if (!p.h0.empty())
        for (int64_t n = 0; n < p.states; ++n)
          grad.h0[at.state(b, d, n)] = grad_h[static_cast<std::size_t>(n)];
    }
  }
  return grad;
}

}  // namespace exphil::reference
