// Attention backward's dK/dV kernel on Hopper (sm_90a): the walk of
// attention_dkdv_kernel (attention_backward.cuh) with its four products as
// warpgroup instructions (wgmma).
//
// Algorithm: one warpgroup (4 warps) per block owns 64 keys of one (batch,
// key head), K and V in shared memory, and walks, for each query head of its
// GQA group in turn, the query tiles of kQT rows that see any of its keys;
// Q, dO, lse and rowsum(dO * O) of a tile are copied by cp.async one tile
// ahead. Per tile, with keys as rows (each warp 16 of them, in the
// accumulator layout of mma.sync's C fragment):
//   S^T  = K Q^T      and dP^T = V dO^T   m64n{kQT}k16, both operands in
//                                        shared memory (K-major)
//   P^T  = exp2(scale_log2 S^T - lse2[query]),  dS^T = P^T (dP^T - Di[query])
//                                        in registers
//   dV  += P^T dO     and dK   += dS^T Q  m64n{d}k16, P^T and dS^T rounded
//                                        to the element type as the register
//                                        operand, dO and Q read transposed
// dK and dV stay in registers over the whole walk, so the sum over the heads
// that share a key head has one fixed order and needs no atomics.
//
// Layout and grid as the sm_80 kernel: grid (ceil(S / 64), Hkv, B), heaviest
// key blocks first under a mask when the plan says so; rowsum(dO * O) comes
// from the workspace the dQ kernel (or the rowdot kernel) filled.
//
// Limits: f16 and bf16 at d = 64 (four accumulators of 16 x 64 per warp);
// compiled to a body only for sm_90a, launched only where
// attention_wgmma_available() says so.
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
__global__ void __launch_bounds__(kAttnWgmmaThreads, attention_dkdv_wgmma_min_blocks())
    attention_dkdv_wgmma_kernel(const AttentionBackwardParams p, const float* d_rowdot,
                                bool heaviest_first) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  using namespace attn;
  wait_for_prior_grid();  // launched as the dQ or rowsum kernel's dependent
  constexpr int kKeys = kAttnWgmmaRows, kQT = kAttnWgmmaQueryTile;
  constexpr int kNT = kQT / 8;  // 8-query tiles of one score fragment
  constexpr int kDT = kD / 8;
  constexpr uint32_t kKeyBytes = kKeys * kD * sizeof(Elem);
  constexpr uint32_t kTileBytes = kQT * kD * sizeof(Elem);
  const AttentionProblem& pr = p.problem;

  extern __shared__ __align__(16) unsigned char smem[];
  const uint32_t k_s = wgmma::swizzle_base(smem);
  const uint32_t v_s = k_s + kKeyBytes;
  const uint32_t q_s = v_s + kKeyBytes;          // [2][kQT x kD]
  const uint32_t do_s = q_s + 2 * kTileBytes;    // [2][kQT x kD]
  float* lse_s = reinterpret_cast<float*>(smem + (do_s + 2 * kTileBytes - smem_address(smem)));
  float* dot_s = lse_s + 2 * kQT;                // lse_s [2][kQT], dot_s [2][kQT]

  const BlockCoord at = block_coord(heaviest_first, false);
  const int64_t b = at.batch, kv_head = at.head;
  const int64_t T = pr.shape.q_len, S = pr.shape.kv_len;
  const int64_t group = pr.shape.q_heads / pr.shape.kv_heads;
  const int64_t key0 = at.row_block * kKeys;
  const KeyRange keys = KeyRange::of(pr);
  const int64_t q_row = pr.q_strides.row, kv_row = pr.kv_strides.row;

  // The walk: for each query head of the group, the query tiles that see
  // any of the block's keys.
  const int64_t q_begin = keys.first_query(key0);
  const int64_t q_end = keys.end_query(min(key0 + kKeys, S), T);
  const int64_t tiles_per_head = q_end > q_begin ? (q_end - q_begin + kQT - 1) / kQT : 0;
  const int64_t tiles = group * tiles_per_head;
  auto load_tile = [&](int64_t n, int stage) {
    const int64_t h = kv_head * group + n / tiles_per_head;
    const int64_t i0 = q_begin + (n % tiles_per_head) * kQT;
    wgmma::load_tile_async<Elem, kD, kQT>(
        q_s + stage * kTileBytes, head_rows<Elem>(p.d_q, pr.q_strides, b, h) + i0 * q_row, q_row,
        T - i0);
    wgmma::load_tile_async<Elem, kD, kQT>(
        do_s + stage * kTileBytes, head_rows<Elem>(p.d_grad_o, pr.q_strides, b, h) + i0 * q_row,
        q_row, T - i0);
    // Rows past T read 0: they are outside every key's span (in_span), as
    // are rows whose lse is -inf, so their P is 0 whatever these values are.
    const int64_t stats = (b * pr.shape.q_heads + h) * T + i0;
    load_floats_async(lse_s + stage * kQT, p.d_lse + stats, kQT, T - i0);
    load_floats_async(dot_s + stage * kQT, d_rowdot + stats, kQT, T - i0);
  };

  wgmma::load_tile_async<Elem, kD, kKeys>(
      k_s, head_rows<Elem>(p.d_k, pr.kv_strides, b, kv_head) + key0 * kv_row, kv_row, S - key0);
  wgmma::load_tile_async<Elem, kD, kKeys>(
      v_s, head_rows<Elem>(p.d_v, pr.kv_strides, b, kv_head) + key0 * kv_row, kv_row, S - key0);
  if (tiles > 0) load_tile(0, 0);
  cp_async_commit();

  const int warp = threadIdx.x / 32;
  const WarpKeys wk = warp_keys<Elem>(key0 + kAttnRowsPerWarp * warp, keys, S, T);
  const float scale_log2 = pr.scale * kLog2e;

  float dk[kDT][4] = {}, dv[kDT][4] = {};
  int stage = 0;
  for (int64_t n = 0; n < tiles; ++n, stage ^= 1) {
    if (n + 1 < tiles) load_tile(n + 1, stage ^ 1);
    cp_async_commit();
    cp_async_wait<1>();
    wgmma::fence_shared_for_async();
    __syncthreads();

    const int64_t i0 = q_begin + (n % tiles_per_head) * kQT;
    const uint32_t q_tile = q_s + stage * kTileBytes, do_tile = do_s + stage * kTileBytes;
    const float* lse_tile = lse_s + stage * kQT;
    const float* dot_tile = dot_s + stage * kQT;
    // Transposed scores: rows are the block's keys, columns the tile's
    // queries. Every warp takes part (the products are the warpgroup's);
    // keys that no query of the tile sees get P = 0 below.
    float pt[kNT][4], dpt[kNT][4];
    wgmma::product_pair<Elem, kD, kKeys, kQT>(pt, dpt, k_s, q_tile, v_s, do_tile);

    dkdv_tile_scores<Elem>(pt, dpt, wk, i0, scale_log2, lse_tile, dot_tile);
    uint32_t pa[kQT / 16][4], dsa[kQT / 16][4];
#pragma unroll
    for (int k = 0; k < kQT / 16; ++k) {
      a_fragment<Elem>(pt, k, pa[k]);
      a_fragment<Elem>(dpt, k, dsa[k]);
    }
    wgmma::fence();
#pragma unroll
    for (int k = 0; k < kQT / 16; ++k)
      wgmma::mma_rs<Elem, kD>(dv, pa[k], wgmma::mn_major<kQT>(do_tile, k));
#pragma unroll
    for (int k = 0; k < kQT / 16; ++k)
      wgmma::mma_rs<Elem, kD>(dk, dsa[k], wgmma::mn_major<kQT>(q_tile, k));
    wgmma::commit();
    wgmma::wait<0>();
    wgmma::hold(dv);
    wgmma::hold(dk);
    __syncthreads();  // every warp is done with this stage before it is refilled
  }
  cp_async_wait<0>();

  if (!wk.any) return;
  store_key_grads<Elem, kDT>(p, b, kv_head, kv_row, S, wk.key0, dk, dv);
#else
  (void)p;
  (void)d_rowdot;
  (void)heaviest_first;
#endif
}

}  // namespace exphil::kernels
