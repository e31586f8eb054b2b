// Host-facing entry points of the selective-scan kernels: plan, check,
// launch. No device code; the runtime in c_src/ includes this and nothing
// else of cuda/selective_scan/.
#pragma once

#include <cstddef>

#include <cuda_runtime_api.h>

#include "common/launch_result.h"
#include "selective_scan/selective_scan_params.h"

namespace exphil::kernels {

// Chooses the layout of one call (selective_scan_plan.cpp). chunk_steps > 0
// forces the chunk length (rounded up to a multiple of kSsForwardTile, and
// capped by the backward's checkpoint memory). mean_input_scale (forward
// only): the input term scaled by the mean of delta over the channels
// (SelectiveScanPlan::ws_input_scale).
SelectiveScanPlan plan_selective_scan(SelectiveScanDirection direction,
                                      const SelectiveScanShape& shape, int sm_count,
                                      long long chunk_steps, bool mean_input_scale = false) noexcept;

// nullptr if the kernels can run `plan` on `shape`, else why not.
const char* selective_scan_unsupported(const SelectiveScanPlan& plan,
                                       const SelectiveScanShape& shape) noexcept;

inline std::size_t selective_scan_workspace_bytes(const SelectiveScanPlan& plan) noexcept {
  return static_cast<std::size_t>(plan.ws_floats) * sizeof(float);
}

int selective_scan_kernel_count(SelectiveScanDirection direction,
                                const SelectiveScanPlan& plan) noexcept;

// Enqueue the kernels on `stream` (the current device must own it).
// d_workspace: selective_scan_workspace_bytes(plan) of device memory
// ordered on `stream`.
LaunchResult launch_selective_scan_forward(const SelectiveScanForwardParams& params,
                                           const SelectiveScanPlan& plan, float* d_workspace,
                                           cudaStream_t stream) noexcept;
LaunchResult launch_selective_scan_backward(const SelectiveScanBackwardParams& params,
                                            const SelectiveScanPlan& plan, float* d_workspace,
                                            cudaStream_t stream) noexcept;

}  // namespace exphil::kernels
