// exphil::gated_rnn_forward / _backward, the stack's gated_rnn_stack_forward
// / _backward, and their can_implement: op directions of the one pipeline
// (op_pipeline.hpp).
#include <string>
#include <type_traits>

#include "exphil/gated_rnn.hpp"
#include "gated_rnn/gated_rnn_launch.h"
#include "gated_rnn_validate.hpp"
#include "op_pipeline.hpp"
#include "runtime/format.hpp"

namespace exphil {

namespace {

using kernels::GatedRnnDirection;

// What a plan says of the layout (GatedRnnLaunchInfo), but for kernels,
// which each op direction counts its own way.
void report_layout(const kernels::GatedRnnPlan& p, GatedRnnLaunchInfo& info) {
  info = GatedRnnLaunchInfo{};
  info.units_per_block = p.units_per_block;
  info.blocks = p.blocks;
  info.batch_blocks = p.batch_blocks;
  info.batch_tile = p.batch_tile;
  info.resident_weights = p.resident_weights;
  info.unit_warps = p.unit_warps;
  info.k_split = p.k_split;
  info.tensor_cores = p.tensor_cores || p.gemm_tensor_cores;
  info.walk_tensor_cores = p.walk_tensor_cores;
  info.pair_exchange = p.pair_exchange;
}

// The API's launch options as the planner takes them (defaults without),
// with the call's precision.
kernels::GatedRnnLaunchOptions kernel_options(const GatedRnnLaunchOptions* options,
                                              GatedRnnPrecision precision) {
  kernels::GatedRnnLaunchOptions o;
  o.f32_tensor_cores = precision == GatedRnnPrecision::tf32 ? 1 : 0;
  if (options) {
    o.units_per_block = options->units_per_block;
    o.batch_blocks = options->batch_blocks;
    o.batch_tile = options->batch_tile;
    o.streamed_weights = options->streamed_weights;
    o.unit_warps = options->unit_warps;
    o.k_split = options->k_split;
    o.tensor_cores = options->tensor_cores;
    o.walk_tensor_cores = options->walk_tensor_cores;
    o.pair_exchange = options->pair_exchange;
    o.stack_wavefront = options->stack_wavefront;
  }
  return o;
}

// The device's numbers as the launch context read them once.
kernels::GatedRnnDevice planner_device(const runtime::LaunchContext& context) {
  const runtime::DeviceArchitecture& a = context.architecture();
  return {a.sm_count, a.max_shared_per_block, a.max_shared_per_sm};
}

// A plan the kernels cannot run, with the call's shape and `what` more
// (the stack's layers) in the message.
Status refused(const runtime::GatedRnnCall& call, const std::string& what, const char* why) {
  const int64_t dims[3] = {call.shape.batch, call.shape.steps, call.shape.hidden};
  return {StatusCode::not_supported, "[B, T, H] = " + runtime::shape_string(dims, 3) + what + " cannot run: " + why};
}

// What every gated-RNN op direction shares: its call, options, plan and
// workspace.
struct GatedRnnOpBase {
  using Call = runtime::GatedRnnCall;
  using LaunchOptions = GatedRnnLaunchOptions;
  // The kernels' plan, with the device numbers it was made for.
  using Plan = kernels::GatedRnnPlan;
  static constexpr const char* kWorkspace = "gated RNN workspace";

  template <class Params>
  static std::size_t workspace_bytes(const Plan& p, const Call&, const Params&) {
    return kernels::gated_rnn_workspace_bytes(p);
  }
};

template <GatedRnnDirection Direction>
struct GatedRnnOpDirection : GatedRnnOpBase {
  static constexpr bool kForward = Direction == GatedRnnDirection::forward;
  using Args = std::conditional_t<kForward, GatedRnnForwardArgs, GatedRnnBackwardArgs>;
  using Params =
      std::conditional_t<kForward, kernels::GatedRnnForwardParams, kernels::GatedRnnBackwardParams>;
  static constexpr const char* kWhere = kForward ? "gated_rnn_forward" : "gated_rnn_backward";

