// exphil::attention_forward / attention_backward: validate, place, plan,
// launch.
#include <string>

#include "api_guard.hpp"
#include "attention/attention_config.h"
#include "attention/attention_launch.h"
#include "attention_validate.hpp"
#include "cuda_status.hpp"
#include "exphil/attention.hpp"
#include "format.hpp"
#include "launch_context.hpp"

namespace exphil {

namespace {

using kernels::AttentionDirection;

// Everything after validation, shared by both directions (`backward`:
// nullptr for the forward). `launch` enqueues the kernels:
// (const AttentionPlan&, float* d_workspace, cudaStream_t) -> LaunchResult.
template <class Launch>
Status run(AttentionDirection direction, const runtime::AttentionCall& call,
           const kernels::AttentionProblem& problem, Stream requested_stream,
           const AttentionLaunchOptions* options,
           const kernels::AttentionBackwardParams* backward, Launch&& launch) {
  runtime::LaunchContext context;
  EXPHIL_RETURN_IF_ERROR(context.prepare(call.tensors, requested_stream));

  const bool wgmma = !(options && options->sm80_kernels) &&
                     kernels::attention_wgmma_available(context.compute_capability());
  const kernels::AttentionPlan plan =
      kernels::plan_attention(direction, call.shape, problem.dtype, problem.mask,
                              context.sm_count(), options ? options->warps_per_block : 0, wgmma,
                              problem.precision);
  if (const char* why =
          kernels::attention_unsupported(direction, plan, call.shape, problem.dtype)) {
    const auto& s = call.shape;
    const int64_t dims[6] = {s.batch, s.q_heads, s.kv_heads, s.q_len, s.kv_len, s.head_dim};
    return {StatusCode::not_supported,
            "[B, Hq, Hkv, T, S, d] = " + runtime::shape_string(dims, 6) + " cannot run: " + why};
  }

  const int kernel_count = backward ? kernels::attention_backward_kernel_count(*backward) : 1;
  const std::size_t workspace_bytes =
      backward ? kernels::attention_backward_workspace_bytes(*backward, plan) : 0;
  EXPHIL_RETURN_IF_ERROR(context.run_with_workspace(
      workspace_bytes, "attention workspace",
      [&](float* d_workspace, cudaStream_t stream) { return launch(plan, d_workspace, stream); }));

  if (options && options->chosen) {
    AttentionLaunchInfo& info = *options->chosen;
    const bool fwd = direction == AttentionDirection::forward;
    info.query_rows_per_block =
        kernels::kAttnRowsPerWarp * (fwd ? plan.forward_warps : plan.dq_warps);
    info.key_rows_per_block = fwd ? 0 : kernels::kAttnRowsPerWarp * plan.dkdv_warps;
    info.key_tile = plan.key_tile;
    info.kernels = kernel_count;
    info.queries_heaviest_first = fwd ? plan.forward_heaviest_first : plan.dq_heaviest_first;
    info.keys_heaviest_first = !fwd && plan.dkdv_heaviest_first;
    info.warpgroup_forward = fwd && plan.forward_wgmma;
    info.warpgroup_dkdv = !fwd && plan.dkdv_wgmma && (backward->d_grad_k || backward->d_grad_v);
    info.warpgroup_dq = !fwd && plan.dq_wgmma && backward->d_grad_q;
    info.fused_backward = !fwd && kernels::attention_backward_runs_fused(*backward, plan);
  }
  return {};
}

}  // namespace

Status attention_forward(const AttentionForwardArgs& args, Stream stream,
                         const AttentionLaunchOptions* options) noexcept {
  return runtime::guarded("attention_forward", [&]() -> Status {
    kernels::AttentionForwardParams params;
    runtime::AttentionCall call;
    Status s = runtime::validate_attention_forward(args, params, call);
    if (s.ok())
      s = run(AttentionDirection::forward, call, params.problem, stream, options, nullptr,
              [&](const kernels::AttentionPlan& plan, float*, cudaStream_t st) {
                return kernels::launch_attention_forward(params, plan, st);
              });
    return runtime::with_context("attention forward", std::move(s));
  });
}

Status attention_backward(const AttentionBackwardArgs& args, Stream stream,
                          const AttentionLaunchOptions* options) noexcept {
  return runtime::guarded("attention_backward", [&]() -> Status {
    kernels::AttentionBackwardParams params;
    runtime::AttentionCall call;
    Status s = runtime::validate_attention_backward(args, params, call);
    if (s.ok())
      s = run(AttentionDirection::backward, call, params.problem, stream, options, &params,
              [&](const kernels::AttentionPlan& plan, float* d_workspace, cudaStream_t st) {
                return kernels::launch_attention_backward(params, plan, d_workspace, st);
              });
    return runtime::with_context("attention backward", std::move(s));
  });
}

}  // namespace exphil
