// See selective_scan_stepwise.h. Plain code: the baseline measures the
// schedule (T launches, state through device memory), not clever kernels.
#include "selective_scan_stepwise.h"

#include <cuda_bf16.h>

#include "common/dtype.cuh"

namespace exphil::bench {

using namespace exphil::kernels;

namespace {

constexpr int kThreads = 256;

__device__ float step_delta(const SelectiveScanForwardParams& p, float dt, int64_t d) {
  float u = dt + (p.d_dt_bias ? p.d_dt_bias[d] : 0.0f);
  if (p.delta.softplus) u = log1pf(expf(u));
  if (p.delta.clamp) u = fminf(fmaxf(u, p.delta.dt_min), p.delta.dt_max);
  return u;
}

// This thread's channel at step t: where its values are, x and delta.
struct Step {
  int64_t i;        // b * D + d
  int64_t b, d, at;  // at: offset of (b, t, d) in [B, T, D]
  int64_t bn0;      // offset of (b, t, 0) in [B, T, N]
  float x, delta;
  int64_t prev, next;  // offsets of h_{t-1} and h_t in the [B, T + 1, D, N] history
};

// False for threads past the last channel.
template <class Elem>
__device__ bool step_of(const SelectiveScanForwardParams& p, int64_t t, Step& st) {
  const auto& s = p.shape;
  st.i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (st.i >= s.batch * s.channels) return false;
  st.b = st.i / s.channels;
  st.d = st.i % s.channels;
  st.at = (st.b * s.steps + t) * s.channels + st.d;
  st.bn0 = (st.b * s.steps + t) * s.states;
  st.x = to_float(static_cast<const Elem*>(p.d_x)[st.at]);
  st.delta = step_delta(p, to_float(static_cast<const Elem*>(p.d_dt)[st.at]), st.d);
  st.prev = ((st.b * (s.steps + 1) + t) * s.channels + st.d) * s.states;
  st.next = st.prev + s.channels * s.states;
  return true;
}

template <class Elem>
__global__ void forward_step(const SelectiveScanForwardParams p, float* history, int64_t t) {
  const auto& s = p.shape;
  Step st;
  if (!step_of<Elem>(p, t, st)) return;
  float y = 0.0f;
  for (int64_t n = 0; n < s.states; ++n) {
    const int64_t bn = st.bn0 + n;
    const float h = expf(st.delta * p.d_A[st.d * s.states + n]) * history[st.prev + n] +
                    st.delta * to_float(static_cast<const Elem*>(p.d_B)[bn]) * st.x;
    history[st.next + n] = h;
    y += to_float(static_cast<const Elem*>(p.d_C)[bn]) * h;
  }
  static_cast<Elem*>(p.d_y)[st.at] = from_float<Elem>(y);
}

template <class Elem>
__global__ void backward_step(const SelectiveScanBackwardParams bp, const float* history,
                              float* grad_state, float* dA_parts, float* dBC, int64_t t) {
  const SelectiveScanForwardParams& p = bp.fwd;
  const auto& s = p.shape;
  Step st;
  if (!step_of<Elem>(p, t, st)) return;
  const float x = st.x, delta = st.delta;
  const float dy = to_float(static_cast<const Elem*>(bp.d_grad_y)[st.at]);
  float* g = grad_state + st.i * s.states;
  float dx = 0.0f, ddelta = 0.0f;
  for (int64_t n = 0; n < s.states; ++n) {
    const int64_t bn = st.bn0 + n;
    const float A = p.d_A[st.d * s.states + n];
    const float a = expf(delta * A);
    const float Bn = to_float(static_cast<const Elem*>(p.d_B)[bn]);
    const float Cn = to_float(static_cast<const Elem*>(p.d_C)[bn]);
    const float h_prev = history[st.prev + n];
    const float gn = (t + 1 < s.steps ? g[n] : 0.0f) + dy * Cn;
    atomicAdd(&dBC[bn], gn * delta * x);
    atomicAdd(&dBC[s.batch * s.steps * s.states + bn], dy * history[st.next + n]);
    dx += gn * delta * Bn;
    ddelta += gn * (Bn * x + A * a * h_prev);
    dA_parts[st.i * s.states + n] += gn * a * h_prev * delta;
    g[n] = a * gn;
  }
  static_cast<Elem*>(bp.d_grad_x)[st.at] = from_float<Elem>(dx);
  static_cast<Elem*>(bp.d_grad_dt)[st.at] = from_float<Elem>(ddelta);
}

unsigned blocks(int64_t n) { return static_cast<unsigned>((n + kThreads - 1) / kThreads); }

template <class Elem>
cudaError_t forward_all(const SelectiveScanForwardParams& p, float* history, cudaStream_t stream) {
  const auto& s = p.shape;
  for (int64_t t = 0; t < s.steps; ++t) {
    forward_step<Elem><<<blocks(s.batch * s.channels), kThreads, 0, stream>>>(p, history, t);
    if (const cudaError_t e = cudaGetLastError(); e != cudaSuccess) return e;
  }
  return cudaSuccess;
}

template <class Elem>
cudaError_t backward_all(const SelectiveScanBackwardParams& bp, const float* history,
                         float* grad_state, float* dA_parts, float* dBC, cudaStream_t stream) {
  const auto& s = bp.fwd.shape;
  cudaError_t e = cudaMemsetAsync(dBC, 0, 2 * s.batch * s.steps * s.states * sizeof(float), stream);
  if (e == cudaSuccess)
    e = cudaMemsetAsync(dA_parts, 0, s.batch * s.channels * s.states * sizeof(float), stream);
  if (e != cudaSuccess) return e;
  for (int64_t t = s.steps - 1; t >= 0; --t) {
    backward_step<Elem><<<blocks(s.batch * s.channels), kThreads, 0, stream>>>(
        bp, history, grad_state, dA_parts, dBC, t);
    if ((e = cudaGetLastError()) != cudaSuccess) return e;
  }
  return cudaSuccess;
}

}  // namespace

cudaError_t launch_stepwise_selective_forward(const SelectiveScanForwardParams& p,
                                              float* d_history, cudaStream_t stream) {
  if (p.dtype == DType::bf16) return forward_all<__nv_bfloat16>(p, d_history, stream);
  if (p.dtype == DType::f32) return forward_all<float>(p, d_history, stream);
  return cudaErrorInvalidValue;
}

cudaError_t launch_stepwise_selective_backward(const SelectiveScanBackwardParams& p,
                                               const float* d_history, float* d_grad_state,
                                               float* d_dA_parts, float* d_dBC,
                                               cudaStream_t stream) {
  if (p.fwd.dtype == DType::bf16)
    return backward_all<__nv_bfloat16>(p, d_history, d_grad_state, d_dA_parts, d_dBC, stream);
  if (p.fwd.dtype == DType::f32)
    return backward_all<float>(p, d_history, d_grad_state, d_dA_parts, d_dBC, stream);
  return cudaErrorInvalidValue;
}

}  // namespace exphil::bench
