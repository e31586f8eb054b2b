// Attention forward on Hopper (sm_90a): the loop of attention_forward.cuh
// with its two products as warpgroup instructions (wgmma).
//
// Algorithm: one warpgroup (4 warps) per block takes 64 query rows of one
// (batch, query head). Q, and the K and V tiles of 64 keys, sit in shared
// memory in the 128-byte swizzle (attention_wgmma.cuh), copied by cp.async
// one tile ahead of the one in use. Per tile: S = Q K^T by d / 16
// m64n64k16 instructions reading both operands from shared memory; each
// warp then folds its 16 rows into the running max and sum (online
// softmax, base 2; the accumulator layout is mma.sync's, so the sm_80
// kernel's fragment helpers apply) with online_softmax_tile, whose
// shortcuts took B32 h8 T256 d64 from 19.0 to 15.0 us; the weights,
// rounded to the element type, become the register operand of O += P V,
// m64nDk16 with V read transposed from shared memory. Against the sm_80
// kernel, no warp loads K or V into its registers (the instructions read
// shared memory once per warpgroup rather than once per warp), and a tile's
// two products are d / 16 + 4 instructions rather than 32 to 64 mma.sync
// per warp. The tile copies are unrolled with per-thread offsets fixed for
// the whole kernel; the kernel issues an instruction in most cycles, so
// their address arithmetic counted (a generic loop made B32 h8 T256 d64
// 21.3 us instead of 19.0).
//
// Layout and grid as the sm_80 kernel: q [B, Hq, T, d], k and v [B, Hkv, S,
// d] by strides, grid (ceil(T / 64), Hq, B), heaviest row blocks first
// under a mask when the plan says so.
//
// Limits: f16 and bf16, d in {64, 128} (a swizzled row of 64 elements is
// one 128-byte atom row); compiled to a body only for sm_90a
// (__CUDA_ARCH_FEAT_SM90_ALL), launched only on compute capability 9.0 by a
// build that has it (attention_wgmma_available()).
#pragma once

#include <math_constants.h>

#include "attention/attention_common.cuh"
#include "attention/attention_config.h"
#include "attention/attention_online_softmax.cuh"
#include "attention/attention_warp_mma.cuh"
#include "attention/attention_wgmma.cuh"

namespace exphil::kernels {

template <class Elem, int kD>
__global__ void __launch_bounds__(kAttnWgmmaThreads, attention_wgmma_min_blocks(kD))
    attention_forward_wgmma_kernel(const AttentionForwardParams p, bool heaviest_first) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  using namespace attn;
  constexpr int kRows = kAttnWgmmaRows, kKT = kAttnWgmmaKeyTile;
  constexpr int kNT = kKT / 8;  // 8-key tiles of the score fragment
  constexpr int kDT = kD / 8;   // 8-column tiles of the output
  constexpr uint32_t kQBytes = kRows * kD * sizeof(Elem);
  constexpr uint32_t kTileBytes = kKT * kD * sizeof(Elem);
  const AttentionProblem& pr = p.problem;

  extern __shared__ __align__(16) unsigned char smem[];
  const uint32_t q_s = wgmma::swizzle_base(smem);
  const uint32_t k_s = q_s + kQBytes;           // [2][kKT x kD]
  const uint32_t v_s = k_s + 2 * kTileBytes;    // [2][kKT x kD]

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
  if (k_begin < k_end) load_kv(k_begin, 0);
  cp_async_commit();

  const WarpRows my_rows = warp_rows<Elem>(warp_first_row(row0), keys);
  const float scale_log2 = pr.scale * kLog2e;

  float o[kDT][4] = {};
  float m[2] = {-CUDART_INF_F, -CUDART_INF_F};  // running row max, base 2
  float l[2] = {0.0f, 0.0f};                    // this thread's share of the row sum

  int stage = 0;
  for (int64_t k0 = k_begin; k0 < k_end; k0 += kKT, stage ^= 1) {
    if (k0 + kKT < k_end) load_kv(k0 + kKT, stage ^ 1);
    cp_async_commit();
    cp_async_wait<1>();
    wgmma::fence_shared_for_async();
    __syncthreads();

    // Every warp takes part in both products (they are the warpgroup's);
    // rows that see none of the tile get weights of zero below.
    float s[kNT][4];
    wgmma::fence();
#pragma unroll
    for (int k = 0; k < kD / 16; ++k)
      wgmma::mma_ss<Elem, kKT>(s, wgmma::k_major<kRows>(q_s, k),
                               wgmma::k_major<kKT>(k_s + stage * kTileBytes, k), k > 0);
    wgmma::commit();
    wgmma::wait<0>();
    wgmma::hold(s);

    const TileSpan span[2] = {tile_span(my_rows.lo[0], my_rows.hi[0], k0, kKT),
                              tile_span(my_rows.lo[1], my_rows.hi[1], k0, kKT)};
    online_softmax_tile<Elem>(s, o, m, l, span, scale_log2);

    uint32_t pa[kKT / 16][4];
#pragma unroll
    for (int k = 0; k < kKT / 16; ++k) a_fragment<Elem>(s, k, pa[k]);
    wgmma::fence();
#pragma unroll
    for (int k = 0; k < kKT / 16; ++k)
      wgmma::mma_rs<Elem, kD>(o, pa[k], wgmma::mn_major<kKT>(v_s + stage * kTileBytes, k));
    wgmma::commit();
    wgmma::wait<0>();
    wgmma::hold(o);
    __syncthreads();  // every warp is done with this stage before it is refilled
  }
  cp_async_wait<0>();  // a block with no keys still has its Q copy in flight

  if (my_rows.row0 >= T) return;
  store_forward_rows<Elem, kDT>(p, b, h, my_rows.row0, o, m, l);
#else
  (void)p;
  (void)heaviest_first;
#endif
}

}  // namespace exphil::kernels
