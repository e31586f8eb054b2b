// Declarations of the per-dtype selective-scan launchers. Each is explicitly
// instantiated in its own generated translation unit
// (selective_scan_instance.cu.in), so the dispatcher compiles no kernels and
// the build parallelises.
#pragma once

#include <cuda_runtime_api.h>

#include "selective_scan/selective_scan_launch.h"

namespace exphil::kernels {

template <class Elem>
LaunchResult run_selective_scan_forward(const SelectiveScanForwardParams& params,
                                        const SelectiveScanPlan& plan, float* d_workspace,
                                        cudaStream_t stream);

template <class Elem>
LaunchResult run_selective_scan_backward(const SelectiveScanBackwardParams& params,
                                         const SelectiveScanPlan& plan, float* d_workspace,
                                         cudaStream_t stream);

}  // namespace exphil::kernels
