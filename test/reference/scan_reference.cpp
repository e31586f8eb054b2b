#include "scan_reference.hpp"

#include <cmath>

namespace exphil::reference {

namespace {

double sigmoid(double x) { return 1.0 / (1.0 + std::exp(-x)); }

constexpr double kMinLstmEps = 1e-6;

// 1 + elu(x), written as its definition: elu(x) = x above zero, exp(x) - 1
// at and below it.
double one_plus_elu(double x) { return 1.0 + (x > 0.0 ? x : std::exp(x) - 1.0); }

// Partial derivatives of one step: dh_t/dh_{t-1} and dh_t/dx_i.
void step_partials(ScanOp op, const double* x, double h_prev, double& d_h_prev, double* d_x) {
  switch (op) {
    case ScanOp::linear_scan:  // h = a h' + b
      d_h_prev = x[0];
      d_x[0] = h_prev;
      d_x[1] = 1.0;
      return;
    case ScanOp::min_gru: {  // h = (1 - z) h' + z c, z = sigmoid(gate)
      const double z = sigmoid(x[0]);
      d_h_prev = 1.0 - z;
      d_x[0] = (x[1] - h_prev) * z * (1.0 - z);
      d_x[1] = z;
      return;
    }
    case ScanOp::min_lstm: {  // h = (f h' + i c) / (f + i + eps)
      const double f = sigmoid(x[0]), i = sigmoid(x[1]), c = x[2];
      const double s = f + i + kMinLstmEps;
      const double h = (f * h_prev + i * c) / s;
      d_h_prev = f / s;
      // d h / d f = (h' - h) / s, d h / d i = (c - h) / s
      d_x[0] = (h_prev - h) / s * f * (1.0 - f);
      d_x[1] = (c - h) / s * i * (1.0 - i);
      d_x[2] = i / s;
      return;
    }
    case ScanOp::liquid: {  // h = target + (h' - target) exp(-1 / tau)
      const double tau = x[0], target = x[1];
      const double e = std::exp(-1.0 / tau);
      d_h_prev = e;
      d_x[0] = (h_prev - target) * e / (tau * tau);
      d_x[1] = 1.0 - e;
      return;
    }
    case ScanOp::min_gru_activated: {  // h = (1 - z) h' + z c, z given
      const double z = x[0];
      d_h_prev = 1.0 - z;
      d_x[0] = x[1] - h_prev;
      d_x[1] = z;
      return;
    }
    case ScanOp::min_lstm_activated: {  // h = (f h' + i c) / (f + (i + eps)), f and i given
      const double f = x[0], i = x[1], c = x[2];
      const double s = f + (i + kMinLstmEps);
      const double h = (f * h_prev + i * c) / s;
      d_h_prev = f / s;
      d_x[0] = (h_prev - h) / s;
      d_x[1] = (c - h) / s;
      d_x[2] = i / s;
      return;
    }
    case ScanOp::diag_linear: {  // h = sigmoid(a) h' + b
      const double s = sigmoid(x[0]);
      d_h_prev = s;
      d_x[0] = h_prev * s * (1.0 - s);
      d_x[1] = 1.0;
      return;
    }
    case ScanOp::elu_gru: {  // h = (1 - z) h' + z c, z = sigmoid(gate), c = 1 + elu(candidate)
      const double z = sigmoid(x[0]);
      const double c = one_plus_elu(x[1]);
      d_h_prev = 1.0 - z;
      d_x[0] = (c - h_prev) * z * (1.0 - z);
      d_x[1] = z * (x[1] > 0.0 ? 1.0 : std::exp(x[1]));
      return;
    }
  }
}

}  // namespace

double scan_step(ScanOp op, const double* x, double h_prev) {
  switch (op) {
    case ScanOp::linear_scan: return x[0] * h_prev + x[1];
    case ScanOp::min_gru: {
      const double z = sigmoid(x[0]);
      return (1.0 - z) * h_prev + z * x[1];
    }
    case ScanOp::min_lstm: {
      const double f = sigmoid(x[0]), i = sigmoid(x[1]);
      const double s = f + i + kMinLstmEps;
      return (f / s) * h_prev + (i / s) * x[2];
    }
    case ScanOp::liquid: return x[1] + (h_prev - x[1]) * std::exp(-1.0 / x[0]);
    case ScanOp::min_gru_activated: return (1.0 - x[0]) * h_prev + x[0] * x[1];
    case ScanOp::min_lstm_activated: {
      const double s = x[0] + (x[1] + kMinLstmEps);
      return (x[0] / s) * h_prev + (x[1] / s) * x[2];
    }
    case ScanOp::diag_linear: return sigmoid(x[0]) * h_prev + x[1];
    case ScanOp::elu_gru: {
      const double z = sigmoid(x[0]);
      return (1.0 - z) * h_prev + z * one_plus_elu(x[1]);
    }
  }
  return 0.0;
}

ScanForwardResult scan_forward(const ScanProblem& p) {
  const int n = scan_input_count(p.op);
  ScanForwardResult r;
  r.y.resize(static_cast<size_t>(p.sequence_size()));
  r.h_final.resize(static_cast<size_t>(p.state_size()));
  for (int64_t b = 0; b < p.batch; ++b) {
    for (int64_t h = 0; h < p.width; ++h) {
      double state = p.h0.empty() ? 0.0 : p.h0[static_cast<size_t>(b * p.width + h)];
      for (int64_t t = 0; t < p.steps; ++t) {
        const auto i = static_cast<size_t>((b * p.steps + t) * p.width + h);
        double x[kMaxScanInputs] = {};
        for (int k = 0; k < n; ++k) x[k] = p.inputs[k][i];
        state = scan_step(p.op, x, state);
        r.y[i] = state;
      }
      r.h_final[static_cast<size_t>(b * p.width + h)] = state;
    }
  }
  return r;
}

ScanBackwardResult scan_backward(const ScanProblem& p, const std::vector<double>& grad_y,
                                 const std::vector<double>& grad_h_final) {
  const int n = scan_input_count(p.op);
  const ScanForwardResult fwd = scan_forward(p);
  ScanBackwardResult r;
  for (int k = 0; k < n; ++k) r.grad_inputs[k].resize(static_cast<size_t>(p.sequence_size()));
  r.grad_h0.resize(static_cast<size_t>(p.state_size()));
  for (int64_t b = 0; b < p.batch; ++b) {
    for (int64_t h = 0; h < p.width; ++h) {
      const auto s = static_cast<size_t>(b * p.width + h);
      double g = grad_h_final.empty() ? 0.0 : grad_h_final[s];  // dL/dh_t from later steps
      for (int64_t t = p.steps - 1; t >= 0; --t) {
        const auto i = static_cast<size_t>((b * p.steps + t) * p.width + h);
        g += grad_y[i];
        const double h_prev =
            t > 0 ? fwd.y[i - static_cast<size_t>(p.width)] : (p.h0.empty() ? 0.0 : p.h0[s]);
        double x[kMaxScanInputs] = {};
        for (int k = 0; k < n; ++k) x[k] = p.inputs[k][i];
        double d_h_prev = 0.0, d_x[kMaxScanInputs] = {};
        step_partials(p.op, x, h_prev, d_h_prev, d_x);
        for (int k = 0; k < n; ++k) r.grad_inputs[k][i] = g * d_x[k];
        g *= d_h_prev;
      }
      r.grad_h0[s] = g;
    }
  }
  return r;
}

}  // namespace exphil::reference
