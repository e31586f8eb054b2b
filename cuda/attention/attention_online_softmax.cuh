// The forward's row statistics: FlashAttention-2's online softmax over one
// key tile at a time (online_softmax_tile; online_softmax_tile_eager where
// registers are capped), for the sm_80 kernel (attention_forward.cuh) and
// the Hopper one (attention_forward_wgmma.cuh), and the rows' final O and
// log-sum-exp for both.
//
// A warp holds 16 query rows as score fragments (attention_warp_mma.cuh's C
// layout): each thread rows g and g + 8, for which it keeps the running max
// m (base 2, over the scores seen so far, which it may lag:
// online_softmax_tile) and its share l of the row sum of exp2(score - m),
// and its part of the output accumulator o, scaled by the same exp2(-m).
#pragma once

#include <math_constants.h>

#include "attention/attention_common.cuh"

namespace exphil::kernels::attn {

// Both folds' steps: the scores scaled to base 2, those outside a row's
// span set to -inf; and the tile's exponentiated scores added to the rows'
// sums.
template <class Elem, int kNT>
__device__ __forceinline__ void scale_scores_in_span(float (&s)[kNT][4], const TileSpan (&span)[2],
                                                     float scale_log2) {
#pragma unroll
  for (int j = 0; j < kNT; ++j)
#pragma unroll
    for (int e = 0; e < 4; ++e)
      s[j][e] = in_span<Elem>(span, j, e) ? s[j][e] * scale_log2 : -CUDART_INF_F;
}
template <int kNT>
__device__ __forceinline__ void add_tile_sums(const float (&s)[kNT][4], float (&l)[2]) {
  float tile_sum[2];
  fragment_row_reduce(s, tile_sum, [](float a, float b) { return a + b; });
  l[0] += tile_sum[0];
  l[1] += tile_sum[1];
}

// Folds a tile of raw scores s (kNT 8-key tiles) into m, l and o: masks the
// keys outside each row's span, rescales l and o when the row max moved,
// and leaves the tile's weights exp2(scale score - m) in s for the P V
// product. Few instructions per score, which both forwards need (the
// Hopper one issues an instruction in half of all cycles; the sm_80 f32
// ones are bound by latency, where each instruction of a dependent chain
// counts):
//  - A tile the warp sees whole, under a positive scale, keeps its raw
//    scores: their row max, scaled once, is the scaled row max, and one
//    FFMA per score, s * scale - m, feeds the exponential. Masked tiles
//    scale first, and the same FFMA multiplies by 1.
//  - The mask is a select per score with no branch (in_span).
//  - The running max m may lag the scores' max by up to kAttnMaxLag (base
//    2): the warp moves m, and rescales o and l, only when some row's max
//    rose by more than that, or had no max before. Weights are then at
//    most 2^kAttnMaxLag, which bf16/f16 weights and f32 sums hold without
//    loss; o, l and m stay consistent, so O and the log-sum-exp are exact.
// Against a fold that rescales every tile (online_softmax_tile_eager), it
// took the Hopper bf16 forward at B32 h8 T256 d64 from 19.0 to 15.0 us, and
// the sm_80 forward at B32 h8 T256 d96 bf16 from 34.5 to 31.0 us and B8 h8
// T1024 d64 exact f32 from 320 to 313 us on an H200, level elsewhere
// (bench/RESULTS.md).
constexpr float kAttnMaxLag = 8.0f;
template <class Elem, int kNT, int kDT>
__device__ __forceinline__ void online_softmax_tile(float (&s)[kNT][4], float (&o)[kDT][4],
                                                    float (&m)[2], float (&l)[2],
                                                    const TileSpan (&span)[2], float scale_log2) {
  const bool whole = warp_sees_whole_tile(span, 8 * kNT);
  const bool raw = whole && scale_log2 > 0.0f;  // warp-uniform
  if (!raw) scale_scores_in_span<Elem>(s, span, scale_log2);
  const float mul = raw ? scale_log2 : 1.0f;
  float tile_max[2];
  fragment_row_reduce(s, tile_max, [](float a, float b) { return fmaxf(a, b); });
  float m_new[2];
  bool rose = false;
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    m_new[half] = fmaxf(m[half], fragment_row_max<Elem>(tile_max[half]) * mul);
    rose |= m_new[half] > m[half] + kAttnMaxLag;  // also when m = -inf < m_new
  }
  if (__any_sync(0xffffffffu, rose)) {
    // Rows with no max before have o = l = 0: a warp whose moving rows are
    // all such (its first tile) skips the rescale.
    const bool rescale = __any_sync(0xffffffffu, (m[0] != -CUDART_INF_F && m_new[0] != m[0]) ||
                                                     (m[1] != -CUDART_INF_F && m_new[1] != m[1]));
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const float alpha = m[half] == -CUDART_INF_F ? 0.0f : exp2_ftz(m[half] - m_new[half]);
      m[half] = m_new[half];
      l[half] *= alpha;
      if (rescale) {
#pragma unroll
        for (int j = 0; j < kDT; ++j) {
          o[j][2 * half] *= alpha;
          o[j][2 * half + 1] *= alpha;
        }
      }
    }
  }
  // Exponentiate against 0 in a row with no max yet, so that every term is
  // exp2(-inf) = 0 rather than NaN.
  const float base[2] = {m[0] == -CUDART_INF_F ? 0.0f : m[0], m[1] == -CUDART_INF_F ? 0.0f : m[1]};
