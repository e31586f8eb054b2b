/*
 * The sLSTM cell (xLSTM's scalar LSTM with exponential gating, as Edifice's
 * Edifice.Recurrent.SLSTM.slstm_scan_fallback computes it): one step forward
 * and its derivative, for one (batch row, hidden unit). The forward
 * layouts (through gated_rnn_cell.cuh) and the backward's gates kernel all
 * step through slstm_step, so the backward recomputes the forward's
 * arithmetic exactly, given the same pre-activations.
 *
 * Math. pre = wx_t + h_{t-1} R (+ b), gates i, f, z, o side by side:
 *   log_i = pre_i, log_f = pre_f             (no sigmoid: exponential gates,
 *                                             kept in the log domain)
 *   z = tanh(pre_z),  o = sigmoid(pre_o)
 *   m_t = max(log_f + m_{t-1}, log_i)        (the stabiliser)
 *   i' = exp(log_i - m_t),  f' = exp(log_f + m_{t-1} - m_t)   (both <= 1)
 *   c_t = f' c_{t-1} + i' z,  n_t = f' n_{t-1} + i'
 *   h_t = o * (c_t / max(|n_t|, 1))
 * Initial states as Edifice's: h0 = 0, c0 = 0, n0 = 1, m0 = 0.
 *
 * Derivative. With dh the total gradient of h_t and dc, dn, dm the
 * gradients carried into c_t, n_t, m_t from step t+1 (or the final states'):
 *   d = max(|n_t|, 1)
 *   da_o = dh (c_t / d) o (1 - o)
 *   dc  += dh o / d
 *   dn  -= dh o c_t / d^2 * w_n               (w_n = d d / d n_t, below)
 *   dli  = (dc z + dn) i'                     (through i' = exp(log_i - m))
 *   dlf  = (dc c_{t-1} + dn n_{t-1}) f'       (through f' = exp(a - m))
 *   dm  -= dli + dlf                          (both exponentials take m)
 *   da_i = dli + (1 - s) dm,  da_f = dlf + s dm   (s: max's share to a)
 *   da_z = dc i' (1 - z^2)
 *   carried to step t-1: dc f', dn f', and dm_{t-1} = da_f (a = log_f +
 *   m_{t-1}, so m_{t-1} takes what log_f takes); grad_wx_t = grad_rh_t =
 *   [da_i, da_f, da_z, da_o] and dh_{t-1} = grad_rh_t R^T.
 *
 * Ties, as Nx's autodiff of the same expressions (nx/lib/nx/defn/grad.ex,
 * grad(:max) and grad(:abs)), so that the Elixir pure path agrees:
 *   m_t = max(a, log_i) with a = log_f + m_{t-1}: the gradient goes to the
 *     larger; at a tie, half to each (s = 1, 0 or 1/2).
 *   max(|n_t|, 1): w_n = sign(n_t) for |n_t| > 1, 0 for |n_t| < 1, and
 *     sign(n_t) / 2 at |n_t| = 1; sign(0) = +1 (abs's gradient takes
 *     x >= 0 as positive).
 * Where it matters: with n0 >= 1 (the default, and every n_final of an
 * earlier call) one of i', f' is exactly 1 at every step, so n_t > 1 from
 * the first step on, and h_t = o C_t / N_t in the unstabilised states
 * C = e^m c, N = e^m n does not depend on m: a loss that sees the states
 * through h alone has a continuous gradient (the total dm is zero up to
 * rounding, and the split at m's tie changes nothing). The gradient jumps
 * at the ties where the clamp is active (n0 < 1, in the first steps) and
 * wherever c_final, n_final or m_final have gradients of their own (they
 * are e^-m C, e^-m N and m, so they see m's every max).
 *
 * Layout: one (row, unit) in registers, f32; the callers own the layouts.
 * Limits: none of its own. The stabiliser keeps i', f' in (0, 1] for any
 * finite pre-activations, so nothing overflows; n grows at most by 1 a step
 * (n_t <= n0 + t for n0 >= 0), and m_t - m_{t-1} = max(pre_f, pre_i -
 * m_{t-1}).
 */
#pragma once

#include "gated_rnn/gated_rnn_common.cuh"

namespace exphil::kernels {

struct SlstmState {
  float c, n, m;
};

// What the derivative needs of one step besides its states.
struct SlstmGates {
  float i, f, z, o;  // i', f' (stabilised), z, o
  float share;       // of dm_t, the part log_f + m_{t-1} takes: 1, 0 or 1/2
};

// One step: updates s from step t-1 to t, fills g, returns h_t.
__device__ __forceinline__ float slstm_step(float pre_i, float pre_f, float pre_z, float pre_o,
                                            SlstmState& s, SlstmGates& g) {
  const float a = pre_f + s.m;
  const float m = fmaxf(a, pre_i);
  g.i = expf(pre_i - m);
  g.f = expf(a - m);
  g.z = tanhf(pre_z);
  g.o = gated_rnn_sigmoid(pre_o);
  g.share = a > pre_i ? 1.0f : (a < pre_i ? 0.0f : 0.5f);
  s.c = fmaf(g.f, s.c, g.i * g.z);
  s.n = fmaf(g.f, s.n, g.i);
  s.m = m;
  return g.o * (s.c / fmaxf(fabsf(s.n), 1.0f));
}

// The derivative of one step. c, n: c_t and n_t; c_prev, n_prev: c_{t-1}
// and n_{t-1}; d: in, the gradients carried into c_t, n_t, m_t; out, those
// of c_{t-1}, n_{t-1}, m_{t-1}. da: the gradients of pre_i, pre_f, pre_z,
// pre_o.
__device__ __forceinline__ void slstm_step_backward(float dh, const SlstmGates& g, float c, float n,
                                                    float c_prev, float n_prev, SlstmState& d,
                                                    float (&da)[4]) {
  const float an = fabsf(n);
  const float inv = 1.0f / fmaxf(an, 1.0f);
  const float q = c * inv;
  float wn = an > 1.0f ? 1.0f : (an < 1.0f ? 0.0f : 0.5f);
  if (n < 0.0f) wn = -wn;
  const float dc = d.c + dh * g.o * inv;
  const float dn = d.n - dh * g.o * q * inv * wn;
  const float dli = (dc * g.z + dn) * g.i;
  const float dlf = (dc * c_prev + dn * n_prev) * g.f;
  const float dm = d.m - dli - dlf;
  const float to_f = g.share * dm;  // exact: the share is 1, 0 or 1/2
  da[0] = dli + (dm - to_f);
  da[1] = dlf + to_f;
  da[2] = dc * g.i * (1.0f - g.z * g.z);
  da[3] = dh * q * g.o * (1.0f - g.o);
  d.c = dc * g.f;
  d.n = dn * g.f;
  d.m = da[1];
}

}  // namespace exphil::kernels
