// Declarations of the per-(dtype, cell) gated-RNN launchers. Each is
// explicitly instantiated in its own generated translation unit
// (gated_rnn_instance.cu.in), so the dispatcher compiles no kernels and the
// build parallelises.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
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

template <class Elem, GatedRnnCell kCell>
LaunchResult run_gated_rnn_stack_backward(const GatedRnnStackBackwardParams& params,
                                          const GatedRnnPlan& plan, float* d_workspace,
                                          cudaStream_t stream);

// Each launcher is instantiated in its own file only: the stack's, which
// call the one-layer launchers, link to those instances instead of
// compiling their kernels again.
#define EXPHIL_GATED_RNN_EXTERN_LAUNCHERS(Elem, Cell)                                          \
  extern template LaunchResult run_gated_rnn_forward<Elem, GatedRnnCell::Cell>(                \
      const GatedRnnForwardParams&, const GatedRnnPlan&, float*, cudaStream_t);                 \
  extern template LaunchResult run_gated_rnn_backward<Elem, GatedRnnCell::Cell>(               \
      const GatedRnnBackwardParams&, const GatedRnnPlan&, float*, cudaStream_t);
#define EXPHIL_GATED_RNN_EXTERN_CELLS(Elem)   \
  EXPHIL_GATED_RNN_EXTERN_LAUNCHERS(Elem, gru)  \
  EXPHIL_GATED_RNN_EXTERN_LAUNCHERS(Elem, lstm) \
  EXPHIL_GATED_RNN_EXTERN_LAUNCHERS(Elem, slstm)
EXPHIL_GATED_RNN_EXTERN_CELLS(float)
EXPHIL_GATED_RNN_EXTERN_CELLS(__half)
EXPHIL_GATED_RNN_EXTERN_CELLS(__nv_bfloat16)
#undef EXPHIL_GATED_RNN_EXTERN_CELLS
#undef EXPHIL_GATED_RNN_EXTERN_LAUNCHERS

}  // namespace exphil::kernels
