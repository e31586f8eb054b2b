// Attention backward's dQ kernel on Hopper (sm_90a): the loop of
// attention_dq_kernel (attention_backward.cuh) with its three products as
// warpgroup instructions (wgmma).
//
// Algorithm: one warpgroup (4 warps) per block takes 64 query rows of one
// (batch, query head); Q and dO sit in shared memory, and the K and V tiles
// of 64 keys they see stream through it, copied by cp.async one tile ahead,
// all in the 128-byte swizzle (attention_wgmma.cuh). Each warp first
// computes Di = rowsum(dO * O) for its 16 rows from global memory
// (fragment_rowdot()), and leaves it in the workspace when the dK/dV kernel
// follows. Per tile:
//   S  = Q K^T  and  dP = dO V^T      m64n64k16, operands in shared memory
//   dS = P (dP - Di), P = exp2(scale_log2 S - lse2)   in registers
//   dQ += dS K                        m64n{d}k16, dS rounded to the element
//                                     type as the register operand, K read
//                                     transposed
// and dQ is scaled once at the end.
//
// Layout and grid as the sm_80 kernel: grid (ceil(T / 64), Hq, B), heaviest
// row blocks first under a mask when the plan says so.
//
// Limits: f16 and bf16 at d = 64; compiled to a body only for sm_90a,
// launched only where attention_wgmma_available() says so.
#pragma once

#include <math_constants.h>

#include "attention/attention_backward.cuh"
#include "attention/attention_common.cuh"
#include "attention/attention_config.h"
#include "attention/attention_warp_mma.cuh"
#include "attention/attention_wgmma.cuh"
#include "common/dependent_launch.cuh"

namespace exphil::kernels {

template <class Elem, int kD>
__global__ void __launch_bounds__(kAttnWgmmaThreads, attention_dq_wgmma_min_blocks())
    attention_dq_wgmma_kernel(const AttentionBackwardParams p, float* d_rowdot_out,
                              bool heaviest_first) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  using namespace attn;
  constexpr int kRows = kAttnWgmmaRows, kKT = kAttnWgmmaKeyTile;
  constexpr int kNT = kKT / 8;
  constexpr int kDT = kD / 8;
  constexpr uint32_t kRowBytes = kRows * kD * sizeof(Elem);
  constexpr uint32_t kTileBytes = kKT * kD * sizeof(Elem);
  const AttentionProblem& pr = p.problem;

  extern __shared__ __align__(16) unsigned char smem[];
  const uint32_t q_s = wgmma::swizzle_base(smem);
  const uint32_t do_s = q_s + kRowBytes;
  const uint32_t k_s = do_s + kRowBytes;       // [2][kKT x kD]
  const uint32_t v_s = k_s + 2 * kTileBytes;   // [2][kKT x kD]

  const QueryBlock<Elem> qb = query_block<Elem>(pr, p.d_k, p.d_v, kRows, heaviest_first);
  const int64_t b = qb.batch, h = qb.head, row0 = qb.row0, k_begin = qb.k_begin, k_end = qb.k_end;
  const int64_t T = pr.shape.q_len;
  const KeyRange keys = KeyRange::of(pr);
  const int64_t q_row = pr.q_strides.row;
  auto load_kv = [&](int64_t k0, int stage) {
    wgmma::load_kv_tiles_async<Elem, kD, kKT>(k_s + stage * kTileBytes, v_s + stage * kTileBytes,
                                              qb, pr, k0);
  };

  wgmma::load_tile_async<Elem, kD, kRows>(
      q_s, head_rows<Elem>(p.d_q, pr.q_strides, b, h) + row0 * q_row, q_row, T - row0);
  wgmma::load_tile_async<Elem, kD, kRows>(
      do_s, head_rows<Elem>(p.d_grad_o, pr.q_strides, b, h) + row0 * q_row, q_row, T - row0);
  if (k_begin < k_end) load_kv(k_begin, 0);
  cp_async_commit();

  const int64_t warp_row0 = warp_first_row(row0);
  const float scale_log2 = pr.scale * kLog2e;
  // Di's loads go out with the tiles' copies; the first tile waits for both.
  float row_dot[2], row_lse[2];
  dq_row_statistics<Elem, kD>(p, b, h, warp_row0, d_rowdot_out, row_dot, row_lse);
  const WarpRows my_rows = warp_rows<Elem>(warp_row0, keys);

  float dq[kDT][4] = {};
  int stage = 0;
  for (int64_t k0 = k_begin; k0 < k_end; k0 += kKT, stage ^= 1) {
    if (k0 + kKT < k_end) load_kv(k0 + kKT, stage ^ 1);
    cp_async_commit();
    cp_async_wait<1>();
    wgmma::fence_shared_for_async();
    __syncthreads();

    const uint32_t k_tile = k_s + stage * kTileBytes, v_tile = v_s + stage * kTileBytes;
    // Every warp takes part (the products are the warpgroup's); rows that
    // see none of the tile get P = 0 below.
    float s[kNT][4], dp[kNT][4];
    wgmma::product_pair<Elem, kD, kRows, kKT>(s, dp, q_s, k_tile, do_s, v_tile);

    const TileSpan span[2] = {tile_span(my_rows.lo[0], my_rows.hi[0], k0, kKT),
                              tile_span(my_rows.lo[1], my_rows.hi[1], k0, kKT)};
    dq_tile_scores<Elem>(s, dp, span, scale_log2, row_lse, row_dot);
    uint32_t dsa[kKT / 16][4];
#pragma unroll
    for (int k = 0; k < kKT / 16; ++k) a_fragment<Elem>(dp, k, dsa[k]);
    wgmma::fence();
#pragma unroll
    for (int k = 0; k < kKT / 16; ++k)
      wgmma::mma_rs<Elem, kD>(dq, dsa[k], wgmma::mn_major<kKT>(k_tile, k));
    wgmma::commit();
    wgmma::wait<0>();
    wgmma::hold(dq);
    __syncthreads();  // every warp is done with this stage before it is refilled
  }
  cp_async_wait<0>();
  allow_dependent_grid();  // the dK/dV kernel, as this block ends

  if (warp_row0 >= T) return;
  const float scale[2] = {pr.scale, pr.scale};
  store_fragment<Elem, kDT>(head_rows<Elem>(p.d_grad_q, pr.q_strides, b, h), q_row, warp_row0, T,
                            dq, scale);
#else
  (void)p;
  (void)d_rowdot_out;
  (void)heaviest_first;
#endif
}

}  // namespace exphil::kernels
