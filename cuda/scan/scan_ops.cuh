// The recurrences as coefficient maps: each op turns its inputs at one
// (t, channel) into the (a, b) of h_t = a * h_{t-1} + b, and gives the
// gradients of its inputs from g = dL/dh_t and h_{t-1}. The scan kernels are
// written once against this interface.
//
// Every formula avoids the cancellations that matter in f32: 1 - sigmoid(x)
// is computed as sigmoid(-x), and 1 - exp(-1/tau) as -expm1(-1/tau).
#pragma once

#include <cuda_runtime.h>

namespace exphil::kernels {

// s = sigmoid(x) and s_neg = sigmoid(-x) = 1 - s, each to full precision.
__device__ __forceinline__ void sigmoid_pair(float x, float& s, float& s_neg) {
  const float e = expf(-fabsf(x));
  const float r = 1.0f / (1.0f + e);
  s = x >= 0.0f ? r : e * r;
  s_neg = x >= 0.0f ? e * r : r;
}

// h_t = a_t * h_{t-1} + b_t. Inputs: a, b.
struct LinearScanOp {
  static constexpr int kInputs = 2;
  __device__ __forceinline__ static void coefficients(const float (&x)[2], float& a, float& b) {
    a = x[0];
    b = x[1];
  }
  __device__ __forceinline__ static void input_gradients(const float (&x)[2], float h_prev, float g,
                                                         float (&dx)[2]) {
    dx[0] = g * h_prev;
    dx[1] = g;
  }
};

// z = sigmoid(gate); h_t = (1 - z) h_{t-1} + z c. Inputs: gate, candidate.
struct MinGruOp {
  static constexpr int kInputs = 2;
  __device__ __forceinline__ static void coefficients(const float (&x)[2], float& a, float& b) {
    float z, one_minus_z;
    sigmoid_pair(x[0], z, one_minus_z);
    a = one_minus_z;
    b = z * x[1];
  }
  __device__ __forceinline__ static void input_gradients(const float (&x)[2], float h_prev, float g,
                                                         float (&dx)[2]) {
    float z, one_minus_z;
    sigmoid_pair(x[0], z, one_minus_z);
    dx[0] = g * (x[1] - h_prev) * z * one_minus_z;
    dx[1] = g * z;
  }
};

// f = sigmoid(forget), i = sigmoid(input), s = f + i + eps;
// h_t = (f / s) h_{t-1} + (i / s) c. Inputs: forget, input, candidate.
struct MinLstmOp {
  static constexpr int kInputs = 3;
  static constexpr float kEps = 1e-6f;
  __device__ __forceinline__ static void coefficients(const float (&x)[3], float& a, float& b) {
    float f, f_neg, i, i_neg;
    sigmoid_pair(x[0], f, f_neg);
    sigmoid_pair(x[1], i, i_neg);
    const float inv_s = 1.0f / (f + i + kEps);
    a = f * inv_s;
    b = i * inv_s * x[2];
  }
  __device__ __forceinline__ static void input_gradients(const float (&x)[3], float h_prev, float g,
                                                         float (&dx)[3]) {
    float f, f_neg, i, i_neg;
    sigmoid_pair(x[0], f, f_neg);
    sigmoid_pair(x[1], i, i_neg);
    const float inv_s = 1.0f / (f + i + kEps);
    const float g_s2 = g * inv_s * inv_s;
    // dh/df = (h_prev (i + eps) - i c) / s^2, dh/di = (c (f + eps) - f h_prev) / s^2
    dx[0] = g_s2 * (h_prev * (i + kEps) - i * x[2]) * f * f_neg;
    dx[1] = g_s2 * (x[2] * (f + kEps) - f * h_prev) * i * i_neg;
    dx[2] = g * i * inv_s;
  }
};

// e = exp(-1 / tau); h_t = target + (h_{t-1} - target) e. Inputs: tau, target.
struct LiquidOp {
  static constexpr int kInputs = 2;
  __device__ __forceinline__ static void coefficients(const float (&x)[2], float& a, float& b) {
    const float q = -1.0f / x[0];
    a = expf(q);
    b = x[1] * -expm1f(q);
  }
  __device__ __forceinline__ static void input_gradients(const float (&x)[2], float h_prev, float g,
                                                         float (&dx)[2]) {
    const float inv_tau = 1.0f / x[0];
    const float e = expf(-inv_tau);
    // de/dtau = e / tau^2
    dx[0] = g * (h_prev - x[1]) * e * inv_tau * inv_tau;
    dx[1] = g * -expm1f(-inv_tau);
  }
};

// min_gru on a gate already through the sigmoid (Edifice passes z =
// sigmoid(gate)): h_t = (1 - z) h_{t-1} + z c. Inputs: z, candidate; the
// gradient is with respect to z, dz = g (c - h_prev).
struct MinGruActivatedOp {
  static constexpr int kInputs = 2;
  __device__ __forceinline__ static void coefficients(const float (&x)[2], float& a, float& b) {
    a = 1.0f - x[0];
    b = x[0] * x[1];
  }
  __device__ __forceinline__ static void input_gradients(const float (&x)[2], float h_prev, float g,
                                                         float (&dx)[2]) {
    dx[0] = g * (x[1] - h_prev);
    dx[1] = g * x[0];
  }
};

// min_lstm on gates already through the sigmoid (Edifice passes f =
// sigmoid(forget), i = sigmoid(input)), normalised as Edifice does:
// s = f + (i + eps), h_t = (f / s) h_{t-1} + (i / s) c. Inputs: f, i,
// candidate; gradients with respect to f and i (the quotient rule of
// MinLstmOp without the sigmoid slopes).
struct MinLstmActivatedOp {
  static constexpr int kInputs = 3;
  static constexpr float kEps = 1e-6f;
  __device__ __forceinline__ static void coefficients(const float (&x)[3], float& a, float& b) {
    const float s = x[0] + (x[1] + kEps);
    a = x[0] / s;
    b = (x[1] / s) * x[2];
  }
  __device__ __forceinline__ static void input_gradients(const float (&x)[3], float h_prev, float g,
                                                         float (&dx)[3]) {
    const float f = x[0], i = x[1];
    const float inv_s = 1.0f / (f + (i + kEps));
    const float g_s2 = g * inv_s * inv_s;
    dx[0] = g_s2 * (h_prev * (i + kEps) - i * x[2]);
    dx[1] = g_s2 * (x[2] * (f + kEps) - f * h_prev);
    dx[2] = g * i * inv_s;
  }
};

// h_t = sigmoid(a) h_{t-1} + b: Edifice's diagonal linear recurrence, the
// decay through the sigmoid inside the op. Inputs: a (a logit), b.
struct DiagLinearOp {
  static constexpr int kInputs = 2;
  __device__ __forceinline__ static void coefficients(const float (&x)[2], float& a, float& b) {
    float s, s_neg;
    sigmoid_pair(x[0], s, s_neg);
    a = s;
    b = x[1];
  }
  __device__ __forceinline__ static void input_gradients(const float (&x)[2], float h_prev, float g,
                                                         float (&dx)[2]) {
    float s, s_neg;
    sigmoid_pair(x[0], s, s_neg);
    dx[0] = g * h_prev * s * s_neg;
    dx[1] = g;
  }
};

// 1 + elu(x): 1 + x above zero, exp(x) at and below it (1 + (exp(x) - 1)
// without the cancellation).
__device__ __forceinline__ float one_plus_elu(float x) { return x > 0.0f ? 1.0f + x : expf(x); }

// min_gru with the candidate through 1 + elu inside the op (Edifice's
// ELU-GRU, which keeps the candidate positive): z = sigmoid(gate),
// c = 1 + elu(candidate), h_t = (1 - z) h_{t-1} + z c. Inputs: gate,
// candidate; gradients with respect to both as given: MinGruOp's on c, times
// the slope of 1 + elu (1 above zero, exp(x) = c at and below it).
struct EluGruOp {
  static constexpr int kInputs = 2;
  __device__ __forceinline__ static void coefficients(const float (&x)[2], float& a, float& b) {
    const float activated[2] = {x[0], one_plus_elu(x[1])};
    MinGruOp::coefficients(activated, a, b);
  }
  __device__ __forceinline__ static void input_gradients(const float (&x)[2], float h_prev, float g,
                                                         float (&dx)[2]) {
    const float activated[2] = {x[0], one_plus_elu(x[1])};
    MinGruOp::input_gradients(activated, h_prev, g, dx);
    dx[1] *= x[1] > 0.0f ? 1.0f : activated[1];
  }
};

// Ops whose backward may leave out their last input: it reads the states
// h_{t-1} from y, and neither a_t nor the input gradients depend on that
// input. linear_scan's b: Edifice's :fused_linear_scan_backward (and that of
// its diagonal linear scan, on sigmoid(a)) never passes it.
template <class Op>
inline constexpr bool kBackwardWithoutLastInput = false;
template <>
inline constexpr bool kBackwardWithoutLastInput<LinearScanOp> = true;

}  // namespace exphil::kernels
