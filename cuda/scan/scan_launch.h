// Host-facing entry points of the scan kernels: plan, check, launch. No
// device code; the runtime in c_src/ includes this and nothing else of cuda/.
#pragma once

#include <cstddef>

#include <cuda_runtime_api.h>

#include "common/launch_result.h"
#include "exphil/scan.hpp"
#include "scan/scan_params.h"

namespace exphil::kernels {

// Chooses the layout of one call (scan_plan.cpp). `vectorizable`: H is a
// multiple of kScanVectorWidth and every sequence pointer is aligned to
// kScanVectorWidth elements.
ScanPlan plan_scan(ScanDirection direction, const ScanShape& shape, bool vectorizable,
                   int sm_count, const ScanLaunchOptions& options) noexcept;

// nullptr if the kernels can run `plan` on `shape`, else why not
// (CUTLASS's can_implement).
const char* scan_plan_unsupported(const ScanPlan& plan, const ScanShape& shape) noexcept;

// Temporary device memory the launch needs (0 for a single segment).
std::size_t scan_workspace_bytes(const ScanPlan& plan, const ScanShape& shape) noexcept;

// Kernel launches the plan makes.
int scan_kernel_count(const ScanPlan& plan) noexcept;

// Enqueue the kernels on `stream` (the current device must own it).
// d_workspace: scan_workspace_bytes() of device memory, ordered on `stream`.
LaunchResult launch_scan_forward(ScanOp op, const ScanForwardParams& params, const ScanPlan& plan,
                                 float* d_workspace, cudaStream_t stream) noexcept;
LaunchResult launch_scan_backward(ScanOp op, const ScanBackwardParams& params,
                                  const ScanPlan& plan, float* d_workspace,
                                  cudaStream_t stream) noexcept;

}  // namespace exphil::kernels
