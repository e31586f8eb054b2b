// Declarations of the per-(dtype, head width) attention launchers. Each pair
// is explicitly instantiated in its own generated translation unit
// (attention_instance.cu.in), so the dispatcher compiles no kernels and the
// build parallelises.
#pragma once

#include <cuda_runtime_api.h>

#include "attention/attention_launch.h"

namespace exphil::kernels {

template <class Elem, int kD>
LaunchResult run_attention_forward(const AttentionForwardParams& params, const AttentionPlan& plan,
                                   cudaStream_t stream);

template <class Elem, int kD>
LaunchResult run_attention_backward(const AttentionBackwardParams& params,
                                    const AttentionPlan& plan, float* d_workspace,
                                    cudaStream_t stream);

}  // namespace exphil::kernels
