// exphil::attention_forward / attention_backward and their can_implement:
// op directions of the one pipeline (op_pipeline.hpp).
#include <cstddef>
#include <string>
#include <type_traits>

#include "attention/attention_config.h"
#include "attention/attention_launch.h"
#include "attention_validate.hpp"
#include "exphil/attention.hpp"
#include "runtime/format.hpp"
#include "op_pipeline.hpp"

namespace exphil {

namespace {

using kernels::AttentionDirection;

// A backward call with recompute_lse: where its forward pass puts lse and o
// in the workspace, after the backward's own part.
struct RecomputedForward {
  std::size_t lse_offset = 0;  // bytes from the workspace's start
  std::size_t o_offset = 0;
  std::size_t end = 0;
};

constexpr std::size_t align_up(std::size_t n, std::size_t a) { return (n + a - 1) / a * a; }

RecomputedForward recomputed_forward_layout(std::size_t backward_bytes,
                                            const kernels::AttentionProblem& problem) {
  const auto& s = problem.shape;
  const std::size_t rows = static_cast<std::size_t>(s.batch) * s.q_heads * s.q_len;
  RecomputedForward r;
  r.lse_offset = align_up(backward_bytes, 256);
  r.o_offset = align_up(r.lse_offset + rows * sizeof(float), 256);
  r.end = r.o_offset + rows * s.head_dim * dtype_size(problem.dtype);
  return r;
}

// The plans of a call: its direction's, and for a backward with
// recompute_lse the forward's that runs first, writing o and lse into the
// workspace past the backward's part (the backward's params then read that
// lse).
struct AttentionPlans {
  kernels::AttentionPlan plan;
  bool recomputing = false;
  kernels::AttentionPlan forward_plan;
  RecomputedForward layout;
  std::size_t workspace_bytes = 0;
  int kernels = 1;
};

template <AttentionDirection Direction>
struct AttentionOpDirection {
  static constexpr bool kForward = Direction == AttentionDirection::forward;
  using Args = std::conditional_t<kForward, AttentionForwardArgs, AttentionBackwardArgs>;
  using Params =
      std::conditional_t<kForward, kernels::AttentionForwardParams, kernels::AttentionBackwardParams>;
  using Call = runtime::AttentionCall;
  using LaunchOptions = AttentionLaunchOptions;
  using Plan = AttentionPlans;
  static constexpr const char* kWhere = kForward ? "attention_forward" : "attention_backward";
  static constexpr const char* kWorkspace = "attention workspace";

  static std::string context(const Args&) {
    return kForward ? "attention forward" : "attention backward";
  }

  static Status validate(const Args& args, Params& params, Call& call) {
    if constexpr (kForward)
      return runtime::validate_attention_forward(args, params, call);
    else
      return runtime::validate_attention_backward(args, params, call);
  }

  static kernels::AttentionPlan plan_for(AttentionDirection d, const Call& call,
                                         const kernels::AttentionProblem& problem,
                                         const runtime::LaunchContext& context,
                                         const LaunchOptions* options) {
    const bool wgmma = !(options && options->sm80_kernels) &&
                       kernels::attention_wgmma_available(context.compute_capability());
    return kernels::plan_attention(d, call.shape, problem.dtype, problem.mask, context.sm_count(),
                                   options ? options->warps_per_block : 0, wgmma,
                                   problem.precision);
  }

  static Plan plan(const Args& args, const Call& call, const Params& params,
                   const runtime::LaunchContext& context, const LaunchOptions* options) {
    Plan p;
    p.plan = plan_for(Direction, call, params.problem, context, options);
    if constexpr (!kForward) {
      p.recomputing = args.recompute_lse;
      p.kernels = kernels::attention_backward_kernel_count(params);
      p.workspace_bytes = kernels::attention_backward_workspace_bytes(params, p.plan);
      if (p.recomputing) {
        p.forward_plan = plan_for(AttentionDirection::forward, call, params.problem, context, options);
        p.layout = recomputed_forward_layout(p.workspace_bytes, params.problem);
        p.workspace_bytes = p.layout.end;
        ++p.kernels;
      }
    }
    return p;
  }

