// Definitions of the launchers declared in attention_instances.h. Included
// only by the generated instance files.
#pragma once

#include <atomic>
#include <cstdint>

#include <cuda_runtime.h>

#include "attention/attention_backward.cuh"
#include "attention/attention_config.h"
#include "attention/attention_forward.cuh"
#include "attention/attention_instances.h"
#include "common/dynamic_shared_memory.h"

namespace exphil::kernels {
namespace attn_launch {

constexpr int kRowdotThreads = 256;
constexpr int64_t kMaxRowdotBlocks = 8192;

inline unsigned row_blocks(int64_t len, int warps) {
  const int64_t rows = int64_t{kAttnRowsPerWarp} * warps;
  return static_cast<unsigned>((len + rows - 1) / rows);
}

#define EXPHIL_ATTN_CHECK_LAUNCH(what)                                   \
  do {                                                                   \
    if (const cudaError_t e_ = cudaGetLastError(); e_ != cudaSuccess)    \
      return {e_, "launch of " what};                                    \
  } while (0)

#define EXPHIL_ATTN_ALLOW_SHARED(kernel, name)                                               \
  do {                                                                                       \
    static std::atomic<uint64_t> allowed_{0};                                                \
    if (const cudaError_t e_ = allow_dynamic_shared_once(kernel, kAttnMaxSharedBytes, allowed_); \
        e_ != cudaSuccess)                                                                   \
      return {e_, "cudaFuncSetAttribute (" name " shared memory)"};                         \
  } while (0)

template <class Elem, int kD, int kKT>
LaunchResult forward(const AttentionForwardParams& params, const AttentionPlan& plan,
                     cudaStream_t stream) {
  const AttentionShape& s = params.problem.shape;
  EXPHIL_ATTN_ALLOW_SHARED((attention_forward_kernel<Elem, kD, kKT>), "attention_forward_kernel");
  const auto smem = attention_forward_shared_bytes(sizeof(Elem), kD, plan.forward_warps, kKT);
  const dim3 grid(row_blocks(s.q_len, plan.forward_warps), static_cast<unsigned>(s.q_heads),
                  static_cast<unsigned>(s.batch));
  attention_forward_kernel<Elem, kD, kKT><<<grid, 32 * plan.forward_warps, smem, stream>>>(params);
  EXPHIL_ATTN_CHECK_LAUNCH("attention_forward_kernel");
  return {};
}

template <class Elem, int kD, int kKT>
LaunchResult dq(const AttentionBackwardParams& params, const AttentionPlan& plan, float* d_rowdot,
                cudaStream_t stream) {
  const AttentionShape& s = params.problem.shape;
  EXPHIL_ATTN_ALLOW_SHARED((attention_dq_kernel<Elem, kD, kKT>), "attention_dq_kernel");
  const auto smem = attention_dq_shared_bytes(sizeof(Elem), kD, plan.dq_warps, kKT);
  const dim3 grid(row_blocks(s.q_len, plan.dq_warps), static_cast<unsigned>(s.q_heads),
                  static_cast<unsigned>(s.batch));
  attention_dq_kernel<Elem, kD, kKT><<<grid, 32 * plan.dq_warps, smem, stream>>>(params, d_rowdot);
  EXPHIL_ATTN_CHECK_LAUNCH("attention_dq_kernel");
  return {};
}

// f32 has one key tile; f16/bf16 add the short one (attention_key_tile()).
template <class Elem>
constexpr bool kHasShortTile = attention_key_tile(sizeof(Elem)) != kAttnShortKeys;

}  // namespace attn_launch

template <class Elem, int kD>
LaunchResult run_attention_forward(const AttentionForwardParams& params, const AttentionPlan& plan,
                                   cudaStream_t stream) {
  using namespace attn_launch;
  clear_stale_launch_error();
  if constexpr (kHasShortTile<Elem>) {
    if (plan.key_tile == kAttnShortKeys) return forward<Elem, kD, kAttnShortKeys>(params, plan, stream);
  }
  return forward<Elem, kD, attention_key_tile(sizeof(Elem))>(params, plan, stream);
}

template <class Elem, int kD>
LaunchResult run_attention_backward(const AttentionBackwardParams& params,
                                    const AttentionPlan& plan, float* d_workspace,
                                    cudaStream_t stream) {
  using namespace attn_launch;
  clear_stale_launch_error();
  const AttentionShape& s = params.problem.shape;
  if (params.d_grad_q == nullptr && params.d_grad_k == nullptr && params.d_grad_v == nullptr)
    return {};
  const int64_t rows = s.batch * s.q_heads * s.q_len;
  const int64_t rows_per_block = kRowdotThreads / attn::rowdot_threads<Elem, kD>();
  const int64_t rowdot_blocks = (rows + rows_per_block - 1) / rows_per_block;
  attention_rowdot_kernel<Elem, kD>
      <<<static_cast<unsigned>(rowdot_blocks < kMaxRowdotBlocks ? rowdot_blocks : kMaxRowdotBlocks),
         kRowdotThreads, 0, stream>>>(params, d_workspace);
  EXPHIL_ATTN_CHECK_LAUNCH("attention_rowdot_kernel");

  if (params.d_grad_k != nullptr || params.d_grad_v != nullptr) {
    EXPHIL_ATTN_ALLOW_SHARED((attention_dkdv_kernel<Elem, kD>), "attention_dkdv_kernel");
    const auto smem = attention_dkdv_shared_bytes(sizeof(Elem), kD, plan.dkdv_warps);
    const dim3 grid(row_blocks(s.kv_len, plan.dkdv_warps), static_cast<unsigned>(s.kv_heads),
                    static_cast<unsigned>(s.batch));
    attention_dkdv_kernel<Elem, kD><<<grid, 32 * plan.dkdv_warps, smem, stream>>>(params,
                                                                                  d_workspace);
    EXPHIL_ATTN_CHECK_LAUNCH("attention_dkdv_kernel");
  }
  if (params.d_grad_q != nullptr) {
    if constexpr (kHasShortTile<Elem>) {
      if (plan.key_tile == kAttnShortKeys)
        return dq<Elem, kD, kAttnShortKeys>(params, plan, d_workspace, stream);
    }
    return dq<Elem, kD, attention_key_tile(sizeof(Elem))>(params, plan, d_workspace, stream);
  }
  return {};
}

#undef EXPHIL_ATTN_ALLOW_SHARED
#undef EXPHIL_ATTN_CHECK_LAUNCH

}  // namespace exphil::kernels
