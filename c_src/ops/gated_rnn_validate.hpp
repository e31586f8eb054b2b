// Validation of GRU, LSTM and sLSTM sequence calls before anything touches the GPU:
// presence, dtypes, ranks, shapes, sizes, alignment and overlaps. Fills the
// kernel params and the tensors whose placement the caller then checks on
// the device.
#pragma once

#include "exphil/gated_rnn.hpp"
#include "gated_rnn/gated_rnn_params.h"
#include "runtime/tensor_checks.hpp"

namespace exphil::runtime {

struct GatedRnnCall {
  kernels::GatedRnnShape shape;
  CallTensors tensors;
};

Status validate_gated_rnn_forward(const GatedRnnForwardArgs& args, kernels::GatedRnnForwardParams& params,
                                  GatedRnnCall& call);
Status validate_gated_rnn_stack_forward(const GatedRnnStackForwardArgs& args,
                                        kernels::GatedRnnStackParams& params, GatedRnnCall& call);
Status validate_gated_rnn_stack_backward(const GatedRnnStackBackwardArgs& args,
                                         kernels::GatedRnnStackBackwardParams& params, GatedRnnCall& call);
Status validate_gated_rnn_backward(const GatedRnnBackwardArgs& args, kernels::GatedRnnBackwardParams& params,
                                   GatedRnnCall& call);

}  // namespace exphil::runtime