  static Status check_plan(const Plan& p, const Call& call, const Params& params) {
    EXPHIL_RETURN_IF_ERROR(unsupported(Direction, p.plan, call, params.problem));
    if (p.recomputing)
      EXPHIL_RETURN_IF_ERROR(unsupported(AttentionDirection::forward, p.forward_plan, call, params.problem));
    return {};
  }

  static std::size_t workspace_bytes(const Plan& p, const Call&, const Params&) {
    return p.workspace_bytes;
  }

  static kernels::LaunchResult launch(const Args&, Params& params, const Plan& p,
                                      float* d_workspace, cudaStream_t stream) {
    if constexpr (kForward) {
      return kernels::launch_attention_forward(params, p.plan, stream);
    } else {
      if (p.recomputing) {
        char* base = reinterpret_cast<char*>(d_workspace);
        kernels::AttentionForwardParams forward;
        forward.problem = params.problem;
        forward.d_q = params.d_q;
        forward.d_k = params.d_k;
        forward.d_v = params.d_v;
        forward.d_o = base + p.layout.o_offset;
        forward.d_lse = reinterpret_cast<float*>(base + p.layout.lse_offset);
        const kernels::LaunchResult launched =
            kernels::launch_attention_forward(forward, p.forward_plan, stream);
        if (!launched.ok()) return launched;
        params.d_lse = forward.d_lse;
      }
      return kernels::launch_attention_backward(params, p.plan, d_workspace, stream);
    }
  }

  static void report(const Plan& p, const Params& params, const LaunchOptions* options) {
    if (!options || !options->chosen) return;
    AttentionLaunchInfo& info = *options->chosen;
    const kernels::AttentionPlan& plan = p.plan;
    info.query_rows_per_block =
        kernels::kAttnRowsPerWarp * (kForward ? plan.forward_warps : plan.dq_warps);
    info.key_rows_per_block = kForward ? 0 : kernels::kAttnRowsPerWarp * plan.dkdv_warps;
    info.key_tile = plan.key_tile;
    info.kernels = p.kernels;
    info.queries_heaviest_first = kForward ? plan.forward_heaviest_first : plan.dq_heaviest_first;
    if constexpr (kForward) {
      info.keys_heaviest_first = false;
      info.warpgroup_forward = plan.forward_wgmma;
      info.warpgroup_dkdv = false;
      info.warpgroup_dq = false;
      info.fused_backward = false;
    } else {
      info.keys_heaviest_first = plan.dkdv_heaviest_first;
      info.warpgroup_forward = false;
      info.warpgroup_dkdv = plan.dkdv_wgmma && (params.d_grad_k || params.d_grad_v);
      info.warpgroup_dq = plan.dq_wgmma && params.d_grad_q;
      info.fused_backward = kernels::attention_backward_runs_fused(params, plan);
    }
  }

 private:
  static Status unsupported(AttentionDirection d, const kernels::AttentionPlan& p,
                            const Call& call, const kernels::AttentionProblem& problem) {
    if (const char* why = kernels::attention_unsupported(d, p, call.shape, problem.dtype)) {
      const auto& s = call.shape;
      const int64_t dims[6] = {s.batch, s.q_heads, s.kv_heads, s.q_len, s.kv_len, s.head_dim};
      return {StatusCode::not_supported,
              "[B, Hq, Hkv, T, S, d] = " + runtime::shape_string(dims, 6) + " cannot run: " + why};
    }
    return {};
  }
};

using AttentionForwardOp = AttentionOpDirection<AttentionDirection::forward>;
using AttentionBackwardOp = AttentionOpDirection<AttentionDirection::backward>;

}  // namespace

Status attention_forward(const AttentionForwardArgs& args, Stream stream,
                         const AttentionLaunchOptions* options) noexcept {
  return runtime::run_op<AttentionForwardOp>(args, stream, options);
}

Status attention_backward(const AttentionBackwardArgs& args, Stream stream,
                          const AttentionLaunchOptions* options) noexcept {
  return runtime::run_op<AttentionBackwardOp>(args, stream, options);
}

Status can_implement(const AttentionForwardArgs& args) noexcept {
  return runtime::check_op<AttentionForwardOp>(args);
}

Status can_implement(const AttentionBackwardArgs& args) noexcept {
  return runtime::check_op<AttentionBackwardOp>(args);
}

}  // namespace exphil
