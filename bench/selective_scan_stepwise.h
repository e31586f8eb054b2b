// The one-launch-per-timestep baseline of the selective scan: what a loop
// over time does (an unrolled XLA graph, a PyTorch loop under autograd).
// Each launch advances every (b, d) channel by one step, its N states in
// device memory; the forward keeps every step's state, as autograd would,
// and the backward walks the steps in reverse from that history.
#pragma once

#include <cuda_runtime_api.h>

#include "selective_scan/selective_scan_params.h"

namespace exphil::bench {

// d_history: B * (T + 1) * D * N floats. f32 and bf16 only.
cudaError_t launch_stepwise_selective_forward(const kernels::SelectiveScanForwardParams& p,
                                              float* d_history, cudaStream_t stream);
// d_history as the forward left it; d_grad_state: B * D * N floats;
// d_dA_parts: B * D * N floats (per-batch-row parts of dA); d_dBC: 2 * B * T
// * N floats, summed into with atomics (zeroed here first).
cudaError_t launch_stepwise_selective_backward(const kernels::SelectiveScanBackwardParams& p,
                                               const float* d_history, float* d_grad_state,
                                               float* d_dA_parts, float* d_dBC, cudaStream_t stream);

}  // namespace exphil::bench
