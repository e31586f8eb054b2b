// Kernels the benchmark needs besides the library's own: the one-launch-per-
// timestep baseline (what an unrolled XLA loop does with a recurrence), a
// device-side random fill, and an empty kernel for the launch floor.
#pragma once

#include <cstddef>
#include <cstdint>

#include <cuda_runtime_api.h>

#include "exphil/scan.hpp"
#include "scan/scan_params.h"

namespace exphil::bench {

// T launches, t = 0 .. T-1; d_state: B * H floats of scratch (the carry).
// Supports f32 and bf16.
cudaError_t launch_stepwise_forward(ScanOp op, const kernels::ScanForwardParams& params,
                                    float* d_state, cudaStream_t stream);
// T launches, t = T-1 .. 0; d_carry: B * H floats of scratch.
cudaError_t launch_stepwise_backward(ScanOp op, const kernels::ScanBackwardParams& params,
                                     float* d_carry, cudaStream_t stream);

// Fills n elements of `dtype` with a hash of (seed, index) mapped to [lo, hi).
cudaError_t fill_uniform(void* d_data, DType dtype, std::size_t n, float lo, float hi,
                         uint64_t seed, cudaStream_t stream);

cudaError_t launch_empty_kernel(cudaStream_t stream);

}  // namespace exphil::bench
