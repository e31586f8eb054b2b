// Declarations of the per-(op, dtype) launchers. Each is explicitly
// instantiated in its own generated translation unit (scan_instance.cu.in),
// so that the dispatcher compiles no kernels and the build parallelises.
#pragma once

#include <cuda_runtime_api.h>

#include "scan/scan_launch.h"
#include "scan/scan_params.h"

namespace exphil::kernels {

template <class Op, class Elem>
LaunchResult run_scan_forward(const ScanForwardParams& params, const ScanPlan& plan,
                              float* d_workspace, cudaStream_t stream);

template <class Op, class Elem>
LaunchResult run_scan_backward(const ScanBackwardParams& params, const ScanPlan& plan,
                               float* d_workspace, cudaStream_t stream);

}  // namespace exphil::kernels
