// Validation of selective-scan calls before anything touches the GPU:
// presence, dtypes, ranks, shapes, sizes, alignment, options and overlaps.
// Fills the kernel params and the tensors whose placement the caller then
// checks on the device.
#pragma once

#include "exphil/selective_scan.hpp"
#include "selective_scan/selective_scan_params.h"
#include "runtime/tensor_checks.hpp"

namespace exphil::runtime {

struct SelectiveScanCall {
  kernels::SelectiveScanShape shape;
  CallTensors tensors;
  bool mean_input_scale = false;  // SelectiveScanInputScale::channel_mean (forward)
};

Status validate_selective_scan_forward(const SelectiveScanForwardArgs& args,
                                       kernels::SelectiveScanForwardParams& params,
                                       SelectiveScanCall& call);
Status validate_selective_scan_backward(const SelectiveScanBackwardArgs& args,
                                        kernels::SelectiveScanBackwardParams& params,
                                        SelectiveScanCall& call);

}  // namespace exphil::runtime
