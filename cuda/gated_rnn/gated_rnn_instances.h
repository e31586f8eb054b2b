// Declarations of the per-(dtype, cell) gated-RNN launchers. Each is
// explicitly instantiated in its own generated translation unit
// (gated_rnn_instance.cu.in), so the dispatcher compiles no kernels and the
// build parallelises.
#pragma once

#include <cuda_runtime_api.h>

#include "gated_rnn/gated_rnn_launch.h"

namespace exphil::kernels {

template <class Elem, GatedRnnCell kCell>
LaunchResult run_gated_rnn_forward(const GatedRnnForwardParams& params, const GatedRnnPlan& plan,
                                   float* d_workspace, cudaStream_t stream);

template <class Elem, GatedRnnCell kCell>
LaunchResult run_gated_rnn_backward(const GatedRnnBackwardParams& params, const GatedRnnPlan& plan,
                                    float* d_workspace, cudaStream_t stream);

template <class Elem, GatedRnnCell kCell>
LaunchResult run_gated_rnn_stack_forward(const GatedRnnStackParams& params,
                                         const GatedRnnPlan& plan, float* d_workspace,
                                         cudaStream_t stream);

}  // namespace exphil::kernels