  static std::string context(const Args& args) {
    return std::string(gated_rnn_cell_name(args.cell)) + (kForward ? " forward" : " backward");
  }

  static Status validate(const Args& args, Params& params, Call& call) {
    if constexpr (kForward)
      return runtime::validate_gated_rnn_forward(args, params, call);
    else
      return runtime::validate_gated_rnn_backward(args, params, call);
  }

  // The forward's params (the backward's carry them as .fwd).
  static const kernels::GatedRnnForwardParams& forward_params(const Params& params) {
    if constexpr (kForward)
      return params;
    else
      return params.fwd;
  }

  static Plan plan(const Args& args, const Call& call, const Params& params,
                   const runtime::LaunchContext& context,
                   const LaunchOptions* options) {
    const kernels::GatedRnnForwardParams& f = forward_params(params);
    return kernels::plan_gated_rnn(Direction, static_cast<kernels::GatedRnnCell>(args.cell), call.shape,
                                   planner_device(context), kernel_options(options, args.options.precision),
                                   {f.dtype, f.weight_dtype});
  }

  static Status check_plan(const Plan& p, const Call& call, const Params& params) {
    const kernels::GatedRnnCell cell = forward_params(params).cell;
    if (const char* why = kernels::gated_rnn_unsupported(p, cell, call.shape, p.device))
      return refused(call, "", why);
    return {};
  }

  static kernels::LaunchResult launch(const Args&, Params& params, const Plan& p, float* d_workspace,
                                      cudaStream_t stream) {
    if constexpr (kForward)
      return kernels::launch_gated_rnn_forward(params, p, d_workspace, stream);
    else
      return kernels::launch_gated_rnn_backward(params, p, d_workspace, stream);
  }

  static void report(const Plan& p, const Params& params, const LaunchOptions* options) {
    if (!options || !options->chosen) return;
    GatedRnnLaunchInfo& info = *options->chosen;
    report_layout(p, info);
    if constexpr (kForward)
      info.kernels = kernels::gated_rnn_kernel_count(Direction, kernels::GatedRnnBackwardParams{}, p);
    else
      info.kernels = kernels::gated_rnn_kernel_count(Direction, params, p);
  }
};

using GatedRnnForwardOp = GatedRnnOpDirection<GatedRnnDirection::forward>;
using GatedRnnBackwardOp = GatedRnnOpDirection<GatedRnnDirection::backward>;

// The stack's op directions: the forward (one launch up to B = 4 where a
// wavefront fits, else the layers one after another:
// kernels::plan_gated_rnn_stack) and the backward (the layers' backwards
// from the top down: kernels::plan_gated_rnn_stack_backward).
template <GatedRnnDirection Direction>
struct GatedRnnStackOpDirection : GatedRnnOpBase {
  static constexpr bool kForward = Direction == GatedRnnDirection::forward;
  using Args = std::conditional_t<kForward, GatedRnnStackForwardArgs, GatedRnnStackBackwardArgs>;
  using Params =
      std::conditional_t<kForward, kernels::GatedRnnStackParams, kernels::GatedRnnStackBackwardParams>;
  static constexpr const char* kWhere = kForward ? "gated_rnn_stack_forward" : "gated_rnn_stack_backward";

  static std::string context(const Args& args) {
    return std::string(gated_rnn_cell_name(args.cell)) + (kForward ? "_stack forward" : "_stack backward");
  }

  static Status validate(const Args& args, Params& params, Call& call) {
    if constexpr (kForward)
      return runtime::validate_gated_rnn_stack_forward(args, params, call);
    else
      return runtime::validate_gated_rnn_stack_backward(args, params, call);
  }

  // Layer 0's forward params (every layer's cell and dtypes).
  static const kernels::GatedRnnForwardParams& first_layer(const Params& params) {
    if constexpr (kForward)
      return params.layer[0];
    else
      return params.layer[0].fwd;
  }

