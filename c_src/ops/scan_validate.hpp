// Validation of scan calls before anything touches the GPU: presence, dtypes,
// ranks, shapes, sizes, alignment and overlaps. Fills the kernel params and
// the list of tensors whose placement the caller then checks on the device.
#pragma once

#include "exphil/scan.hpp"
#include "scan/scan_params.h"
#include "runtime/tensor_checks.hpp"

namespace exphil::runtime {

struct ScanCall {
  kernels::ScanShape shape;
  // H % kScanVectorWidth == 0 and every sequence pointer aligned for it.
  bool vectorizable = false;
  CallTensors tensors;
};

Status validate_scan_forward(const ScanForwardArgs& args, kernels::ScanForwardParams& params,
                             ScanCall& call);
Status validate_scan_backward(const ScanBackwardArgs& args, kernels::ScanBackwardParams& params,
                              ScanCall& call);

}  // namespace exphil::runtime
