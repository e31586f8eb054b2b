// The attention planner: warps per block and block order for each kernel,
// and the backward's workspace.
//
// Every kernel gives a warp 16 rows. Four warps per block share each K/V
// (or Q/dO) tile over 64 rows, which is what long sequences and large
// batches want; when that leaves fewer blocks than SMs (B1 h8 T32 makes 8),
// the planner halves the block until the grid covers the GPU, down to one
// warp per block, trading shared tile loads for parallelism. Blocks also
// shrink until their shared memory fits kAttnMaxSharedBytes. A masked
// call's kernel whose grid then has more blocks than SMs takes its blocks
// heaviest first (block_coord() in attention_common.cuh): with uneven
// blocks queued behind each other, the order decides the tail. On Hopper
// (`wgmma`), f16/bf16 kernels planned with four-warp blocks run as the
// warpgroup kernels, whose block is one warpgroup of the same 64 rows.
#include <cstdint>

#include "attention/attention_config.h"
#include "attention/attention_launch.h"

namespace exphil::kernels {

namespace {

using SharedBytes = std::size_t (*)(AttentionStorage, int, int);

// row_groups: the (batch, head) pairs, each with `len` rows to cover.
int choose_warps(int64_t row_groups, int64_t len, int sm_count, AttentionStorage storage,
                 int head_dim, SharedBytes shared, int forced) {
  auto blocks = [&](int w) { return row_groups * attention_row_blocks(len, w); };
  int w = kAttnMaxWarps;
  if (forced == 1 || forced == 2 || forced == 4) {
    w = forced;
  } else {
    while (w > 1 && blocks(w) < sm_count) w /= 2;
  }
  while (w > 1 && shared(storage, head_dim, w) > static_cast<std::size_t>(kAttnMaxSharedBytes))
    w /= 2;
  return w;
}

}  // namespace

bool attention_wgmma_available(int compute_capability) noexcept {
#if EXPHIL_ATTENTION_WGMMA
  return compute_capability == 90;
#else
  (void)compute_capability;
  return false;
#endif
}

AttentionPlan plan_attention(AttentionDirection direction, const AttentionShape& s, DType dtype,
                             AttentionMaskKind mask, int sm_count, int forced_warps,
                             bool wgmma, AttentionPrecision precision) noexcept {
  const std::size_t elem = dtype_size(dtype);
  AttentionPlan plan;
  plan.tf32x3 = dtype == DType::f32 && precision == AttentionPrecision::tf32x3;
  const AttentionStorage storage(elem, plan.tf32x3);
  plan.key_tile = attention_key_tile(storage, s.head_dim, s.kv_len);
  const bool uneven = mask != AttentionMaskKind::none;
  // block_coord() renumbers blocks in 32-bit arithmetic: a grid of more
  // blocks (more than any tensor in memory needs) keeps grid order.
  auto reorder = [&](int64_t row_groups, int64_t len, int warps) {
    const int64_t blocks = row_groups * attention_row_blocks(len, warps);
    return uneven && blocks > sm_count && blocks <= int64_t{UINT32_MAX};
  };
  plan.forward_warps = choose_warps(s.batch * s.q_heads, s.q_len, sm_count, storage, s.head_dim,
                                    attention_forward_shared_bytes, forced_warps);
  // The Hopper forward's blocks are one warpgroup, four warps: it takes the
  // calls whose sm_80 plan has four-warp blocks (grids that fill the GPU)
  // and keys past the short tile.
  plan.forward_wgmma = direction == AttentionDirection::forward && wgmma && elem == 2 &&
                       attention_wgmma_head_dim(s.head_dim) &&
                       plan.forward_warps == kAttnWgmmaThreads / 32 && s.kv_len > kAttnShortKeys;
  plan.forward_heaviest_first = reorder(s.batch * s.q_heads, s.q_len, plan.forward_warps);
  if (direction == AttentionDirection::backward) {
    plan.dq_warps = choose_warps(s.batch * s.q_heads, s.q_len, sm_count, storage, s.head_dim,
                                 attention_dq_shared_bytes, forced_warps);
    plan.dkdv_warps = choose_warps(s.batch * s.kv_heads, s.kv_len, sm_count, storage, s.head_dim,
                                   attention_dkdv_shared_bytes, forced_warps);
    plan.dq_heaviest_first = reorder(s.batch * s.q_heads, s.q_len, plan.dq_warps);
    plan.dkdv_heaviest_first = reorder(s.batch * s.kv_heads, s.kv_len, plan.dkdv_warps);
    plan.dkdv_wgmma = wgmma && elem == 2 && attention_dkdv_wgmma_head_dim(s.head_dim) &&
                      plan.dkdv_warps == kAttnWgmmaThreads / 32;
    plan.dq_wgmma = wgmma && elem == 2 && attention_dq_wgmma_head_dim(s.head_dim) &&
                    plan.dq_warps == kAttnWgmmaThreads / 32 && s.kv_len > kAttnShortKeys;
    // The fused kernel's tickets are 32-bit: a grid of more key blocks
    // (more than any tensor in memory needs) takes the two kernels.
    const int64_t key_blocks =
        s.batch * s.kv_heads * attention_row_blocks(s.kv_len, kAttnFusedWarps);
    plan.fused_backward = elem == 4 && attention_fused_backward_head_dim(s.head_dim) &&
                          plan.dkdv_warps == kAttnFusedWarps && key_blocks <= int64_t{UINT32_MAX};
    plan.ws_floats = s.batch * s.q_heads * s.q_len;
  }
  return plan;
}

const char* attention_unsupported(AttentionDirection direction, const AttentionPlan& plan,
                                  const AttentionShape& s, DType dtype) noexcept {
  if (!attention_head_dim_supported(s.head_dim)) return "head width must be 32, 64, 96 or 128";
  constexpr int64_t kMaxGridYz = 65535;
  if (s.batch > kMaxGridYz) return "B is over 65535 (the grid's z extent)";
  if (s.q_heads > kMaxGridYz) return "Hq is over 65535 (the grid's y extent)";
  constexpr int64_t kMaxGridX = 2147483647;
  if (attention_row_blocks(s.q_len, 1) > kMaxGridX || attention_row_blocks(s.kv_len, 1) > kMaxGridX)
    return "T or S is over the grid's x extent";
  const std::size_t elem = dtype_size(dtype);
  const AttentionStorage storage(elem, plan.tf32x3);
  const auto cap = static_cast<std::size_t>(kAttnMaxSharedBytes);
  const bool too_big =
      direction == AttentionDirection::forward
          ? (plan.forward_wgmma ? attention_forward_wgmma_shared_bytes(elem, s.head_dim)
                                : attention_forward_shared_bytes(storage, s.head_dim,
                                                                 plan.forward_warps, plan.key_tile)) > cap
          : (plan.dq_wgmma ? attention_dq_wgmma_shared_bytes(elem, s.head_dim)
                           : attention_dq_shared_bytes(storage, s.head_dim, plan.dq_warps,
                                                       plan.key_tile)) > cap ||
                (plan.dkdv_wgmma
                     ? attention_dkdv_wgmma_shared_bytes(elem, s.head_dim)
                     : attention_dkdv_shared_bytes(storage, s.head_dim, plan.dkdv_warps)) > cap ||
                (plan.fused_backward &&
                 attention_fused_backward_shared_bytes(storage, s.head_dim) > cap);
  if (too_big)
    return "a block's shared memory is over the limit (internal planner error)";
  return nullptr;
}

int attention_backward_kernel_count(const AttentionBackwardParams& p) noexcept {
  const bool kv = p.d_grad_k != nullptr || p.d_grad_v != nullptr;
  const bool q = p.d_grad_q != nullptr;
  if (!kv && !q) return 0;
  return kv ? 2 : 1;
}

}  // namespace exphil::kernels
