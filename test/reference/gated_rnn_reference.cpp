#include "gated_rnn_reference.hpp"

#include <cmath>
#include <cstddef>

namespace exphil::reference {

namespace {

double sigmoid(double x) { return 1.0 / (1.0 + std::exp(-x)); }

double at_or_zero(const std::vector<double>& v, int64_t i) {
  return v.empty() ? 0.0 : v[static_cast<std::size_t>(i)];
}

// Everything the forward computes per (b, t), kept for the backward.
struct Trace {
  std::vector<double> h;      // [B, T+1, H]: h_{-1} = h0 at t index 0
  std::vector<double> c;      // [B, T+1, H] (LSTM)
  std::vector<double> gates;  // [B, T, G, H] activated gates
  std::vector<double> rh;     // [B, T, G*H] h_{t-1} R + bias
};

Trace run(const GatedRnnProblem& p) {
  const int64_t B = p.batch, T = p.steps, H = p.hidden, G = p.gates(), GH = G * H;
  const bool lstm = p.kind == GatedRnnKind::lstm;
  Trace tr;
  tr.h.assign(static_cast<std::size_t>(B * (T + 1) * H), 0.0);
  tr.c.assign(static_cast<std::size_t>(B * (T + 1) * H), 0.0);
  tr.gates.assign(static_cast<std::size_t>(B * T * GH), 0.0);
  tr.rh.assign(static_cast<std::size_t>(B * T * GH), 0.0);
  for (int64_t b = 0; b < B; ++b) {
    double* h = &tr.h[static_cast<std::size_t>(b * (T + 1) * H)];
    double* c = &tr.c[static_cast<std::size_t>(b * (T + 1) * H)];
    for (int64_t u = 0; u < H; ++u) {
      h[u] = at_or_zero(p.h0, b * H + u);
      c[u] = at_or_zero(p.c0, b * H + u);
    }
    for (int64_t t = 0; t < T; ++t) {
      const double* hp = h + t * H;
      double* rh = &tr.rh[static_cast<std::size_t>((b * T + t) * GH)];
      for (int64_t n = 0; n < GH; ++n) {
        double s = at_or_zero(p.bias, n);
        for (int64_t k = 0; k < H; ++k) s += hp[k] * p.R[static_cast<std::size_t>(k * GH + n)];
        rh[n] = s;
      }
      const double* wx = &p.wx[static_cast<std::size_t>((b * T + t) * GH)];
      double* gt = &tr.gates[static_cast<std::size_t>((b * T + t) * GH)];
      for (int64_t u = 0; u < H; ++u) {
        if (!lstm) {
          const double r = sigmoid(wx[u] + rh[u]);
          const double z = sigmoid(wx[H + u] + rh[H + u]);
          const double n = std::tanh(wx[2 * H + u] + r * rh[2 * H + u]);
          gt[u] = r;
          gt[H + u] = z;
          gt[2 * H + u] = n;
          h[(t + 1) * H + u] = (1.0 - z) * n + z * hp[u];
        } else {
          const double i = sigmoid(wx[u] + rh[u]);
          const double f = sigmoid(wx[H + u] + rh[H + u]);
          const double g = std::tanh(wx[2 * H + u] + rh[2 * H + u]);
          const double o = sigmoid(wx[3 * H + u] + rh[3 * H + u]);
          gt[u] = i;
          gt[H + u] = f;
          gt[2 * H + u] = g;
          gt[3 * H + u] = o;
          const double cn = f * c[t * H + u] + i * g;
          c[(t + 1) * H + u] = cn;
          h[(t + 1) * H + u] = o * std::tanh(cn);
        }
      }
    }
  }
  return tr;
}

}  // namespace

GatedRnnForwardResult gated_rnn_forward(const GatedRnnProblem& p) {
  const int64_t B = p.batch, T = p.steps, H = p.hidden;
  const Trace tr = run(p);
  GatedRnnForwardResult out;
  out.y.resize(static_cast<std::size_t>(B * T * H));
  out.h_final.resize(static_cast<std::size_t>(B * H));
  if (p.kind == GatedRnnKind::lstm) out.c_final.resize(static_cast<std::size_t>(B * H));
  for (int64_t b = 0; b < B; ++b)
    for (int64_t u = 0; u < H; ++u) {
      for (int64_t t = 0; t < T; ++t)
        out.y[static_cast<std::size_t>((b * T + t) * H + u)] =
            tr.h[static_cast<std::size_t>((b * (T + 1) + t + 1) * H + u)];
      out.h_final[static_cast<std::size_t>(b * H + u)] =
          tr.h[static_cast<std::size_t>((b * (T + 1) + T) * H + u)];
      if (p.kind == GatedRnnKind::lstm)
        out.c_final[static_cast<std::size_t>(b * H + u)] =
            tr.c[static_cast<std::size_t>((b * (T + 1) + T) * H + u)];
    }
  return out;
}

GatedRnnBackwardResult gated_rnn_backward(const GatedRnnProblem& p,
                                          const std::vector<double>& grad_y,
                                          const std::vector<double>& grad_h_final,
                                          const std::vector<double>& grad_c_final) {
  const int64_t B = p.batch, T = p.steps, H = p.hidden, G = p.gates(), GH = G * H;
  const bool lstm = p.kind == GatedRnnKind::lstm;
  const Trace tr = run(p);
  GatedRnnBackwardResult g;
  g.wx.assign(static_cast<std::size_t>(B * T * GH), 0.0);
  g.rh.assign(static_cast<std::size_t>(B * T * GH), 0.0);
  g.R.assign(static_cast<std::size_t>(H * GH), 0.0);
  g.R_terms.assign(static_cast<std::size_t>(H * GH), 0.0);
  g.bias.assign(static_cast<std::size_t>(GH), 0.0);
  g.bias_terms.assign(static_cast<std::size_t>(GH), 0.0);
  g.h0.assign(static_cast<std::size_t>(B * H), 0.0);
  if (lstm) g.c0.assign(static_cast<std::size_t>(B * H), 0.0);

  std::vector<double> dh(static_cast<std::size_t>(H)), dc(static_cast<std::size_t>(H));
  std::vector<double> dh_prev(static_cast<std::size_t>(H));
  for (int64_t b = 0; b < B; ++b) {
    for (int64_t u = 0; u < H; ++u) {
      dh[u] = at_or_zero(grad_h_final, b * H + u);
      dc[u] = lstm ? at_or_zero(grad_c_final, b * H + u) : 0.0;
    }
    const double* h = &tr.h[static_cast<std::size_t>(b * (T + 1) * H)];
    const double* c = &tr.c[static_cast<std::size_t>(b * (T + 1) * H)];
    for (int64_t t = T - 1; t >= 0; --t) {
      const int64_t m = b * T + t;
      const double* gt = &tr.gates[static_cast<std::size_t>(m * GH)];
      const double* rh = &tr.rh[static_cast<std::size_t>(m * GH)];
      double* dwx = &g.wx[static_cast<std::size_t>(m * GH)];
      double* drh = &g.rh[static_cast<std::size_t>(m * GH)];
      const double* hp = h + t * H;
      for (int64_t u = 0; u < H; ++u) {
        const double d = dh[u] + grad_y[static_cast<std::size_t>(m * H + u)];
        if (!lstm) {
          const double r = gt[u], z = gt[H + u], n = gt[2 * H + u];
          const double dn = d * (1.0 - z);
          const double dz = d * (hp[u] - n);
          const double dan = dn * (1.0 - n * n);
          const double daz = dz * z * (1.0 - z);
          const double dar = dan * rh[2 * H + u] * r * (1.0 - r);
          dwx[u] = dar;
          dwx[H + u] = daz;
          dwx[2 * H + u] = dan;
          drh[u] = dar;
          drh[H + u] = daz;
          drh[2 * H + u] = dan * r;
          dh_prev[u] = d * z;
        } else {
          const double i = gt[u], f = gt[H + u], gg = gt[2 * H + u], o = gt[3 * H + u];
          const double cn = c[(t + 1) * H + u], cp = c[t * H + u];
          const double tc = std::tanh(cn);
          const double dct = dc[u] + d * o * (1.0 - tc * tc);
          dwx[u] = dct * gg * i * (1.0 - i);
          dwx[H + u] = dct * cp * f * (1.0 - f);
          dwx[2 * H + u] = dct * i * (1.0 - gg * gg);
          dwx[3 * H + u] = d * tc * o * (1.0 - o);
          for (int64_t q = 0; q < 4; ++q) drh[q * H + u] = dwx[q * H + u];
          dc[u] = dct * f;
          dh_prev[u] = 0.0;
        }
      }
      for (int64_t k = 0; k < H; ++k) {
        double s = 0.0;
        for (int64_t n = 0; n < GH; ++n) s += drh[n] * p.R[static_cast<std::size_t>(k * GH + n)];
        dh_prev[k] += s;
      }
      for (int64_t k = 0; k < H; ++k)
        for (int64_t n = 0; n < GH; ++n) {
          const double term = hp[k] * drh[n];
          g.R[static_cast<std::size_t>(k * GH + n)] += term;
          g.R_terms[static_cast<std::size_t>(k * GH + n)] += std::fabs(term);
        }
      for (int64_t n = 0; n < GH; ++n) {
        g.bias[static_cast<std::size_t>(n)] += drh[n];
        g.bias_terms[static_cast<std::size_t>(n)] += std::fabs(drh[n]);
      }
      dh.swap(dh_prev);
    }
    for (int64_t u = 0; u < H; ++u) {
      g.h0[static_cast<std::size_t>(b * H + u)] = dh[u];
      if (lstm) g.c0[static_cast<std::size_t>(b * H + u)] = dc[u];
    }
  }
  return g;
}

}  // namespace exphil::reference
