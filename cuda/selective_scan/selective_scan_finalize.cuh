/*
 * The kernels that finish a selective scan after its main pass.
 *
 * Finalize (only when N spans several state groups): adds the groups' sums
 * over n in group order, then applies the skip weight and the gate: y in
 * the forward; dx, d dt and dz in the backward, which also sums dD and
 * d dt_bias over its chunk. One thread per channel walking the chunk's steps,
 * so those sums have a fixed order.
 *
 * Reduce (backward): every sum across blocks, in a fixed order: dB and dC
 * over channel blocks, dA, dD and d dt_bias over batch rows and chunks.
 * One thread per output element.
 */
#pragma once

#include <cuda_runtime.h>

#include "selective_scan/selective_scan_backward.cuh"
#include "selective_scan/selective_scan_common.cuh"

namespace exphil::kernels {

inline constexpr int kSsFinalizeThreads = 128;

template <class Elem>
__global__ void selective_scan_forward_finalize_kernel(const SelectiveScanForwardParams p,
                                                       const SelectiveScanPlan plan,
                                                       const float* ws) {
  const SelectiveScanShape& s = p.shape;
  const int64_t plane = s.batch * s.steps * s.channels;
  const float* sums = ws + plan.ws_group_sums;
  for (int64_t off = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; off < plane;
       off += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t d = off % s.channels;
    float y = 0.0f;
    for (int grp = 0; grp < plan.state_groups; ++grp) y += sums[grp * plane + off];
    if (p.d_D) y = fmaf(p.d_D[d], to_float(static_cast<const Elem*>(p.d_x)[off]), y);
    if (p.d_z) y *= ss::silu(to_float(static_cast<const Elem*>(p.d_z)[off]));
    static_cast<Elem*>(p.d_y)[off] = from_float<Elem>(y);
  }
}

// Grid: x = B * ceil(D / kSsFinalizeThreads), y = chunks.
template <class Elem>
__global__ void __launch_bounds__(kSsFinalizeThreads)
    selective_scan_backward_finalize_kernel(const SelectiveScanBackwardParams bp,
                                            const SelectiveScanPlan plan, float* ws) {
  const SelectiveScanForwardParams& p = bp.fwd;
  const SelectiveScanShape& s = p.shape;
  const int64_t blocks_per_row = (s.channels + kSsFinalizeThreads - 1) / kSsFinalizeThreads;
  const int64_t b = blockIdx.x / blocks_per_row;
  const int64_t d = (blockIdx.x % blocks_per_row) * kSsFinalizeThreads + threadIdx.x;
  if (d >= s.channels) return;
  const int chunk = blockIdx.y;
  const int64_t t_begin = static_cast<int64_t>(chunk) * plan.chunk_steps;
  const int64_t t_end = t_begin + plan.chunk_steps < s.steps ? t_begin + plan.chunk_steps : s.steps;
  const int64_t plane = s.batch * s.steps * s.channels;
  const int groups = plan.state_groups;
  const float* sums = ws + plan.ws_group_sums;
  const float bias = p.d_dt_bias ? p.d_dt_bias[d] : 0.0f;
  const float skip = p.d_D ? p.d_D[d] : 0.0f;

  float dD_sum = 0.0f, dbias_sum = 0.0f;
  for (int64_t t = t_begin; t < t_end; ++t) {
    const int64_t off = (b * s.steps + t) * s.channels + d;
    float y = 0.0f, dx = 0.0f, dd = 0.0f;
    for (int grp = 0; grp < groups; ++grp) {
      y += sums[grp * plane + off];
      dx += sums[(groups + grp) * plane + off];
      dd += sums[(2 * groups + grp) * plane + off];
    }
    float slope;
    (void)ss::delta_of(to_float(static_cast<const Elem*>(p.d_dt)[off]) + bias, p.delta, slope);
    const float dy = to_float(static_cast<const Elem*>(bp.d_grad_y)[off]);
    float dyp = dy, zgrad = 0.0f;
    if (p.d_z) {
      const float z = to_float(static_cast<const Elem*>(p.d_z)[off]);
      dyp = dy * ss::silu(z);
      zgrad = dy * ss::silu_grad(z);
    }
    float dD_term, dbias_term;
    ss::finish_element<Elem>(bp, off, to_float(static_cast<const Elem*>(p.d_x)[off]), slope, dyp,
                             zgrad, skip, y, dx, dd, dD_term, dbias_term);
    dD_sum += dD_term;
    dbias_sum += dbias_term;
  }
  const int64_t part = ((b * plan.chunks + chunk) * s.channels + d) * (s.states + 2);
  ws[plan.ws_params + part + s.states] = dD_sum;
  ws[plan.ws_params + part + s.states + 1] = dbias_sum;
}

// Loads of one sum issued together before any is added: each thread's sum
// is a chain of DRAM reads, and issued one at a time they leave the kernel
// latency-bound (10 us at B32 T256 D512 N16, 1.7 TB/s). The adds still run
// in index order, so the result is the same, bit for bit.
inline constexpr int kSsReduceBatch = 16;

// Sum of src[k * stride] for k in [0, count), added in order of k.
__device__ __forceinline__ float ordered_strided_sum(const float* __restrict__ src, int64_t count,
                                                     int64_t stride) {
  float sum = 0.0f;
  int64_t k = 0;
  for (; k + kSsReduceBatch <= count; k += kSsReduceBatch) {
    float v[kSsReduceBatch];
#pragma unroll
    for (int j = 0; j < kSsReduceBatch; ++j) v[j] = src[(k + j) * stride];
#pragma unroll
    for (int j = 0; j < kSsReduceBatch; ++j) sum += v[j];
  }
  for (; k < count; ++k) sum += src[k * stride];
  return sum;
}

template <class Elem>
__global__ void selective_scan_reduce_kernel(const SelectiveScanBackwardParams bp,
                                             const SelectiveScanPlan plan, const float* ws) {
  const SelectiveScanShape& s = bp.fwd.shape;
  const int64_t proj = s.batch * s.steps * s.states;       // elements of dB (and of dC)
  const int64_t params = s.channels * (s.states + 2);      // dA, then dD and d dt_bias
  const int64_t parts = s.batch * plan.chunks;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
       i < 2 * proj + params; i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    if (i < 2 * proj) {
      const int which = i < proj ? 0 : 1;
      void* out = which == 0 ? bp.d_grad_B : bp.d_grad_C;
      if (!out) continue;
      const int64_t e = i - which * proj;  // (b, t, n)
      const float* src = ws + plan.ws_proj + which * plan.channel_groups * proj + e;
      static_cast<Elem*>(out)[e] = from_float<Elem>(ordered_strided_sum(src, plan.channel_groups, proj));
      continue;
    }
    const int64_t e = i - 2 * proj;
    const int64_t d = e / (s.states + 2), kk = e % (s.states + 2);
    float* out = kk < s.states ? bp.d_grad_A : kk == s.states ? bp.d_grad_D : bp.d_grad_dt_bias;
    if (!out) continue;
    out[kk < s.states ? d * s.states + kk : d] = ordered_strided_sum(ws + plan.ws_params + e, parts, params);
  }
}

}  // namespace exphil::kernels
