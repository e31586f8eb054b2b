// exphil::selective_scan_forward / selective_scan_backward: validate, place,
// plan, launch; can_implement: validate.
#include <string>

#include "api_guard.hpp"
#include "cuda_status.hpp"
#include "exphil/selective_scan.hpp"
#include "format.hpp"
#include "launch_context.hpp"
#include "selective_scan/selective_scan_config.h"
#include "selective_scan/selective_scan_launch.h"
#include "selective_scan_validate.hpp"

namespace exphil {

namespace {

using kernels::SelectiveScanDirection;

// Everything after validation, shared by both directions. `launch` enqueues
// the kernels: (const SelectiveScanPlan&, float* d_workspace, cudaStream_t)
// -> LaunchResult.
template <class Launch>
Status run(SelectiveScanDirection direction, const runtime::SelectiveScanCall& call,
           Stream requested_stream, const SelectiveScanLaunchOptions* options, Launch&& launch) {
  runtime::LaunchContext context;
  EXPHIL_RETURN_IF_ERROR(context.prepare(call.tensors, requested_stream));

  const kernels::SelectiveScanPlan plan =
      kernels::plan_selective_scan(direction, call.shape, context.sm_count(),
                                   options ? options->chunk_steps : 0, call.mean_input_scale);
  if (const char* why = kernels::selective_scan_unsupported(plan, call.shape)) {
    const int64_t dims[4] = {call.shape.batch, call.shape.steps, call.shape.channels,
                             call.shape.states};
    return {StatusCode::not_supported,
            "[B, T, D, N] = " + runtime::shape_string(dims, 4) + " cannot run: " + why};
  }

  EXPHIL_RETURN_IF_ERROR(context.run_with_workspace(
      kernels::selective_scan_workspace_bytes(plan), "selective scan workspace",
      [&](float* d_workspace, cudaStream_t stream) { return launch(plan, d_workspace, stream); }));

  if (options && options->chosen) {
    SelectiveScanLaunchInfo& info = *options->chosen;
    info.channels_per_block = kernels::kSsChannelsPerBlock;
    info.state_slices = plan.slices * plan.state_groups;
    info.chunks = plan.chunks;
    info.chunk_steps = plan.chunk_steps;
    info.kernels = kernels::selective_scan_kernel_count(direction, plan);
  }
  return {};
}

// Validates into Params, then runs with `launch_kernels`, prefixing any
// message with `context`.
template <class Params, class Args, class Validate, class LaunchKernels>
Status validated_call(const char* where, const char* context, SelectiveScanDirection direction,
                      const Args& args, Stream stream, const SelectiveScanLaunchOptions* options,
                      Validate&& validate, LaunchKernels&& launch_kernels) noexcept {
  return runtime::guarded(where, [&]() -> Status {
    Params params;
    runtime::SelectiveScanCall call;
    Status s = validate(args, params, call);
    if (s.ok())
      s = run(direction, call, stream, options,
              [&](const kernels::SelectiveScanPlan& plan, float* d_workspace, cudaStream_t st) {
                return launch_kernels(params, plan, d_workspace, st);
              });
    return runtime::with_context(context, std::move(s));
  });
}

}  // namespace

Status selective_scan_forward(const SelectiveScanForwardArgs& args, Stream stream,
                              const SelectiveScanLaunchOptions* options) noexcept {
  return validated_call<kernels::SelectiveScanForwardParams>(
      "selective_scan_forward", "selective_scan forward", SelectiveScanDirection::forward, args,
      stream, options, runtime::validate_selective_scan_forward,
      kernels::launch_selective_scan_forward);
}

Status selective_scan_backward(const SelectiveScanBackwardArgs& args, Stream stream,
                               const SelectiveScanLaunchOptions* options) noexcept {
  return validated_call<kernels::SelectiveScanBackwardParams>(
      "selective_scan_backward", "selective_scan backward", SelectiveScanDirection::backward, args,
      stream, options, runtime::validate_selective_scan_backward,
      kernels::launch_selective_scan_backward);
}

Status can_implement(const SelectiveScanForwardArgs& args) noexcept {
  return runtime::validate_only<kernels::SelectiveScanForwardParams, runtime::SelectiveScanCall>(
      "selective_scan forward", args, runtime::validate_selective_scan_forward);
}

Status can_implement(const SelectiveScanBackwardArgs& args) noexcept {
  return runtime::validate_only<kernels::SelectiveScanBackwardParams, runtime::SelectiveScanCall>(
      "selective_scan backward", args, runtime::validate_selective_scan_backward);
}

}  // namespace exphil