  static Plan plan(const Args& args, const Call& call, const Params& params,
                   const runtime::LaunchContext& context, const LaunchOptions* options) {
    const kernels::GatedRnnDevice device = planner_device(context);
    const kernels::GatedRnnForwardParams& f = first_layer(params);
    const auto cell = static_cast<kernels::GatedRnnCell>(args.cell);
    const kernels::GatedRnnDTypes dtypes{f.dtype, f.weight_dtype};
    if constexpr (kForward)
      return kernels::plan_gated_rnn_stack(cell, call.shape, params.layers, device,
                                           kernel_options(options, args.options.precision), dtypes);
    else
      return kernels::plan_gated_rnn_stack_backward(cell, call.shape, params.layers, device,
                                                    kernel_options(options, args.options.precision), dtypes);
  }

  static Status check_plan(const Plan& p, const Call& call, const Params& params) {
    if (const char* why = kernels::gated_rnn_stack_unsupported(p, first_layer(params).cell, call.shape,
                                                               params.layers, p.device))
      return refused(call, " with " + std::to_string(params.layers) + " layers", why);
    return {};
  }

  static kernels::LaunchResult launch(const Args&, Params& params, const Plan& p, float* d_workspace,
                                      cudaStream_t stream) {
    if constexpr (kForward)
      return kernels::launch_gated_rnn_stack_forward(params, p, d_workspace, stream);
    else
      return kernels::launch_gated_rnn_stack_backward(params, p, d_workspace, stream);
  }

  static void report(const Plan& p, const Params& params, const LaunchOptions* options) {
    if (!options || !options->chosen) return;
    GatedRnnLaunchInfo& info = *options->chosen;
    report_layout(p, info);
    info.stacked = p.stack_depth > 0;
    if constexpr (kForward)
      // Layer by layer: each layer's forward, and a product before each
      // layer above the first.
      info.kernels = info.stacked ? 1 : 2 * params.layers - 1;
    else
      info.kernels = kernels::gated_rnn_stack_backward_kernel_count(params, p);
  }
};

using GatedRnnStackForwardOp = GatedRnnStackOpDirection<GatedRnnDirection::forward>;
using GatedRnnStackBackwardOp = GatedRnnStackOpDirection<GatedRnnDirection::backward>;

}  // namespace

const char* gated_rnn_cell_name(GatedRnnCell cell) noexcept {
  switch (cell) {
    case GatedRnnCell::gru: return "gru";
    case GatedRnnCell::lstm: return "lstm";
    case GatedRnnCell::slstm: return "slstm";
  }
  return "unknown_gated_rnn_cell";
}

Status gated_rnn_forward(const GatedRnnForwardArgs& args, Stream stream,
                         const GatedRnnLaunchOptions* options) noexcept {
  return runtime::run_op<GatedRnnForwardOp>(args, stream, options);
}

Status gated_rnn_backward(const GatedRnnBackwardArgs& args, Stream stream,
                          const GatedRnnLaunchOptions* options) noexcept {
  return runtime::run_op<GatedRnnBackwardOp>(args, stream, options);
}

Status gated_rnn_stack_forward(const GatedRnnStackForwardArgs& args, Stream stream,
                               const GatedRnnLaunchOptions* options) noexcept {
  return runtime::run_op<GatedRnnStackForwardOp>(args, stream, options);
}

Status gated_rnn_stack_backward(const GatedRnnStackBackwardArgs& args, Stream stream,
                                const GatedRnnLaunchOptions* options) noexcept {
  return runtime::run_op<GatedRnnStackBackwardOp>(args, stream, options);
}

Status can_implement(const GatedRnnStackBackwardArgs& args) noexcept {
  return runtime::check_op<GatedRnnStackBackwardOp>(args);
}

Status can_implement(const GatedRnnStackForwardArgs& args) noexcept {
  return runtime::check_op<GatedRnnStackForwardOp>(args);
}

Status can_implement(const GatedRnnForwardArgs& args) noexcept {
  return runtime::check_op<GatedRnnForwardOp>(args);
}

Status can_implement(const GatedRnnBackwardArgs& args) noexcept {
  return runtime::check_op<GatedRnnBackwardOp>(args);
}

}  // namespace exphil
