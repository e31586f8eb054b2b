// Definitions of the per-(op, dtype) launchers declared in scan_instances.h:
// pick the vector width (and, for the backward, where the states come
// from), then launch the aggregate pass (segments > 1) and
// the apply pass. Included only by the generated instance files.
#pragma once

#include <cuda_runtime.h>

#include "scan/scan_backward.cuh"
#include "scan/scan_config.h"
#include "scan/scan_forward.cuh"
#include "scan/scan_instances.h"

namespace exphil::kernels {

namespace detail {

// Chunk maps in two alternating buffers of `planes` planes (forward: a and
// b; backward: the product of a and the two maps' b), one float per thread
// and channel.
inline std::size_t scan_shared_bytes(const ScanPlan& plan, int vector_width, int planes) {
  return 2u * planes * static_cast<std::size_t>(plan.lanes) * plan.time_chunks * vector_width *
         sizeof(float);
}

template <class Op, class Elem, int V>
LaunchResult launch_forward(const ScanForwardParams& p, const ScanPlan& plan, float* d_workspace,
                            cudaStream_t stream) {
  clear_stale_launch_error();
  const dim3 block(plan.lanes, plan.time_chunks);
  const std::size_t smem = scan_shared_bytes(plan, V, 2);
  const auto grid_x = static_cast<unsigned>(p.shape.batch * plan.lane_groups);
  if (plan.segments > 1) {
    scan_forward_kernel<Op, Elem, V><<<dim3(grid_x, plan.segments - 1), block, smem, stream>>>(
        p, plan, ScanPass::aggregate, d_workspace);
    EXPHIL_RETURN_IF_LAUNCH_FAILED("scan_forward_kernel (aggregate pass)");
  }
  scan_forward_kernel<Op, Elem, V><<<dim3(grid_x, plan.segments), block, smem, stream>>>(
      p, plan, ScanPass::apply, d_workspace);
  EXPHIL_RETURN_IF_LAUNCH_FAILED("scan_forward_kernel");
  return {};
}

template <class Op, class Elem, int V, bool kStatesFromY>
LaunchResult launch_backward(const ScanBackwardParams& p, const ScanPlan& plan, float* d_workspace,
                             cudaStream_t stream) {
  clear_stale_launch_error();
  const dim3 block(plan.lanes, plan.time_chunks);
  const std::size_t smem = scan_shared_bytes(plan, V, 3);
  const auto grid_x = static_cast<unsigned>(p.shape.batch * plan.lane_groups);
  if (plan.segments > 1) {
    scan_backward_kernel<Op, Elem, V, kStatesFromY><<<dim3(grid_x, plan.segments - 1), block, smem, stream>>>(
        p, plan, ScanPass::aggregate, d_workspace);
    EXPHIL_RETURN_IF_LAUNCH_FAILED("scan_backward_kernel (aggregate pass)");
  }
  scan_backward_kernel<Op, Elem, V, kStatesFromY><<<dim3(grid_x, plan.segments), block, smem, stream>>>(
      p, plan, ScanPass::apply, d_workspace);
  EXPHIL_RETURN_IF_LAUNCH_FAILED("scan_backward_kernel");
  return {};
}

// The backward at the plan's vector width; kStatesFromY: see scan_backward.cuh.
template <class Op, class Elem, bool kStatesFromY>
LaunchResult launch_backward_at_width(const ScanBackwardParams& params, const ScanPlan& plan,
                                      float* d_workspace, cudaStream_t stream) {
  return plan.vector_width == kScanVectorWidth
             ? launch_backward<Op, Elem, kScanVectorWidth, kStatesFromY>(params, plan, d_workspace,
                                                                         stream)
             : launch_backward<Op, Elem, 1, kStatesFromY>(params, plan, d_workspace, stream);
}

}  // namespace detail

template <class Op, class Elem>
LaunchResult run_scan_forward(const ScanForwardParams& params, const ScanPlan& plan,
                              float* d_workspace, cudaStream_t stream) {
  return plan.vector_width == kScanVectorWidth
             ? detail::launch_forward<Op, Elem, kScanVectorWidth>(params, plan, d_workspace, stream)
             : detail::launch_forward<Op, Elem, 1>(params, plan, d_workspace, stream);
}

template <class Op, class Elem>
LaunchResult run_scan_backward(const ScanBackwardParams& params, const ScanPlan& plan,
                               float* d_workspace, cudaStream_t stream) {
  if (!params.states_from_y)
    return detail::launch_backward_at_width<Op, Elem, false>(params, plan, d_workspace, stream);
  // The states-from-y kernels exist only for the ops that allow them; the
  // host's validation refuses the rest before this point.
  if constexpr (kBackwardWithoutLastInput<Op>)
    return detail::launch_backward_at_width<Op, Elem, true>(params, plan, d_workspace, stream);
  else
    return {cudaErrorInvalidValue, "scan backward (states from y for an op that needs all inputs)"};
}

}  // namespace exphil::kernels
