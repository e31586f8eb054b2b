// Host-facing entry points of the attention kernels: plan, check, launch.
// No device code; the runtime in c_src/ includes this and nothing else of
// cuda/attention/.
#pragma once

#include <cstddef>
#include <cstdint>

#include <cuda_runtime_api.h>

#include "attention/attention_config.h"
#include "attention/attention_params.h"
#include "common/launch_result.h"

namespace exphil::kernels {

// Whether this build has the Hopper kernels (compiled for sm_90a) and a
// device of `compute_capability` (10 major + minor) can run them.
bool attention_wgmma_available(int compute_capability) noexcept;

// Chooses the layout of one call (attention_plan.cpp). forced_warps (1, 2
// or 4) fixes the warps per block where shared memory allows; 0 chooses.
// wgmma: attention_wgmma_available() for the call's device, and the caller
// allows the Hopper kernels. precision: the call's (f32 calls under tf32x3
// take other tiles and shared memory).
AttentionPlan plan_attention(AttentionDirection direction, const AttentionShape& shape,
                             DType dtype, AttentionMaskKind mask, int sm_count,
                             int forced_warps, bool wgmma = false,
                             AttentionPrecision precision = AttentionPrecision::exact) noexcept;

// nullptr if the kernels can run `plan` on `shape`, else why not.
const char* attention_unsupported(AttentionDirection direction, const AttentionPlan& plan,
                                  const AttentionShape& shape, DType dtype) noexcept;

// Whether a backward call with these outputs runs the fused kernel
// (attention_backward_fused.cuh): its plan allows it, and the call asks for
// dQ with dK or dV. The launch, the workspace and the launch info ask here.
inline bool attention_backward_runs_fused(const AttentionBackwardParams& params,
                                          const AttentionPlan& plan) noexcept {
  return plan.fused_backward && params.d_grad_q != nullptr &&
         (params.d_grad_k != nullptr || params.d_grad_v != nullptr);
}

// Device memory a backward call with these outputs needs: rowsum(dO * O)
// for the dK/dV or fused kernel (plan.ws_floats), followed, when the fused
// kernel computes dQ with dK or dV, by its counters
// (attention_fused_sync_words()); none without dK and dV (the dQ kernel
// keeps its rows' sums to itself). The forward needs none.
inline std::size_t attention_backward_workspace_bytes(const AttentionBackwardParams& params,
                                                      const AttentionPlan& plan) noexcept {
  const bool key_grads = params.d_grad_k != nullptr || params.d_grad_v != nullptr;
  if (!key_grads) return 0;
  const std::size_t rowdot = static_cast<std::size_t>(plan.ws_floats) * sizeof(float);
  if (!attention_backward_runs_fused(params, plan)) return rowdot;
  const AttentionShape& s = params.problem.shape;
  return rowdot + static_cast<std::size_t>(attention_fused_sync_words(s.batch, s.q_heads,
                                                                      s.q_len)) *
                      sizeof(uint32_t);
}

// Enqueue the kernels on `stream` (the current device must own it).
// d_workspace: attention_backward_workspace_bytes() of device memory ordered
// on `stream` (none for the forward).
LaunchResult launch_attention_forward(const AttentionForwardParams& params,
                                      const AttentionPlan& plan, cudaStream_t stream) noexcept;
LaunchResult launch_attention_backward(const AttentionBackwardParams& params,
                                       const AttentionPlan& plan, float* d_workspace,
                                       cudaStream_t stream) noexcept;

// Kernel launches of a backward call with these outputs: dQ (which also
// computes rowsum(dO * O)) or the rowsum kernel, then dK/dV or, fused, the
// kernel that computes all three.
int attention_backward_kernel_count(const AttentionBackwardParams& params) noexcept;

}  // namespace exphil::kernels
