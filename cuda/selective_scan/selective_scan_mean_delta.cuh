/*
 * The channel-mean input scale of Edifice's selective-scan forward
 * (SelectiveScanInputScale::channel_mean):
 *
 *   m[b, t] = (1 / D) sum_d delta(dt[b, t, d] + dt_bias[d])
 *
 * with delta as the scan computes it (DeltaRule: softplus, clamp), so the
 * forward kernel uses m[b, t] in place of each channel's delta in the input
 * term (selective_scan_forward.cuh, kMeanScale).
 *
 * One warp per (b, t) row: lane l adds channels l, l + 32, ... in order,
 * then a butterfly over the 32 lanes; lane 0's sum has a fixed order, so the
 * means are bitwise reproducible. Reads dt once (B T D elements, a pass at
 * copy bandwidth before a scan that reads dt again) and writes B T floats.
 */
#pragma once

#include <cstdint>

#include <cuda_runtime.h>

#include "selective_scan/selective_scan_common.cuh"

namespace exphil::kernels {

constexpr int kMeanDeltaThreads = 256;

// Rows of 32 lanes, grid-stride; no more blocks than keep every SM busy.
inline unsigned mean_delta_blocks(const SelectiveScanShape& s) {
  constexpr int64_t kRowsPerBlock = kMeanDeltaThreads / 32;
  constexpr int64_t kMaxBlocks = 8192;
  const int64_t blocks = (s.batch * s.steps + kRowsPerBlock - 1) / kRowsPerBlock;
  return static_cast<unsigned>(blocks < kMaxBlocks ? blocks : kMaxBlocks);
}

template <class Elem>
__global__ void __launch_bounds__(kMeanDeltaThreads)
    selective_scan_mean_delta_kernel(const SelectiveScanForwardParams p, float* __restrict__ means) {
  using namespace ss;
  const auto* dt = static_cast<const Elem*>(p.d_dt);
  const int lane = static_cast<int>(threadIdx.x) % 32;
  const int64_t rows = p.shape.batch * p.shape.steps;
  const int64_t channels = p.shape.channels;
  const int64_t warps = static_cast<int64_t>(gridDim.x) * (blockDim.x / 32);
  // Every lane of a warp takes the same rows, so the shuffles see all 32.
  for (int64_t row = (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) / 32;
       row < rows; row += warps) {
    float sum = 0.0f;
    for (int64_t d = lane; d < channels; d += 32) {
      float slope;
      const float bias = p.d_dt_bias ? p.d_dt_bias[d] : 0.0f;
      sum += delta_of(to_float(dt[row * channels + d]) + bias, p.delta, slope);
    }
#pragma unroll
    for (int offset = 16; offset > 0; offset /= 2) sum += __shfl_xor_sync(0xffffffffu, sum, offset);
    if (lane == 0) means[row] = sum / static_cast<float>(channels);
  }
}

}  // namespace exphil::kernels
