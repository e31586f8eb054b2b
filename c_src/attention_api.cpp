// exphil::attention_forward / attention_backward: validate, place, plan,
// launch; can_implement: validate.
#include <cstddef>
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

// Everything after validation, shared by both directions (`backward`:
// nullptr for the forward). `launch` enqueues the kernels:
// (const AttentionPlan&, float* d_workspace, cudaStream_t) -> LaunchResult.
// With `recompute` (a backward without lse), the forward kernel runs first,
// writing o and lse into the workspace past the backward's part, and the
// backward's params then read that lse.
template <class Launch>
Status run(AttentionDirection direction, const runtime::AttentionCall& call,
           const kernels::AttentionProblem& problem, Stream requested_stream,
           const AttentionLaunchOptions* options,
           kernels::AttentionBackwardParams* backward, Launch&& launch, bool recompute = false) {
  runtime::LaunchContext context;
  EXPHIL_RETURN_IF_ERROR(context.prepare(call.tensors, requested_stream));

  const bool wgmma = !(options && options->sm80_kernels) &&
                     kernels::attention_wgmma_available(context.compute_capability());
  auto plan_for = [&](AttentionDirection d) {
    return kernels::plan_attention(d, call.shape, problem.dtype, problem.mask, context.sm_count(),
                                   options ? options->warps_per_block : 0, wgmma,
                                   problem.precision);
  };
  auto unsupported = [&](AttentionDirection d, const kernels::AttentionPlan& p) -> Status {
    if (const char* why = kernels::attention_unsupported(d, p, call.shape, problem.dtype)) {
      const auto& s = call.shape;
      const int64_t dims[6] = {s.batch, s.q_heads, s.kv_heads, s.q_len, s.kv_len, s.head_dim};
      return {StatusCode::not_supported,
              "[B, Hq, Hkv, T, S, d] = " + runtime::shape_string(dims, 6) + " cannot run: " + why};
    }
    return {};
  };
  const kernels::AttentionPlan plan = plan_for(direction);
  EXPHIL_RETURN_IF_ERROR(unsupported(direction, plan));
  const bool recomputing = recompute && backward != nullptr;
  kernels::AttentionPlan forward_plan;
  if (recomputing) {
    forward_plan = plan_for(AttentionDirection::forward);
    EXPHIL_RETURN_IF_ERROR(unsupported(AttentionDirection::forward, forward_plan));
  }

  int kernel_count = backward ? kernels::attention_backward_kernel_count(*backward) : 1;
  std::size_t workspace_bytes =
      backward ? kernels::attention_backward_workspace_bytes(*backward, plan) : 0;
  RecomputedForward layout;
  if (recomputing) {
    layout = recomputed_forward_layout(workspace_bytes, problem);
    workspace_bytes = layout.end;
    ++kernel_count;
  }
  EXPHIL_RETURN_IF_ERROR(context.run_with_workspace(
      workspace_bytes, "attention workspace",
      [&](float* d_workspace, cudaStream_t stream) -> kernels::LaunchResult {
        if (recomputing) {
          char* base = reinterpret_cast<char*>(d_workspace);
          kernels::AttentionForwardParams forward;
          forward.problem = problem;
          forward.d_q = backward->d_q;
          forward.d_k = backward->d_k;
          forward.d_v = backward->d_v;
          forward.d_o = base + layout.o_offset;
          forward.d_lse = reinterpret_cast<float*>(base + layout.lse_offset);
          const kernels::LaunchResult launched =
              kernels::launch_attention_forward(forward, forward_plan, stream);
          if (!launched.ok()) return launched;
          backward->d_lse = forward.d_lse;
        }
        return launch(plan, d_workspace, stream);
      }));

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
              },
              args.recompute_lse);
    return runtime::with_context("attention backward", std::move(s));
  });
}

Status can_implement(const AttentionForwardArgs& args) noexcept {
  return runtime::validate_only<kernels::AttentionForwardParams, runtime::AttentionCall>(
      "attention forward", args, runtime::validate_attention_forward);
}

Status can_implement(const AttentionBackwardArgs& args) noexcept {
  return runtime::validate_only<kernels::AttentionBackwardParams, runtime::AttentionCall>(
      "attention backward", args, runtime::validate_attention_backward);
}

}  // namespace exphil