#pragma unroll
  for (int j = 0; j < kNT; ++j)
#pragma unroll
    for (int e = 0; e < 4; ++e) s[j][e] = exp2_ftz(fmaf(s[j][e], mul, -base[e >> 1]));
  add_tile_sums(s, l);
}

// online_softmax_tile's fold without its shortcuts: every tile scales its
// scores first and moves m, l and o to the new max. For the sm_80 forward
// whose registers are capped at 128 (f16/bf16 up to d = 64, four blocks per
// SM, attention_min_blocks()): there online_softmax_tile spilled 64 bytes
// at d = 64 (ptxas, sm_90a), which this fold does not.
template <class Elem, int kNT, int kDT>
__device__ __forceinline__ void online_softmax_tile_eager(float (&s)[kNT][4], float (&o)[kDT][4],
                                                    float (&m)[2], float (&l)[2],
                                                    const TileSpan (&span)[2], float scale_log2) {
  if (warp_sees_whole_tile(span, 8 * kNT)) {
#pragma unroll
    for (int j = 0; j < kNT; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) s[j][e] *= scale_log2;
  } else {
    scale_scores_in_span<Elem>(s, span, scale_log2);
  }
  float tile_max[2];
  fragment_row_reduce(s, tile_max, [](float a, float b) { return fmaxf(a, b); });
  float base[2];
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    const float m_new = fmaxf(m[half], fragment_row_max<Elem>(tile_max[half]));
    // A row that has seen no key yet keeps m = -inf; exponentiate against
    // 0 then so that every term is exp2(-inf) = 0 rather than NaN.
    base[half] = m_new == -CUDART_INF_F ? 0.0f : m_new;
    const float alpha = exp2_ftz(m[half] - base[half]);
    m[half] = m_new;
    l[half] *= alpha;
#pragma unroll
    for (int j = 0; j < kDT; ++j) {
      o[j][2 * half] *= alpha;
      o[j][2 * half + 1] *= alpha;
    }
  }
#pragma unroll
  for (int j = 0; j < kNT; ++j)
#pragma unroll
    for (int e = 0; e < 4; ++e) s[j][e] = exp2_ftz(s[j][e] - base[e >> 1]);
  add_tile_sums(s, l);
}

// Writes the warp's rows from warp_row0 on (those below T) of O = o / l
// and, when asked for, lse = m ln 2 + ln l; a row that saw no key gets
// zeros and -inf.
template <class Elem, int kDT>
__device__ __forceinline__ void store_forward_rows(const AttentionForwardParams& p, int64_t b,
                                                   int64_t h, int64_t warp_row0,
                                                   const float (&o)[kDT][4], const float (&m)[2],
                                                   float (&l)[2]) {
  const AttentionProblem& pr = p.problem;
  const int64_t T = pr.shape.q_len;
  float inv[2];
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    l[half] = fragment_row_sum<Elem>(l[half]);
    inv[half] = l[half] > 0.0f ? 1.0f / l[half] : 0.0f;
  }
  store_fragment<Elem, kDT>(head_rows<Elem>(p.d_o, pr.q_strides, b, h), pr.q_strides.row,
                            warp_row0, T, o, inv);
  if (p.d_lse != nullptr && FragmentLanes<Elem>::col() == 0) {
    float* lse = p.d_lse + (b * pr.shape.q_heads + h) * T;
    const int64_t row0 = warp_row0 + FragmentLanes<Elem>::row();
#pragma unroll
    for (int half = 0; half < 2; ++half)
      if (row0 + 8 * half < T)
        lse[row0 + 8 * half] = l[half] > 0.0f ? m[half] * kLn2 + logf(l[half]) : -CUDART_INF_F;
  }
}

}  // namespace exphil::kernels::attn
