// Definitions of the launchers declared in attention_instances.h. Included
// only by the generated instance files.
#pragma once

#include <atomic>
#include <cstdint>

#include <cuda_runtime.h>

#include "attention/attention_backward.cuh"
#include "attention/attention_backward_fused.cuh"
#include "attention/attention_config.h"
#include "attention/attention_forward.cuh"
#include "attention/attention_launch.h"
#if EXPHIL_ATTENTION_WGMMA
#include "attention/attention_dkdv_wgmma.cuh"
#include "attention/attention_dq_wgmma.cuh"
#include "attention/attention_forward_wgmma.cuh"
#endif
#include "attention/attention_instances.h"
#include "common/dependent_launch.h"
#include "common/dynamic_shared_memory.h"

namespace exphil::kernels {
namespace attn_launch {

// What a failed launch reports (static strings: LaunchResult keeps them).
struct KernelCalls {
  const char* shared_memory;  // raising the kernel's shared-memory limit
  const char* launch;
  // asking whether the kernel can be a dependent (kDependent launches only)
  const char* attributes = "cudaFuncGetAttributes (attention kernel)";
};

// Launches kKernel over ceil(len / rows per block) x heads x batch blocks of
// `warps` warps, with `smem` bytes of dynamic shared memory (the kernel's
// limit raised on its first launch per device). kDependent: as a
// programmatic dependent of the kernel before it, where the device's code
// waits (dependent_launch.h), so that its launch overlaps that kernel's
// last blocks. Only for a kernel that follows one of the same call (dK/dV
// after dQ or rowsum, the fused kernel after rowsum), which allows
// dependents only as its blocks end: a dependent is placed as soon as the
// kernel before it allows, which a caller's kernel may do from its start,
// and placed that early (the rowsum kernel allowing from its start) a
// one-wave fused grid ran 16 to 27% slower on an H200 (bench/RESULTS.md).
template <auto kKernel, bool kDependent = false, class... Args>
LaunchResult launch_row_blocks(KernelCalls calls, std::size_t smem, int warps, int64_t len,
                               int64_t heads, int64_t batch, cudaStream_t stream,
                               const Args&... args) {
  static std::atomic<uint64_t> allowed{0};
  if (const cudaError_t e = allow_dynamic_shared_once(kKernel, kAttnMaxSharedBytes, allowed);
      e != cudaSuccess)
    return {e, calls.shared_memory};
  bool dependent = false;
  if constexpr (kDependent) {
    static DependentLaunch dependent_launch;
    if (const cudaError_t e = dependent_launch.supported(kKernel, dependent); e != cudaSuccess)
      return {e, calls.attributes};
  }
  const dim3 grid(static_cast<unsigned>(attention_row_blocks(len, warps)),
                  static_cast<unsigned>(heads), static_cast<unsigned>(batch));
  if (const cudaError_t e =
          launch_kernel(kKernel, grid, dim3(32 * warps), smem, dependent, stream, args...);
      e != cudaSuccess)
    return {e, calls.launch};
  return {};
}

// The key tile of Elem's calls at head width kD past the short calls, and
// whether they add the short one (attention_key_tile()): f16/bf16 and
// tf32x3 up to d = 64 do, exact f32 has only its 32-key tile.
template <class Elem, int kD>
constexpr int kKeyTile = attention_key_tile(attention_storage<Elem>, kD);
template <class Elem, int kD>
constexpr bool kHasShortTile = kKeyTile<Elem, kD> > kAttnShortKeys;

template <class Elem, int kD, int kKT>
LaunchResult forward(const AttentionForwardParams& params, const AttentionPlan& plan,
                     cudaStream_t stream) {
  const AttentionShape& s = params.problem.shape;
  return launch_row_blocks<attention_forward_kernel<Elem, kD, kKT>>(
      {"cudaFuncSetAttribute (attention_forward_kernel shared memory)",
       "launch of attention_forward_kernel"},
      attention_forward_shared_bytes(attention_storage<Elem>, kD, plan.forward_warps, kKT),
      plan.forward_warps, s.q_len, s.q_heads, s.batch, stream, params,
      plan.forward_heaviest_first);
}

#if EXPHIL_ATTENTION_WGMMA
template <class Elem, int kD>
LaunchResult forward_wgmma(const AttentionForwardParams& params, const AttentionPlan& plan,
                           cudaStream_t stream) {
  const AttentionShape& s = params.problem.shape;
  return launch_row_blocks<attention_forward_wgmma_kernel<Elem, kD>>(
      {"cudaFuncSetAttribute (attention_forward_wgmma_kernel shared memory)",
       "launch of attention_forward_wgmma_kernel"},
      attention_forward_wgmma_shared_bytes(sizeof(Elem), kD), kAttnWgmmaThreads / 32, s.q_len,
      s.q_heads, s.batch, stream, params, plan.forward_heaviest_first);
}
#endif

template <class Elem, int kD, int kKT>
LaunchResult dq_with_tile(const AttentionBackwardParams& params, const AttentionPlan& plan,
                          float* d_rowdot_out, cudaStream_t stream) {
  const AttentionShape& s = params.problem.shape;
  return launch_row_blocks<attention_dq_kernel<Elem, kD, kKT>>(
      {"cudaFuncSetAttribute (attention_dq_kernel shared memory)", "launch of attention_dq_kernel"},
      attention_dq_shared_bytes(attention_storage<Elem>, kD, plan.dq_warps, kKT), plan.dq_warps,
      s.q_len, s.q_heads, s.batch, stream, params, d_rowdot_out, plan.dq_heaviest_first);
}

// d_rowdot_out: where the dQ kernel leaves rowsum(dO * O) for the dK/dV
// kernel, or nullptr when none follows.
template <class Elem, int kD>
LaunchResult dq(const AttentionBackwardParams& params, const AttentionPlan& plan,
                float* d_rowdot_out, cudaStream_t stream) {
#if EXPHIL_ATTENTION_WGMMA
  if constexpr (sizeof(Elem) == 2 && attention_dq_wgmma_head_dim(kD)) {
    if (plan.dq_wgmma) {
      const AttentionShape& s = params.problem.shape;
      return launch_row_blocks<attention_dq_wgmma_kernel<Elem, kD>>(
          {"cudaFuncSetAttribute (attention_dq_wgmma_kernel shared memory)",
           "launch of attention_dq_wgmma_kernel"},
          attention_dq_wgmma_shared_bytes(sizeof(Elem), kD), kAttnWgmmaThreads / 32, s.q_len,
          s.q_heads, s.batch, stream, params, d_rowdot_out, plan.dq_heaviest_first);
    }
  }
#endif
  if constexpr (kHasShortTile<Elem, kD>) {
    if (plan.key_tile == kAttnShortKeys)
      return dq_with_tile<Elem, kD, kAttnShortKeys>(params, plan, d_rowdot_out, stream);
  }
  return dq_with_tile<Elem, kD, kKeyTile<Elem, kD>>(params, plan, d_rowdot_out, stream);
}

// d_counters: the fused kernel's counters, zeroed here (null: none).
template <class Elem, int kD>
LaunchResult rowdot(const AttentionBackwardParams& params, float* d_rowdot, uint32_t* d_counters,
                    int64_t counters, cudaStream_t stream) {
  const AttentionShape& s = params.problem.shape;
  constexpr int64_t kRowsPerBlock =
      int64_t{kAttnRowdotThreads} * kAttnRowdotPasses / attn::rowdot_threads<Elem, kD>();
  const dim3 grid(static_cast<unsigned>((s.q_len + kRowsPerBlock - 1) / kRowsPerBlock),
                  static_cast<unsigned>(s.q_heads), static_cast<unsigned>(s.batch));
  attention_rowdot_kernel<Elem, kD>
      <<<grid, kAttnRowdotThreads, 0, stream>>>(params, d_rowdot, d_counters, counters);
  EXPHIL_RETURN_IF_LAUNCH_FAILED("attention_rowdot_kernel");
  return {};
}

// Whether Elem at head width kD has the fused backward.
template <class Elem, int kD>
constexpr bool kHasFusedBackward = sizeof(Elem) == 4 && attention_fused_backward_head_dim(kD);

// The rowsum kernel, which also zeroes the counters, then, as its
// dependent, the fused kernel over the key blocks
// (attention_backward_fused.cuh). d_workspace: the rows' sums, then the
// counters.
template <class Elem, int kD>
LaunchResult fused_backward(const AttentionBackwardParams& params, float* d_workspace,
                            cudaStream_t stream) {
  const AttentionShape& s = params.problem.shape;
  float* d_rowdot = d_workspace;
  uint32_t* d_sync = reinterpret_cast<uint32_t*>(d_workspace + s.batch * s.q_heads * s.q_len);
  if (const LaunchResult r =
          rowdot<Elem, kD>(params, d_rowdot, d_sync,
                           attention_fused_sync_words(s.batch, s.q_heads, s.q_len), stream);
      !r.ok())
    return r;
  return launch_row_blocks<attention_backward_fused_kernel<Elem, kD>, true>(
      {"cudaFuncSetAttribute (attention_backward_fused_kernel shared memory)",
       "launch of attention_backward_fused_kernel",
       "cudaFuncGetAttributes (attention_backward_fused_kernel)"},
      attention_fused_backward_shared_bytes(attention_storage<Elem>, kD), kAttnFusedWarps,
      s.kv_len, s.kv_heads, s.batch, stream, params, static_cast<const float*>(d_rowdot), d_sync);
}

}  // namespace attn_launch

template <class Elem, int kD>
LaunchResult run_attention_forward(const AttentionForwardParams& params, const AttentionPlan& plan,
                                   cudaStream_t stream) {
  using namespace attn_launch;
  clear_stale_launch_error();
#if EXPHIL_ATTENTION_WGMMA
  if constexpr (sizeof(Elem) == 2 && attention_wgmma_head_dim(kD)) {
    if (plan.forward_wgmma) return forward_wgmma<Elem, kD>(params, plan, stream);
  }
#endif
  if constexpr (kHasShortTile<Elem, kD>) {
    if (plan.key_tile == kAttnShortKeys) return forward<Elem, kD, kAttnShortKeys>(params, plan, stream);
  }
  return forward<Elem, kD, kKeyTile<Elem, kD>>(params, plan, stream);
}

template <class Elem, int kD>
LaunchResult run_attention_backward(const AttentionBackwardParams& params,
                                    const AttentionPlan& plan, float* d_workspace,
                                    cudaStream_t stream) {
  using namespace attn_launch;
  clear_stale_launch_error();
  const AttentionShape& s = params.problem.shape;
  const bool key_grads = params.d_grad_k != nullptr || params.d_grad_v != nullptr;
  if constexpr (kHasFusedBackward<Elem, kD>) {
    if (attention_backward_runs_fused(params, plan))
      return fused_backward<Elem, kD>(params, d_workspace, stream);
  }
  // rowsum(dO * O) reaches the dK/dV kernel through d_workspace, from the
  // dQ kernel, or from a kernel of its own when there is no dQ to compute.
  if (params.d_grad_q != nullptr) {
    const LaunchResult r =
        dq<Elem, kD>(params, plan, key_grads ? d_workspace : nullptr, stream);
    if (!r.ok()) return r;
  } else if (key_grads) {
    if (const LaunchResult r = rowdot<Elem, kD>(params, d_workspace, nullptr, 0, stream); !r.ok())
      return r;
  }
  if (!key_grads) return {};
#if EXPHIL_ATTENTION_WGMMA
  if constexpr (sizeof(Elem) == 2 && attention_dkdv_wgmma_head_dim(kD)) {
    if (plan.dkdv_wgmma)
      return launch_row_blocks<attention_dkdv_wgmma_kernel<Elem, kD>, true>(
          {"cudaFuncSetAttribute (attention_dkdv_wgmma_kernel shared memory)",
           "launch of attention_dkdv_wgmma_kernel",
           "cudaFuncGetAttributes (attention_dkdv_wgmma_kernel)"},
          attention_dkdv_wgmma_shared_bytes(sizeof(Elem), kD), kAttnWgmmaThreads / 32, s.kv_len,
          s.kv_heads, s.batch, stream, params, static_cast<const float*>(d_workspace),
          plan.dkdv_heaviest_first);
  }
#endif
  return launch_row_blocks<attention_dkdv_kernel<Elem, kD>, true>(
      {"cudaFuncSetAttribute (attention_dkdv_kernel shared memory)",
       "launch of attention_dkdv_kernel", "cudaFuncGetAttributes (attention_dkdv_kernel)"},
      attention_dkdv_shared_bytes(attention_storage<Elem>, kD, plan.dkdv_warps), plan.dkdv_warps,
      s.kv_len, s.kv_heads, s.batch, stream, params, static_cast<const float*>(d_workspace),
      plan.dkdv_heaviest_first);
}

}  // namespace exphil::kernels
