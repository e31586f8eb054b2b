// Definitions of the per-dtype launchers declared in
// selective_scan_instances.h: the chunk aggregate and carry passes (chunks
// > 1), the scan, the finalize (state groups > 1) and, backward, the
// reduction of parameter gradients. Included only by the generated instance
// files.
#pragma once

#include <algorithm>
#include <atomic>
#include <cstdint>

#include <cuda_runtime.h>

#include "common/dynamic_shared_memory.h"
#include "selective_scan/selective_scan_backward.cuh"
#include "selective_scan/selective_scan_carry.cuh"
#include "selective_scan/selective_scan_finalize.cuh"
#include "selective_scan/selective_scan_forward.cuh"
#include "selective_scan/selective_scan_instances.h"
#include "selective_scan/selective_scan_mean_delta.cuh"
#include "selective_scan/selective_scan_shared_memory.h"

namespace exphil::kernels {
namespace ss_launch {

constexpr int kFlatThreads = 256;
// Grid-stride kernels need no more blocks than keep every SM busy.
constexpr int64_t kMaxFlatBlocks = 8192;

inline unsigned flat_blocks(int64_t count) {
  return static_cast<unsigned>(
      std::clamp<int64_t>((count + kFlatThreads - 1) / kFlatThreads, 1, kMaxFlatBlocks));
}

inline dim3 scan_block(const SelectiveScanPlan& plan) {
  return dim3(kSsChannelsPerBlock, plan.slices);
}

inline unsigned scan_grid_x(const SelectiveScanShape& s, const SelectiveScanPlan& plan) {
  return static_cast<unsigned>(s.batch * plan.channel_groups * plan.state_groups);
}

// The forward never needs the last chunk's aggregate; the backward needs
// its gradient.
template <class Elem, bool kWithGrad, bool kMeanScale = false>
LaunchResult aggregate_and_carry(const SelectiveScanBackwardParams& bp,
                                 const SelectiveScanPlan& plan, float* ws, cudaStream_t stream) {
  constexpr SsForwardPass kPass = kWithGrad ? SsForwardPass::aggregate_grad : SsForwardPass::aggregate;
  const SelectiveScanShape& s = bp.fwd.shape;
  const auto smem =
      static_cast<std::size_t>(selective_scan_forward_shared_bytes(plan.slices, 4, kMeanScale));
  const dim3 grid(scan_grid_x(s, plan), static_cast<unsigned>(kWithGrad ? plan.chunks : plan.chunks - 1));
  selective_scan_forward_kernel<Elem, kPass, 4, kMeanScale>
      <<<grid, scan_block(plan), smem, stream>>>(bp, plan, ws);
  EXPHIL_RETURN_IF_LAUNCH_FAILED("selective_scan_forward_kernel (aggregate pass)");
  selective_scan_carry_kernel<kWithGrad>
      <<<flat_blocks(s.batch * s.channels * s.states), kFlatThreads, 0, stream>>>(bp, plan, ws);
  EXPHIL_RETURN_IF_LAUNCH_FAILED("selective_scan_carry_kernel");
  return {};
}

// The scan passes of the forward: the chunk aggregates and carry (chunks >
// 1), then the apply pass.
template <class Elem, bool kMeanScale>
LaunchResult forward_scan(const SelectiveScanBackwardParams& bp, const SelectiveScanPlan& plan,
                          float* d_workspace, cudaStream_t stream) {
  const SelectiveScanShape& s = bp.fwd.shape;
  if (plan.chunks > 1) {
    const LaunchResult r =
        aggregate_and_carry<Elem, false, kMeanScale>(bp, plan, d_workspace, stream);
    if (!r.ok()) return r;
  }
  const auto smem = static_cast<std::size_t>(
      selective_scan_forward_shared_bytes(plan.slices, plan.states_per_thread, kMeanScale));
  const dim3 grid(scan_grid_x(s, plan), plan.chunks);
  if (plan.states_per_thread == 2)
    selective_scan_forward_kernel<Elem, SsForwardPass::apply, 2, kMeanScale>
        <<<grid, scan_block(plan), smem, stream>>>(bp, plan, d_workspace);
  else
    selective_scan_forward_kernel<Elem, SsForwardPass::apply, 4, kMeanScale>
        <<<grid, scan_block(plan), smem, stream>>>(bp, plan, d_workspace);
  EXPHIL_RETURN_IF_LAUNCH_FAILED("selective_scan_forward_kernel");
  return {};
}

}  // namespace ss_launch

template <class Elem>
LaunchResult run_selective_scan_forward(const SelectiveScanForwardParams& params,
                                        const SelectiveScanPlan& plan, float* d_workspace,
                                        cudaStream_t stream) {
  using namespace ss_launch;
  clear_stale_launch_error();
  SelectiveScanBackwardParams bp;
  bp.fwd = params;
  const SelectiveScanShape& s = params.shape;
  if (plan.ws_input_scale >= 0) {
    selective_scan_mean_delta_kernel<Elem>
        <<<mean_delta_blocks(s), kMeanDeltaThreads, 0, stream>>>(params, d_workspace + plan.ws_input_scale);
    EXPHIL_RETURN_IF_LAUNCH_FAILED("selective_scan_mean_delta_kernel");
    const LaunchResult r = forward_scan<Elem, true>(bp, plan, d_workspace, stream);
    if (!r.ok()) return r;
  } else {
    const LaunchResult r = forward_scan<Elem, false>(bp, plan, d_workspace, stream);
    if (!r.ok()) return r;
  }
  if (plan.state_groups > 1) {
    selective_scan_forward_finalize_kernel<Elem>
        <<<flat_blocks(s.batch * s.steps * s.channels), kFlatThreads, 0, stream>>>(params, plan,
                                                                                   d_workspace);
    EXPHIL_RETURN_IF_LAUNCH_FAILED("selective_scan_forward_finalize_kernel");
  }
  return {};
}

template <class Elem>
LaunchResult run_selective_scan_backward(const SelectiveScanBackwardParams& params,
                                         const SelectiveScanPlan& plan, float* d_workspace,
                                         cudaStream_t stream) {
  using namespace ss_launch;
  clear_stale_launch_error();
  const SelectiveScanShape& s = params.fwd.shape;
  if (plan.chunks > 1) {
    const LaunchResult r = aggregate_and_carry<Elem, true>(params, plan, d_workspace, stream);
    if (!r.ok()) return r;
  }
  const auto smem = static_cast<std::size_t>(
      selective_scan_backward_tile_bytes(plan.slices, params.fwd.d_z && params.d_grad_z) +
      selective_scan_checkpoint_bytes(plan.slices, plan.chunk_steps));
  static std::atomic<uint64_t> shared_allowed{0};
  if (const cudaError_t e = allow_dynamic_shared_once(selective_scan_backward_kernel<Elem>,
                                                      kSsMaxSharedBytes, shared_allowed);
      e != cudaSuccess)
    return {e, "cudaFuncSetAttribute (selective_scan_backward_kernel shared memory)"};
  selective_scan_backward_kernel<Elem>
      <<<dim3(scan_grid_x(s, plan), plan.chunks), scan_block(plan), smem, stream>>>(params, plan,
                                                                                    d_workspace);
  EXPHIL_RETURN_IF_LAUNCH_FAILED("selective_scan_backward_kernel");
  if (plan.state_groups > 1) {
    const int64_t blocks_per_row = (s.channels + kSsFinalizeThreads - 1) / kSsFinalizeThreads;
    selective_scan_backward_finalize_kernel<Elem>
        <<<dim3(static_cast<unsigned>(s.batch * blocks_per_row), plan.chunks), kSsFinalizeThreads,
           0, stream>>>(params, plan, d_workspace);
    EXPHIL_RETURN_IF_LAUNCH_FAILED("selective_scan_backward_finalize_kernel");
  }
  selective_scan_reduce_kernel<Elem>
      <<<flat_blocks(2 * s.batch * s.steps * s.states + s.channels * (s.states + 2)), kFlatThreads,
         0, stream>>>(params, plan, d_workspace);
  EXPHIL_RETURN_IF_LAUNCH_FAILED("selective_scan_reduce_kernel");
  return {};
}

}  // namespace exphil::kernels
