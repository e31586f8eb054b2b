// Validation of attention calls before anything touches the GPU: presence,
// dtypes, ranks, shapes, layout, options, alignment and overlaps. Fills the
// kernel params and the tensors whose placement the caller then checks on
// the device.
#pragma once

#include "attention/attention_params.h"
#include "exphil/attention.hpp"
#include "runtime/tensor_checks.hpp"

namespace exphil::runtime {

struct AttentionCall {
  kernels::AttentionShape shape;
  CallTensors tensors;
};

Status validate_attention_forward(const AttentionForwardArgs& args,
                                  kernels::AttentionForwardParams& params, AttentionCall& call);
Status validate_attention_backward(const AttentionBackwardArgs& args,
                                   kernels::AttentionBackwardParams& params, AttentionCall& call);

}  // namespace exphil::runtime
