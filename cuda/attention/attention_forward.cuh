// Attention forward: O = softmax(scale Q K^T + mask) V and its log-sum-exp.
//
// Algorithm (FlashAttention-2's loop): a block takes 16 query rows per warp
// of one (batch, query head); each warp holds its Q rows as tensor-core
// operands in registers (f16/bf16; f32 reads them from shared memory) while
// the keys it can see stream through in tiles of kKT keys, copied with
// cp.async one tile ahead (f16/bf16) of the one in use, or in one stage
// (f32; tf32x3 waits for the tile's K and V apart): each warp scores
// its 16 rows against the tile, folds the tile into a running max and sum
// per row (online softmax, in base 2, each reduced as a tree), rescales its
// output accumulator and adds P V. Nothing of size T x S is ever stored.
// Only tiles that cut through some row's visible range pay for the mask.
//
// Layout: q [B, Hq, T, d], k and v [B, Hkv, S, d] as strides (either public
// layout); the grid is (ceil(T / rows), Hq, B), handed out heaviest row
// block first under a mask (block_coord()), query head h reads key head
// h / (Hq / Hkv). The planner picks 1, 2 or 4 warps per block: one warp per
// block fills the GPU with B1 h8 T32; four amortise each K/V tile over 64
// query rows at training shapes.
//
// Limits: d in {32, 64, 96, 128} (compile-time), B and Hq <= 65535 (grid).
// A row that sees no key writes zeros and an lse of -inf.
#pragma once

#include <math_constants.h>

#include "attention/attention_common.cuh"
#include "attention/attention_config.h"
#include "attention/attention_online_softmax.cuh"
#include "attention/attention_warp_mma.cuh"

