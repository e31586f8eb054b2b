// exphil::scan_forward / scan_backward: validate, place, plan, launch;
// can_implement: validate.
#include <string>

#include "api_guard.hpp"
#include "cuda_status.hpp"
#include "exphil/scan.hpp"
#include "format.hpp"
#include "launch_context.hpp"
#include "scan/scan_launch.h"
#include "scan_validate.hpp"

namespace exphil {

namespace {

using runtime::ScanCall;

// Everything after validation, shared by both directions. `launch` enqueues
// the kernels: (const ScanPlan&, float* d_workspace, cudaStream_t) -> LaunchResult.
template <class Launch>
Status run_scan(kernels::ScanDirection direction, const ScanCall& call, Stream requested_stream,
                const ScanLaunchOptions* options, Launch&& launch) {
  runtime::LaunchContext context;
  EXPHIL_RETURN_IF_ERROR(context.prepare(call.tensors, requested_stream));

  const ScanLaunchOptions defaults;
  const ScanLaunchOptions& opts = options ? *options : defaults;
  const kernels::ScanPlan plan =
      kernels::plan_scan(direction, call.shape, call.vectorizable, context.sm_count(), opts);
  if (const char* why = kernels::scan_plan_unsupported(plan, call.shape)) {
    const int64_t dims[3] = {call.shape.batch, call.shape.steps, call.shape.width};
    return {StatusCode::not_supported,
            "[B, T, H] = " + runtime::shape_string(dims, 3) + " cannot run: " + why};
  }

  EXPHIL_RETURN_IF_ERROR(context.run_with_workspace(
      kernels::scan_workspace_bytes(plan, call.shape), "scan workspace",
      [&](float* d_workspace, cudaStream_t stream) { return launch(plan, d_workspace, stream); }));

  if (opts.chosen) {
    opts.chosen->vector_width = plan.vector_width;
    opts.chosen->lanes = plan.lanes;
    opts.chosen->time_chunks = plan.time_chunks;
    opts.chosen->segments = plan.segments;
    opts.chosen->kernels = kernels::scan_kernel_count(plan);
  }
  return {};
}

// "<op> <direction>", the prefix of every message of a call.
std::string call_context(ScanOp op, kernels::ScanDirection direction) {
  return std::string(scan_op_name(op)) +
         (direction == kernels::ScanDirection::forward ? " forward" : " backward");
}

// Validates with `validate`, then runs with `launch_kernels`, prefixing any
// message with "<op> <direction>: ".
template <class Args, class Params, class Validate, class LaunchKernels>
Status validated_scan(const char* where, kernels::ScanDirection direction, const Args& args,
                      Stream stream, const ScanLaunchOptions* options, Validate&& validate,
                      LaunchKernels&& launch_kernels) noexcept {
  return runtime::guarded(where, [&]() -> Status {
    const std::string context = call_context(args.op, direction);
    Params params;
    ScanCall call;
    Status s = validate(args, params, call);
    if (s.ok())
      s = run_scan(direction, call, stream, options,
                   [&](const kernels::ScanPlan& plan, float* d_workspace, cudaStream_t st) {
                     return launch_kernels(args.op, params, plan, d_workspace, st);
                   });
    return runtime::with_context(context, std::move(s));
  });
}

}  // namespace

Status scan_forward(const ScanForwardArgs& args, Stream stream,
                    const ScanLaunchOptions* options) noexcept {
  return validated_scan<ScanForwardArgs, kernels::ScanForwardParams>(
      "scan_forward", kernels::ScanDirection::forward, args, stream, options,
      runtime::validate_scan_forward, kernels::launch_scan_forward);
}

Status scan_backward(const ScanBackwardArgs& args, Stream stream,
                     const ScanLaunchOptions* options) noexcept {
  return validated_scan<ScanBackwardArgs, kernels::ScanBackwardParams>(
      "scan_backward", kernels::ScanDirection::backward, args, stream, options,
      runtime::validate_scan_backward, kernels::launch_scan_backward);
}

Status can_implement(const ScanForwardArgs& args) noexcept {
  return runtime::validate_only<kernels::ScanForwardParams, ScanCall>(
      call_context(args.op, kernels::ScanDirection::forward), args, runtime::validate_scan_forward);
}

Status can_implement(const ScanBackwardArgs& args) noexcept {
  return runtime::validate_only<kernels::ScanBackwardParams, ScanCall>(
      call_context(args.op, kernels::ScanDirection::backward), args,
      runtime::validate_scan_backward);
}

}  // namespace exphil
