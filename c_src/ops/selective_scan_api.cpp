// exphil::selective_scan_forward / selective_scan_backward and their
// can_implement: op directions of the one pipeline (op_pipeline.hpp).
#include <string>
#include <type_traits>

#include "exphil/selective_scan.hpp"
#include "runtime/format.hpp"
#include "op_pipeline.hpp"
#include "selective_scan/selective_scan_config.h"
#include "selective_scan/selective_scan_launch.h"
#include "selective_scan_validate.hpp"

namespace exphil {

namespace {

using kernels::SelectiveScanDirection;

template <SelectiveScanDirection Direction>
struct SelectiveScanOpDirection {
  static constexpr bool kForward = Direction == SelectiveScanDirection::forward;
  using Args = std::conditional_t<kForward, SelectiveScanForwardArgs, SelectiveScanBackwardArgs>;
  using Params = std::conditional_t<kForward, kernels::SelectiveScanForwardParams,
                                    kernels::SelectiveScanBackwardParams>;
  using Call = runtime::SelectiveScanCall;
  using LaunchOptions = SelectiveScanLaunchOptions;
  using Plan = kernels::SelectiveScanPlan;
  static constexpr const char* kWhere =
      kForward ? "selective_scan_forward" : "selective_scan_backward";
  static constexpr const char* kWorkspace = "selective scan workspace";

  static std::string context(const Args&) {
    return kForward ? "selective_scan forward" : "selective_scan backward";
  }

  static Status validate(const Args& args, Params& params, Call& call) {
    if constexpr (kForward)
      return runtime::validate_selective_scan_forward(args, params, call);
    else
      return runtime::validate_selective_scan_backward(args, params, call);
  }

  static Plan plan(const Args&, const Call& call, const Params&,
                   const runtime::LaunchContext& context, const LaunchOptions* options) {
    return kernels::plan_selective_scan(Direction, call.shape, context.sm_count(),
                                        options ? options->chunk_steps : 0,
                                        call.mean_input_scale);
  }

  static Status check_plan(const Plan& plan, const Call& call, const Params&) {
    if (const char* why = kernels::selective_scan_unsupported(plan, call.shape)) {
      const int64_t dims[4] = {call.shape.batch, call.shape.steps, call.shape.channels,
                               call.shape.states};
      return {StatusCode::not_supported,
              "[B, T, D, N] = " + runtime::shape_string(dims, 4) + " cannot run: " + why};
    }
    return {};
  }

  static std::size_t workspace_bytes(const Plan& plan, const Call&, const Params&) {
    return kernels::selective_scan_workspace_bytes(plan);
  }

  static kernels::LaunchResult launch(const Args&, Params& params, const Plan& plan,
                                      float* d_workspace, cudaStream_t stream) {
    if constexpr (kForward)
      return kernels::launch_selective_scan_forward(params, plan, d_workspace, stream);
    else
      return kernels::launch_selective_scan_backward(params, plan, d_workspace, stream);
  }

  static void report(const Plan& plan, const Params&, const LaunchOptions* options) {
    if (!options || !options->chosen) return;
    SelectiveScanLaunchInfo& info = *options->chosen;
    info.channels_per_block = kernels::kSsChannelsPerBlock;
    info.state_slices = plan.slices * plan.state_groups;
    info.chunks = plan.chunks;
    info.chunk_steps = plan.chunk_steps;
    info.kernels = kernels::selective_scan_kernel_count(Direction, plan);
  }
};

using SelectiveScanForwardOp = SelectiveScanOpDirection<SelectiveScanDirection::forward>;
using SelectiveScanBackwardOp = SelectiveScanOpDirection<SelectiveScanDirection::backward>;

}  // namespace

Status selective_scan_forward(const SelectiveScanForwardArgs& args, Stream stream,
                              const SelectiveScanLaunchOptions* options) noexcept {
  return runtime::run_op<SelectiveScanForwardOp>(args, stream, options);
}

Status selective_scan_backward(const SelectiveScanBackwardArgs& args, Stream stream,
                               const SelectiveScanLaunchOptions* options) noexcept {
  return runtime::run_op<SelectiveScanBackwardOp>(args, stream, options);
}

Status can_implement(const SelectiveScanForwardArgs& args) noexcept {
  return runtime::check_op<SelectiveScanForwardOp>(args);
}

Status can_implement(const SelectiveScanBackwardArgs& args) noexcept {
  return runtime::check_op<SelectiveScanBackwardOp>(args);
}

}  // namespace exphil
