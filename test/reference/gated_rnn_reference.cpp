#include "gated_rnn_reference.hpp"

#include <cmath>
#include <cstddef>

namespace exphil::reference {

namespace {

double sigmoid(double x) { return 1.0 / (1.0 + std::exp(-x)); }

double at_or(const std::vector<double>& v, int64_t i, double absent) {
  return v.empty() ? absent : v[static_cast<std::size_t>(i)];
}

double at_or_zero(const std::vector<double>& v, int64_t i) { return at_or(v, i, 0.0); }

// The share of max(a, b)'s gradient that a takes: Nx's rule, half at a tie.
double max_share(double a, double b) { return a > b ? 1.0 : a < b ? 0.0 : 0.5; }

// d max(|n|, 1) / dn, by the same rule (and abs's sign(0) = +1).
double clamp_slope(double n) {
  const double a = std::fabs(n);
  const double w = a > 1.0 ? 1.0 : a < 1.0 ? 0.0 : 0.5;
  return n < 0.0 ? -w : w;
}

// Everything the forward computes per (b, t), kept for the backward.
struct Trace {
  std::vector<double> h;      // [B, T+1, H]: h_{-1} = h0 at t index 0
  std::vector<double> c;      // [B, T+1, H] (LSTM, sLSTM)
  std::vector<double> n, m;   // [B, T+1, H] (sLSTM)
  std::vector<double> gates;  // [B, T, G, H] activated gates (sLSTM: i', f', z, o)
  std::vector<double> share;  // [B, T, H] (sLSTM): max_share(log f + m_{t-1}, log i)
  std::vector<double> rh;     // [B, T, G*H] h_{t-1} R + bias
};

Trace run(const GatedRnnProblem& p) {
  const int64_t B = p.batch, T = p.steps, H = p.hidden, G = p.gates(), GH = G * H;
  const bool slstm = p.kind == GatedRnnKind::slstm;
  Trace tr;
  tr.h.assign(static_cast<std::size_t>(B * (T + 1) * H), 0.0);
  tr.c.assign(static_cast<std::size_t>(B * (T + 1) * H), 0.0);
  tr.n.assign(static_cast<std::size_t>(B * (T + 1) * H), 0.0);
  tr.m.assign(static_cast<std::size_t>(B * (T + 1) * H), 0.0);
  tr.gates.assign(static_cast<std::size_t>(B * T * GH), 0.0);
  tr.share.assign(static_cast<std::size_t>(B * T * H), 0.0);
  tr.rh.assign(static_cast<std::size_t>(B * T * GH), 0.0);
  for (int64_t b = 0; b < B; ++b) {
    double* h = &tr.h[static_cast<std::size_t>(b * (T + 1) * H)];
    double* c = &tr.c[static_cast<std::size_t>(b * (T + 1) * H)];
    double* nn = &tr.n[static_cast<std::size_t>(b * (T + 1) * H)];
    double* mm = &tr.m[static_cast<std::size_t>(b * (T + 1) * H)];
    for (int64_t u = 0; u < H; ++u) {
      h[u] = at_or_zero(p.h0, b * H + u);
      c[u] = at_or_zero(p.c0, b * H + u);
      nn[u] = at_or(p.n0, b * H + u, 1.0);  // Edifice's initial normaliser
      mm[u] = at_or_zero(p.m0, b * H + u);
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
        if (p.kind == GatedRnnKind::gru) {
          const double r = sigmoid(wx[u] + rh[u]);
          const double z = sigmoid(wx[H + u] + rh[H + u]);
          const double n = std::tanh(wx[2 * H + u] + r * rh[2 * H + u]);
          gt[u] = r;
          gt[H + u] = z;
          gt[2 * H + u] = n;
          h[(t + 1) * H + u] = (1.0 - z) * n + z * hp[u];
        } else if (slstm) {
          // Edifice's slstm_scan_fallback, expression by expression.
          const double log_i = wx[u] + rh[u], log_f = wx[H + u] + rh[H + u];
          const double z = std::tanh(wx[2 * H + u] + rh[2 * H + u]);
          const double o = sigmoid(wx[3 * H + u] + rh[3 * H + u]);
          const double a = log_f + mm[t * H + u];
          const double m = std::fmax(a, log_i);
          const double i = std::exp(log_i - m), f = std::exp(a - m);
          const double cn = f * c[t * H + u] + i * z;
          const double nn_t = f * nn[t * H + u] + i;
          gt[u] = i;
          gt[H + u] = f;
          gt[2 * H + u] = z;
          gt[3 * H + u] = o;
          tr.share[static_cast<std::size_t>((b * T + t) * H + u)] = max_share(a, log_i);
          c[(t + 1) * H + u] = cn;
          nn[(t + 1) * H + u] = nn_t;
          mm[(t + 1) * H + u] = m;
          h[(t + 1) * H + u] = o * (cn / std::fmax(std::fabs(nn_t), 1.0));
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
  const bool cell = p.kind != GatedRnnKind::gru, slstm = p.kind == GatedRnnKind::slstm;
  const Trace tr = run(p);
  GatedRnnForwardResult out;
  out.y.resize(static_cast<std::size_t>(B * T * H));
  out.h_final.resize(static_cast<std::size_t>(B * H));
  if (cell) out.c_final.resize(static_cast<std::size_t>(B * H));
  if (slstm) {
    out.n_final.resize(static_cast<std::size_t>(B * H));
    out.m_final.resize(static_cast<std::size_t>(B * H));
  }
  for (int64_t b = 0; b < B; ++b)
    for (int64_t u = 0; u < H; ++u) {
      for (int64_t t = 0; t < T; ++t)
        out.y[static_cast<std::size_t>((b * T + t) * H + u)] =
            tr.h[static_cast<std::size_t>((b * (T + 1) + t + 1) * H + u)];
      const auto last = static_cast<std::size_t>((b * (T + 1) + T) * H + u);
      const auto at = static_cast<std::size_t>(b * H + u);
      out.h_final[at] = tr.h[last];
      if (cell) out.c_final[at] = tr.c[last];
      if (slstm) {
        out.n_final[at] = tr.n[last];
        out.m_final[at] = tr.m[last];
      }
    }
  return out;
}

GatedRnnBackwardResult gated_rnn_backward(const GatedRnnProblem& p,
                                          const std::vector<double>& grad_y,
                                          const std::vector<double>& grad_h_final,
                                          const std::vector<double>& grad_c_final,
                                          const std::vector<double>& grad_n_final,
                                          const std::vector<double>& grad_m_final) {
  const int64_t B = p.batch, T = p.steps, H = p.hidden, G = p.gates(), GH = G * H;
  const bool lstm = p.kind == GatedRnnKind::lstm, slstm = p.kind == GatedRnnKind::slstm;
  const Trace tr = run(p);
  GatedRnnBackwardResult g;
  g.wx.assign(static_cast<std::size_t>(B * T * GH), 0.0);
  g.rh.assign(static_cast<std::size_t>(B * T * GH), 0.0);
  g.R.assign(static_cast<std::size_t>(H * GH), 0.0);
  g.R_terms.assign(static_cast<std::size_t>(H * GH), 0.0);
  g.bias.assign(static_cast<std::size_t>(GH), 0.0);
  g.bias_terms.assign(static_cast<std::size_t>(GH), 0.0);
  g.h0.assign(static_cast<std::size_t>(B * H), 0.0);
  if (lstm || slstm) g.c0.assign(static_cast<std::size_t>(B * H), 0.0);
  if (slstm) {
    g.n0.assign(static_cast<std::size_t>(B * H), 0.0);
    g.m0.assign(static_cast<std::size_t>(B * H), 0.0);
  }

  const auto zeros = [&] { return std::vector<double>(static_cast<std::size_t>(H), 0.0); };
  // The carried gradients of h, c and the sLSTM's n (dnorm) and m (dstab).
  std::vector<double> dh = zeros(), dc = zeros(), dnorm = zeros(), dstab = zeros(), dh_prev = zeros();
  for (int64_t b = 0; b < B; ++b) {
    for (int64_t u = 0; u < H; ++u) {
      dh[u] = at_or_zero(grad_h_final, b * H + u);
      dc[u] = lstm || slstm ? at_or_zero(grad_c_final, b * H + u) : 0.0;
      dnorm[u] = slstm ? at_or_zero(grad_n_final, b * H + u) : 0.0;
      dstab[u] = slstm ? at_or_zero(grad_m_final, b * H + u) : 0.0;
    }
    const double* h = &tr.h[static_cast<std::size_t>(b * (T + 1) * H)];
    const double* c = &tr.c[static_cast<std::size_t>(b * (T + 1) * H)];
    const double* nn = &tr.n[static_cast<std::size_t>(b * (T + 1) * H)];
    for (int64_t t = T - 1; t >= 0; --t) {
      const int64_t m = b * T + t;
      const double* gt = &tr.gates[static_cast<std::size_t>(m * GH)];
      const double* rh = &tr.rh[static_cast<std::size_t>(m * GH)];
      double* dwx = &g.wx[static_cast<std::size_t>(m * GH)];
      double* drh = &g.rh[static_cast<std::size_t>(m * GH)];
      const double* hp = h + t * H;
      for (int64_t u = 0; u < H; ++u) {
        const double d = dh[u] + grad_y[static_cast<std::size_t>(m * H + u)];
        if (p.kind == GatedRnnKind::gru) {
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
        } else if (slstm) {
          // h = o q, q = c / D, D = max(|n|, 1).
          const double i = gt[u], f = gt[H + u], z = gt[2 * H + u], o = gt[3 * H + u];
          const double cn = c[(t + 1) * H + u], cp = c[t * H + u];
          const double n_t = nn[(t + 1) * H + u], np = nn[t * H + u];
          const double D = std::fmax(std::fabs(n_t), 1.0), q = cn / D;
          const double s = tr.share[static_cast<std::size_t>(m * H + u)];
          const double dct = dc[u] + d * o / D;
          const double dnt = dnorm[u] - d * o * q / D * clamp_slope(n_t);
          // i = exp(log_i - m_t), f = exp(log_f + m_{t-1} - m_t): each
          // exponential's gradient goes to its argument, m_t taking minus it.
          const double dli = (dct * z + dnt) * i;
          const double dlf = (dct * cp + dnt * np) * f;
          const double dmt = dstab[u] - dli - dlf;
          dwx[u] = dli + (1.0 - s) * dmt;
          dwx[H + u] = dlf + s * dmt;
          dwx[2 * H + u] = dct * i * (1.0 - z * z);
          dwx[3 * H + u] = d * q * o * (1.0 - o);
          for (int64_t k = 0; k < 4; ++k) drh[k * H + u] = dwx[k * H + u];
          dc[u] = dct * f;
          dnorm[u] = dnt * f;
          dstab[u] = dwx[H + u];  // m_{t-1} enters only through log_f + m_{t-1}
          dh_prev[u] = 0.0;
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
      const auto at = static_cast<std::size_t>(b * H + u);
      g.h0[at] = dh[u];
      if (lstm || slstm) g.c0[at] = dc[u];
      if (slstm) {
        g.n0[at] = dnorm[u];
        g.m0[at] = dstab[u];
      }
    }
  }
  return g;
}

namespace {

std::size_t at(int64_t i) { return static_cast<std::size_t>(i); }

// Layer l's one-layer problem, its wx formed from the layer below's y.
GatedRnnProblem stack_layer(const GatedRnnStackProblem& p, std::size_t l,
                            const std::vector<double>& below) {
  GatedRnnProblem q;
  q.kind = p.kind;
  q.batch = p.batch, q.steps = p.steps, q.hidden = p.hidden;
  const int64_t GH = q.gate_width(), H = p.hidden, rows = p.batch * p.steps;
  if (l == 0) {
    q.wx = p.wx;
  } else {
    const std::vector<double>& W = p.W[l - 1];
    const std::vector<double>& b = p.W_bias[l - 1];
    q.wx.assign(at(rows * GH), 0.0);
    for (int64_t m = 0; m < rows; ++m)
      for (int64_t j = 0; j < GH; ++j) {
        double s = at_or_zero(b, j);
        for (int64_t k = 0; k < H; ++k) s += below[at(m * H + k)] * W[at(k * GH + j)];
        q.wx[at(m * GH + j)] = s;
      }
  }
  q.R = p.R[l], q.bias = p.bias[l], q.h0 = p.h0[l], q.c0 = p.c0[l];
  return q;
}

}  // namespace

std::vector<GatedRnnForwardResult> gated_rnn_stack_forward(const GatedRnnStackProblem& p) {
  std::vector<GatedRnnForwardResult> out;
  for (std::size_t l = 0; l < p.R.size(); ++l)
    out.push_back(gated_rnn_forward(stack_layer(p, l, l == 0 ? std::vector<double>{} : out.back().y)));
  return out;
}

GatedRnnStackBackwardResult gated_rnn_stack_backward(
    const GatedRnnStackProblem& p, const std::vector<double>& grad_y,
    const std::vector<std::vector<double>>& grad_y_lower,
    const std::vector<std::vector<double>>& grad_h_final,
    const std::vector<std::vector<double>>& grad_c_final) {
  const std::size_t L = p.R.size();
  const auto forward = gated_rnn_stack_forward(p);
  const auto nth = [](const std::vector<std::vector<double>>& v, std::size_t l) {
    return l < v.size() ? v[l] : std::vector<double>{};
  };
  GatedRnnStackBackwardResult out;
  out.R.resize(L), out.bias.resize(L), out.h0.resize(L), out.c0.resize(L);
  out.W.resize(L - 1), out.W_bias.resize(L - 1);
  out.R_terms.resize(L), out.bias_terms.resize(L);
  out.W_terms.resize(L - 1), out.W_bias_terms.resize(L - 1);
  const int64_t H = p.hidden, rows = p.batch * p.steps;
  std::vector<double> gy = grad_y;  // the gradient of this layer's y
  for (std::size_t l = L; l-- > 0;) {
    const GatedRnnProblem q = stack_layer(p, l, l == 0 ? std::vector<double>{} : forward[l - 1].y);
    const GatedRnnBackwardResult g =
        gated_rnn_backward(q, gy, nth(grad_h_final, l), nth(grad_c_final, l));
    out.R[l] = g.R, out.bias[l] = g.bias, out.h0[l] = g.h0, out.c0[l] = g.c0;
    out.R_terms[l] = g.R_terms, out.bias_terms[l] = g.bias_terms;
    if (l == 0) {
      out.wx = g.wx;
      break;
    }
    // wx_l = y_{l-1} W + b: the gradients of W, b and y_{l-1}.
    const int64_t GH = q.gate_width();
    const std::vector<double>& below = forward[l - 1].y;
    const std::vector<double>& W = p.W[l - 1];
    std::vector<double>& gW = out.W[l - 1];
    std::vector<double>& gb = out.W_bias[l - 1];
    gW.assign(at(H * GH), 0.0);
    gb.assign(at(GH), 0.0);
    std::vector<double>& gWt = out.W_terms[l - 1];
    std::vector<double>& gbt = out.W_bias_terms[l - 1];
    gWt.assign(at(H * GH), 0.0);
    gbt.assign(at(GH), 0.0);
    gy = nth(grad_y_lower, l - 1);
    gy.resize(at(rows * H), 0.0);
    for (int64_t m = 0; m < rows; ++m)
      for (int64_t j = 0; j < GH; ++j) {
        const double d = g.wx[at(m * GH + j)];
        gb[at(j)] += d;
        gbt[at(j)] += std::abs(d);
        for (int64_t k = 0; k < H; ++k) {
          gW[at(k * GH + j)] += below[at(m * H + k)] * d;
          gWt[at(k * GH + j)] += std::abs(below[at(m * H + k)] * d);
          gy[at(m * H + k)] += d * W[at(k * GH + j)];
        }
      }
  }
  return out;
}

}  // namespace exphil::reference