namespace exphil::kernels {

template <class Elem, int kD, int kKT>
__global__ void __launch_bounds__(kAttnMaxWarps * 32,
                                  attention_forward_min_blocks(attention_storage<Elem>, kD))
    attention_forward_kernel(const AttentionForwardParams p, bool heaviest_first) {
  using namespace attn;
  constexpr int kNT = kKT / 8;  // 8-key tiles of one score fragment
  constexpr int kDT = kD / 8;   // 8-column tiles of the output
  constexpr int kLd = attention_row_stride(sizeof(Elem), kD);
  constexpr int kLdQK = attention_forward_qk_stride(attention_storage<Elem>, kD);
  const AttentionProblem& pr = p.problem;
  const int warp = threadIdx.x / 32, warps = blockDim.x / 32;
  const int rows = kAttnRowsPerWarp * warps;

  constexpr int kStages = attention_stages(sizeof(Elem));
  extern __shared__ __align__(16) unsigned char smem[];
  Elem* q_s = reinterpret_cast<Elem*>(smem);
  Elem* k_s = q_s + rows * kLdQK;               // [kStages][kKT][kLdQK]
  Elem* v_s = k_s + kStages * kKT * kLdQK;      // [kStages][kKT][kLd]
  float* scratch = reinterpret_cast<float*>(v_s + kStages * kKT * kLd) +
                   warp * kAttnRowsPerWarp * attention_scratch_stride(kKT);

  const BlockCoord at = block_coord(heaviest_first, true);
  const int64_t b = at.batch, h = at.head;
  const int64_t kv_head = h / (pr.shape.q_heads / pr.shape.kv_heads);
  const int64_t T = pr.shape.q_len, S = pr.shape.kv_len;
  const int64_t row0 = at.row_block * rows;
  const KeyRange keys = KeyRange::of(pr);
  const int64_t q_row = pr.q_strides.row, kv_row = pr.kv_strides.row;
  const Elem* d_k = head_rows<Elem>(p.d_k, pr.kv_strides, b, kv_head);
  const Elem* d_v = head_rows<Elem>(p.d_v, pr.kv_strides, b, kv_head);
  const int64_t block_last = min(row0 + rows, T) - 1;
  const int64_t k_begin = keys.lo(row0), k_end = keys.hi(block_last);
  // f16/bf16 up to d = 64: 128 registers, where the stepped copies spilled
  constexpr bool kLean = attention_min_blocks(sizeof(Elem), kD) == 4;
  auto load_k = [&](int64_t k0, int stage) {
    load_rows_async<Elem, kD, kLean>(k_s + stage * kKT * kLdQK, kLdQK, d_k + k0 * kv_row, kv_row,
                                     kKT, S - k0);
  };
  auto load_v = [&](int64_t k0, int stage) {
    load_rows_async<Elem, kD, kLean>(v_s + stage * kKT * kLd, kLd, d_v + k0 * kv_row, kv_row, kKT,
                                     S - k0);
  };
  auto load_kv = [&](int64_t k0, int stage) {
    load_k(k0, stage);
    load_v(k0, stage);
  };

  load_rows_async<Elem, kD, kLean>(q_s, kLdQK,
                                   head_rows<Elem>(p.d_q, pr.q_strides, b, h) + row0 * q_row,
                                   q_row, rows, T - row0);
  // tf32x3 waits for K and V apart (one stage): the next K's copy starts
  // once every warp is past the scores and lands during P V, the next V's
  // once every warp is past P V, landing during the next scores. Four
  // barriers a tile instead of two; B32 h8 T256 d64 ran 56.1 -> 55.3 us, d
  // = 128 108 -> 105, T1024 163 -> 158 on an H200. Exact f32 ran 1 to 3%
  // slower that way, and keeps one wait (bench/RESULTS.md).
  constexpr bool kSplitWaits = kStages == 1 && attention_storage<Elem>.tf32x3;
  if constexpr (kSplitWaits) {
    if (k_begin < k_end) load_k(k_begin, 0);
    cp_async_commit();
    if (k_begin < k_end) load_v(k_begin, 0);
    cp_async_commit();
  } else {
    if (k_begin < k_end) load_kv(k_begin, 0);
    cp_async_commit();
  }

  const int g = FragmentLanes<Elem>::row();
  const int64_t warp_row0 = row0 + kAttnRowsPerWarp * warp;
  const int64_t my_row[2] = {warp_row0 + g, warp_row0 + g + 8};
  const bool warp_has_rows = warp_row0 < T;
  const int64_t warp_lo = warp_has_rows ? keys.lo(warp_row0) : 0;
  const int64_t warp_hi = warp_has_rows ? keys.hi(min(warp_row0 + kAttnRowsPerWarp, T) - 1) : 0;
  const float scale_log2 = pr.scale * kLog2e;
  const int64_t row_lo[2] = {keys.lo(my_row[0]), keys.lo(my_row[1])};
  const int64_t row_hi[2] = {keys.hi(my_row[0]), keys.hi(my_row[1])};

  const Elem* q_warp = q_s + kAttnRowsPerWarp * warp * kLdQK;
  typename WarpMma<Elem>::template HeldA<kD> q_held;
  bool q_is_held = false;
  float o[kDT][4] = {};
  float m[2] = {-CUDART_INF_F, -CUDART_INF_F};  // running row max, base 2
  float l[2] = {0.0f, 0.0f};                    // this thread's share of the row sum

  if constexpr (kSplitWaits) {
    for (int64_t k0 = k_begin; k0 < k_end; k0 += kKT) {
      cp_async_wait<1>();  // K (and Q); V may be in flight
      __syncthreads();
      const bool sees = k0 < warp_hi && k0 + kKT > warp_lo;
      float s[kNT][4] = {};
      if (sees) {
        if (!q_is_held) {  // Q's copy is in the first group, with the first K
          WarpMma<Elem>::hold_a(q_held, q_warp, kLdQK);
          q_is_held = true;
        }
        WarpMma<Elem>::template a_held_b_nk<kNT, kD>(s, q_held, q_warp, kLdQK, k_s, kLdQK,
                                                     scratch);
      }
      __syncthreads();  // every warp is done with K
      if (k0 + kKT < k_end) load_k(k0 + kKT, 0);
      cp_async_commit();
      if (sees) {
        const TileSpan span[2] = {tile_span(row_lo[0], row_hi[0], k0, kKT),
                                  tile_span(row_lo[1], row_hi[1], k0, kKT)};
        online_softmax_tile<Elem>(s, o, m, l, span, scale_log2);
      }
      cp_async_wait<1>();  // V; the next K may be in flight
      __syncthreads();
      if (sees) WarpMma<Elem>::template a_frag_b_kn<kDT, kKT>(o, s, v_s, kLd, scratch);
      __syncthreads();  // every warp is done with V
      if (k0 + kKT < k_end) load_v(k0 + kKT, 0);
      cp_async_commit();
    }
  } else {
    stream_kv_tiles<kStages>(k_begin, k_end, kKT, load_kv, [&](int64_t k0, int stage) {
      if (k0 < warp_hi && k0 + kKT > warp_lo) {  // the warp sees keys of the tile
        const Elem* k_tile = k_s + stage * kKT * kLdQK;
        const Elem* v_tile = v_s + stage * kKT * kLd;
        if (!q_is_held) {  // Q's copy is in the first group, which every tile waits for
          WarpMma<Elem>::hold_a(q_held, q_warp, kLdQK);
          q_is_held = true;
        }
        float s[kNT][4] = {};
        WarpMma<Elem>::template a_held_b_nk<kNT, kD>(s, q_held, q_warp, kLdQK, k_tile, kLdQK,
                                                     scratch);
        const TileSpan span[2] = {tile_span(row_lo[0], row_hi[0], k0, kKT),
                                  tile_span(row_lo[1], row_hi[1], k0, kKT)};
        if constexpr (kLean)
          online_softmax_tile_eager<Elem>(s, o, m, l, span, scale_log2);
        else
          online_softmax_tile<Elem>(s, o, m, l, span, scale_log2);
        WarpMma<Elem>::template a_frag_b_kn<kDT, kKT>(o, s, v_tile, kLd, scratch);
      }
    });
  }
  cp_async_wait<0>();  // a block with no keys still has its Q copy in flight

  if (!warp_has_rows) return;
  store_forward_rows<Elem, kDT>(p, b, h, warp_row0, o, m, l);
}

}  // namespace exphil::kernels
