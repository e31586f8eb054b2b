// exphil::scan_forward / scan_backward and their can_implement: the
// linear-recurrence scans as op directions of the one pipeline
// (op_pipeline.hpp).
#include <string>
#include <type_traits>

#include "exphil/scan.hpp"
#include "runtime/format.hpp"
#include "op_pipeline.hpp"
#include "scan/scan_launch.h"
#include "scan_validate.hpp"

namespace exphil {

namespace {

// What both directions share; `Direction` picks the args, params,
// validation and kernels.
template <kernels::ScanDirection Direction>
struct ScanOpDirection {
  static constexpr bool kForward = Direction == kernels::ScanDirection::forward;
  using Args = std::conditional_t<kForward, ScanForwardArgs, ScanBackwardArgs>;
  using Params = std::conditional_t<kForward, kernels::ScanForwardParams, kernels::ScanBackwardParams>;
  using Call = runtime::ScanCall;
  using LaunchOptions = ScanLaunchOptions;
  using Plan = kernels::ScanPlan;
  static constexpr const char* kWhere = kForward ? "scan_forward" : "scan_backward";
  static constexpr const char* kWorkspace = "scan workspace";

  static std::string context(const Args& args) {
    return std::string(scan_op_name(args.op)) + (kForward ? " forward" : " backward");
  }

  static Status validate(const Args& args, Params& params, Call& call) {
    if constexpr (kForward)
      return runtime::validate_scan_forward(args, params, call);
    else
      return runtime::validate_scan_backward(args, params, call);
  }

  static Plan plan(const Args&, const Call& call, const Params&,
                   const runtime::LaunchContext& context, const LaunchOptions* options) {
    const LaunchOptions defaults;
    return kernels::plan_scan(Direction, call.shape, call.vectorizable, context.sm_count(),
                              options ? *options : defaults);
  }

  static Status check_plan(const Plan& plan, const Call& call, const Params&) {
    if (const char* why = kernels::scan_plan_unsupported(plan, call.shape)) {
      const int64_t dims[3] = {call.shape.batch, call.shape.steps, call.shape.width};
      return {StatusCode::not_supported,
              "[B, T, H] = " + runtime::shape_string(dims, 3) + " cannot run: " + why};
    }
    return {};
  }

  static std::size_t workspace_bytes(const Plan& plan, const Call& call, const Params&) {
    return kernels::scan_workspace_bytes(plan, call.shape);
  }

  static kernels::LaunchResult launch(const Args& args, Params& params, const Plan& plan,
                                      float* d_workspace, cudaStream_t stream) {
    if constexpr (kForward)
      return kernels::launch_scan_forward(args.op, params, plan, d_workspace, stream);
    else
      return kernels::launch_scan_backward(args.op, params, plan, d_workspace, stream);
  }

  static void report(const Plan& plan, const Params&, const LaunchOptions* options) {
    if (!options || !options->chosen) return;
    ScanLaunchInfo& info = *options->chosen;
    info.vector_width = plan.vector_width;
    info.lanes = plan.lanes;
    info.time_chunks = plan.time_chunks;
    info.segments = plan.segments;
    info.kernels = kernels::scan_kernel_count(plan);
  }
};

using ScanForwardOp = ScanOpDirection<kernels::ScanDirection::forward>;
using ScanBackwardOp = ScanOpDirection<kernels::ScanDirection::backward>;

}  // namespace

Status scan_forward(const ScanForwardArgs& args, Stream stream,
                    const ScanLaunchOptions* options) noexcept {
  return runtime::run_op<ScanForwardOp>(args, stream, options);
}

Status scan_backward(const ScanBackwardArgs& args, Stream stream,
                     const ScanLaunchOptions* options) noexcept {
  return runtime::run_op<ScanBackwardOp>(args, stream, options);
}

Status can_implement(const ScanForwardArgs& args) noexcept {
  return runtime::check_op<ScanForwardOp>(args);
}

Status can_implement(const ScanBackwardArgs& args) noexcept {
  return runtime::check_op<ScanBackwardOp>(args);
}

}  // namespace exphil
