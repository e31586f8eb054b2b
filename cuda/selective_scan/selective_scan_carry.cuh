/*
 * Carry pass between chunks of a selective scan (see
 * selective_scan_forward.cuh, "Chunks").
 *
 * One thread per (batch row, channel, state) walks the chunks in order:
 * forward, H_c (the state entering chunk c) = exp(A * sum delta_{c-1}) *
 * H_{c-1} + S_{c-1}, starting from h0, where S is a chunk's end state from
 * a zero start; backward, G_c (the gradient reaching the end of chunk c) =
 * L_{c+1} + exp(A * sum delta_{c+1}) * G_{c+1}, starting from grad_h_final,
 * where L is the gradient a chunk sends to its start state from a zero end
 * gradient. Each result overwrites the aggregate it replaces: the
 * checkpoints the apply pass and the backward start from.
 *
 * Cost: B * D * N threads, chunks steps each, one exp per step.
 */
#pragma once

#include <cuda_runtime.h>

#include "selective_scan/selective_scan_common.cuh"

namespace exphil::kernels {

template <bool kWithGrad>
__global__ void selective_scan_carry_kernel(const SelectiveScanBackwardParams bp,
                                            const SelectiveScanPlan plan, float* ws) {
  const SelectiveScanShape& s = bp.fwd.shape;
  const int64_t count = s.batch * s.channels * s.states;
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= count) return;
  const int64_t n = i % s.states;
  const int64_t d = (i / s.states) % s.channels;
  const int64_t b = i / (s.states * s.channels);
  const float A2 = bp.fwd.d_A[d * s.states + n] * ss::kLog2e;
  const auto at = [&](int c) { return ((b * plan.chunks + c) * s.channels + d) * s.states + n; };
  const auto delta_sum = [&](int c) {
    return ws[plan.ws_delta_sum + (b * plan.chunks + c) * s.channels + d];
  };

  float state = bp.fwd.d_h0 ? bp.fwd.d_h0[i] : 0.0f;
  for (int c = 0; c < plan.chunks; ++c) {
    float* slot = ws + plan.ws_carry + at(c);
    // The last chunk's aggregate is not computed by the forward; its start
    // state is all the apply pass needs.
    const float end_from_zero = c + 1 < plan.chunks ? *slot : 0.0f;
    *slot = state;
    if (c + 1 < plan.chunks) state = fmaf(exp2f(A2 * delta_sum(c)), state, end_from_zero);
  }
  if (kWithGrad) {
    float grad = bp.d_grad_h_final ? bp.d_grad_h_final[i] : 0.0f;
    for (int c = plan.chunks - 1; c >= 0; --c) {
      float* slot = ws + plan.ws_carry_grad + at(c);
      const float sent_from_zero = *slot;
      *slot = grad;
      grad = fmaf(exp2f(A2 * delta_sum(c)), grad, sent_from_zero);
    }
  }
}

}  // namespace exphil::kernels
