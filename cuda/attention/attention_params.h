// The contract between the host runtime and the attention kernels: plain
// structs, no device code, filled by c_src/ after validation and read by
// cuda/attention/.
#pragma once

#include <cstdint>

#include "exphil/tensor.hpp"

namespace exphil::kernels {

struct AttentionShape {
  int64_t batch = 0;    // B
  int64_t q_heads = 0;  // Hq
  int64_t kv_heads = 0; // Hkv, divides Hq
  int64_t q_len = 0;    // T
  int64_t kv_len = 0;   // S
  int head_dim = 0;     // d: 32, 64, 96 or 128
};

enum class AttentionMaskKind : int32_t { none = 0, causal = 1, window = 2 };

// How f32 products run: exact f32 FMAs, or on tensor cores as three TF32
// products (attention_warp_mma_tf32x3.cuh). f16 and bf16 ignore it (the
// runtime accepts only exact for them).
enum class AttentionPrecision : int32_t { exact = 0, tf32x3 = 1 };

// Element strides of a [B, H, L, d] tensor whatever its memory order (the
// head dimension is always contiguous). Both public layouts are expressed
// this way, so the kernels have no notion of layout.
struct AttentionStrides {
  int64_t batch = 0, head = 0, row = 0;
};

// Everything both directions share. Query i sees key j iff j < S and
//   causal: j <= i + S - T;  window: i + S - T - window < j <= i + S - T.
struct AttentionProblem {
  AttentionShape shape;
  DType dtype = DType::f32;
  AttentionMaskKind mask = AttentionMaskKind::none;
  AttentionPrecision precision = AttentionPrecision::exact;
  int64_t window = 0;
  float scale = 0.0f;         // the softmax scale actually applied
  AttentionStrides q_strides;  // q, o, grad_o, grad_q
  AttentionStrides kv_strides; // k, v, grad_k, grad_v
};

// q, k, v, o of `dtype`; lse [B, Hq, T] f32, null when not wanted.
struct AttentionForwardParams {
  AttentionProblem problem;
  const void* d_q = nullptr;
  const void* d_k = nullptr;
  const void* d_v = nullptr;
  void* d_o = nullptr;
  float* d_lse = nullptr;
};

// Input gradients are null when not wanted.
struct AttentionBackwardParams {
  AttentionProblem problem;
  const void* d_q = nullptr;
  const void* d_k = nullptr;
  const void* d_v = nullptr;
  const void* d_o = nullptr;
  const float* d_lse = nullptr;
  const void* d_grad_o = nullptr;
  void* d_grad_q = nullptr;
  void* d_grad_k = nullptr;
  void* d_grad_v = nullptr;
};

enum class AttentionDirection { forward, backward };

// How one call is laid out (attention_plan.cpp). Every kernel gives each
// warp 16 rows (query rows in the forward and dQ kernels, key rows in the
// dK/dV kernel); blocks of fewer warps make more blocks, which is what
// short sequences at batch 1 need to fill the GPU.
struct AttentionPlan {
  int forward_warps = 4;  // forward kernel
  int dq_warps = 4;       // backward, dQ kernel
  int dkdv_warps = 4;     // backward, dK/dV kernel
  int key_tile = 64;      // keys per step of the forward and dQ kernels
  // f32 under AttentionPrecision::tf32x3, whose tiles and shared memory
  // differ from exact f32's (AttentionStorage in attention_config.h).
  bool tf32x3 = false;
  // The forward runs the Hopper kernel (attention_forward_wgmma.cuh), whose
  // blocks are 64 rows and whose key tile is 64, instead of the sm_80 one.
  bool forward_wgmma = false;
  // The backward's dK/dV kernel is the Hopper one (attention_dkdv_wgmma.cuh),
  // 64 keys per block.
  bool dkdv_wgmma = false;
  // The backward's dQ kernel is the Hopper one (attention_dq_wgmma.cuh), 64
  // query rows per block and 64-key tiles.
  bool dq_wgmma = false;
  // A backward with dQ and dK or dV runs one kernel for all three
  // (attention_backward_fused.cuh) instead of the dQ and dK/dV kernels:
  // f32 (exact and tf32x3) up to d = 64 with four-warp dK/dV blocks.
  bool fused_backward = false;
  // Per kernel: hand its blocks out heaviest first (block_coord() in
  // attention_common.cuh). Set for masked calls whose grid has more blocks
  // than the GPU has SMs, where blocks of uneven work queue behind each
  // other; elsewhere grid order, which costs no index arithmetic.
  bool forward_heaviest_first = false;
  bool dq_heaviest_first = false;
  bool dkdv_heaviest_first = false;
  int64_t ws_floats = 0;  // backward workspace: rowsum(dO * O) [B, Hq, T], for dK/dV
};

}  // namespace exphil::kernels
