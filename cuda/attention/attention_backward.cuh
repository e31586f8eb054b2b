// Attention backward: dQ, dK, dV from dO, the forward's O and log-sum-exp.
//
// Algorithm. With P = exp(scale S - lse) recomputed tile by tile from the
// saved lse, dP = dO V^T and Di = rowsum(dO * O):
//   dV = P^T dO,  dS = P * (dP - Di),  dQ = scale dS K,  dK = scale dS^T Q.
// Two kernels, neither with atomics, so every sum has one fixed order:
//   1. attention_dq_kernel: a block takes 16 query rows per warp of one
//      (batch, query head) and walks the keys they see, as the forward does.
//      It computes Di for its own rows from O and dO (fragment_rowdot()),
//      and when dK or dV follow it writes them to the workspace.
//   2. attention_dkdv_kernel: a block takes 16 key rows per warp of one
//      (batch, key head) and walks, for each query head of its group in
//      turn, the query rows that can see its keys, in tiles of
//      attention_query_tile(), reading Di from the workspace. dK and dV stay
//      in registers, so the sum over the heads that share a key head is part
//      of the walk.
// A call without dQ runs attention_rowdot_kernel (a 16-byte vector of O and
// dO per thread) for Di instead of kernel 1. Scores are recomputed twice
// (kernels 1 and 2) instead of summing dQ across key blocks with atomics,
// FlashAttention-2's way, which is not deterministic. For f32 at
// d <= 64 in four-warp key blocks, one kernel replaces both after the
// rowsum kernel (attention_backward_fused.cuh): it sums dQ across key
// blocks in a fixed order that counters enforce.
// Streamed tiles are copied with cp.async one tile ahead (f16/bf16), and
// only tiles that cut through a visible range pay for the mask. Under a
// mask the blocks of kernels 1 and 2 start heaviest first (block_coord()).
//
// On Hopper, f16/bf16 at d = 64, kernels 1 and 2 have warpgroup twins
// (attention_dq_wgmma.cuh, attention_dkdv_wgmma.cuh) with the same walks
// and sums; the helpers below serve both.
//
// Layout and limits as the forward (attention_forward.cuh). Rows that saw
// no key (lse = -inf) get P = 0 and so no gradient.
#pragma once

#include <math_constants.h>

#include "attention/attention_common.cuh"
#include "attention/attention_config.h"
#include "attention/attention_warp_mma.cuh"
#include "common/dependent_launch.cuh"

namespace exphil::kernels {

namespace attn {
// lse in base 2 for P = exp2(scale_log2 s - lse2); +inf where no key was
// seen (or past the sequence), so that P is exactly 0 there.
__device__ __forceinline__ float lse_base2(float lse) {
  return lse == -CUDART_INF_F ? CUDART_INF_F : lse * kLog2e;
}
}  // namespace attn

namespace attn {
// Threads that share one row in the rowdot kernel: one 16-byte vector each,
// rounded up to a power of two so that the row's threads reduce by
// butterfly shuffles within an aligned group of lanes.
template <class Elem, int kD>
__host__ __device__ constexpr int rowdot_threads() {
  constexpr int vectors = kD * static_cast<int>(sizeof(Elem)) / 16;
  int n = 1;
  while (n < vectors) n *= 2;
  return n;
}

// dot(a, b) of two 16-byte vectors of Elem, in f32.
template <class Elem>
__device__ __forceinline__ float vector_dot(const uint4& a, const uint4& b) {
  constexpr int kVec = 16 / sizeof(Elem);
  const Elem* x = reinterpret_cast<const Elem*>(&a);
  const Elem* y = reinterpret_cast<const Elem*>(&b);
  float sum = 0.0f;
#pragma unroll
  for (int i = 0; i < kVec; ++i) sum = fmaf(to_float(x[i]), to_float(y[i]), sum);
  return sum;
}

// Di = rowsum(dO * O) of this lane's two fragment rows, row0 + g and
// row0 + g + 8 (0 past `valid`), from global memory: each of a row's four
// lanes takes a quarter of its d columns in 16-byte vectors, and the row's
// lanes add their parts, so the sums land where the fragments need them.
template <class Elem, int kD>
__device__ __forceinline__ void fragment_rowdot(const Elem* d_o, const Elem* d_grad_o,
                                                int64_t row_stride, int64_t row0, int64_t valid,
                                                float (&dot)[2]) {
  constexpr int kColumns = kD / 4;
  constexpr int kVectors = kColumns * static_cast<int>(sizeof(Elem)) / 16;
  static_assert(kVectors >= 1, "a lane's quarter of a row is at least one 16-byte vector");
  const int g = FragmentLanes<Elem>::row(), t = FragmentLanes<Elem>::col();
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    const int64_t row = row0 + g + 8 * half;
    float sum = 0.0f;
    if (row < valid) {
      const int64_t offset = row * row_stride + t * kColumns;
      const uint4* o = reinterpret_cast<const uint4*>(d_o + offset);
      const uint4* d_out = reinterpret_cast<const uint4*>(d_grad_o + offset);
#pragma unroll
      for (int v = 0; v < kVectors; ++v) sum += vector_dot<Elem>(__ldg(o + v), __ldg(d_out + v));
    }
    dot[half] = fragment_row_sum<Elem>(sum);
  }
}

// The dQ kernels' per-row values for this lane's two rows of the warp's
// 16 from warp_row0: Di = rowsum(dO * O), also written to d_rowdot_out
// (the dK/dV kernel's workspace) unless it is null, and lse in base 2.
template <class Elem, int kD>
__device__ __forceinline__ void dq_row_statistics(const AttentionBackwardParams& p, int64_t b,
                                                  int64_t h, int64_t warp_row0,
                                                  float* d_rowdot_out, float (&row_dot)[2],
                                                  float (&row_lse)[2]) {
  const AttentionProblem& pr = p.problem;
  const int64_t T = pr.shape.q_len;
  const int64_t stats = (b * pr.shape.q_heads + h) * T;
  fragment_rowdot<Elem, kD>(head_rows<Elem>(p.d_o, pr.q_strides, b, h),
                            head_rows<Elem>(p.d_grad_o, pr.q_strides, b, h), pr.q_strides.row,
                            warp_row0, T, row_dot);
  const int64_t row0 = warp_row0 + FragmentLanes<Elem>::row();
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    const int64_t row = row0 + 8 * half;
    const bool valid = row < T;
    row_lse[half] = valid ? lse_base2(p.d_lse[stats + row]) : CUDART_INF_F;
    if (valid && d_rowdot_out != nullptr && FragmentLanes<Elem>::col() == 0)
      d_rowdot_out[stats + row] = row_dot[half];
  }
}

// The dQ kernels' step from a tile's scores s and dP = dO V^T (rows the
// queries) to dS = P (dP - Di), left in dp; keys outside a row's span get
// P = 0.
template <class Elem, int kNT>
__device__ __forceinline__ void dq_tile_scores(const float (&s)[kNT][4], float (&dp)[kNT][4],
                                               const TileSpan (&span)[2], float scale_log2,
                                               const float (&row_lse)[2],
                                               const float (&row_dot)[2]) {
  const bool whole = warp_sees_whole_tile(span, 8 * kNT);
#pragma unroll
  for (int j = 0; j < kNT; ++j)
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int half = e >> 1;
      const float p = exp2_ftz(s[j][e] * scale_log2 - row_lse[half]);
      const float prob = whole ? p : (in_span<Elem>(span, j, e) ? p : 0.0f);
      dp[j][e] = prob * (dp[j][e] - row_dot[half]);  // dS
    }
}

// A warp's 16 keys in the dK/dV kernels, from key0: whether it has any
// (key0 < S), the queries [q_begin, q_end) that see any of them, and for
// this thread's two fragment rows (keys g and g + 8) the queries
// [q_lo, q_hi) that see each (none past S).
struct WarpKeys {
  int64_t key0;
  bool any;
  int64_t q_begin, q_end;
  int64_t q_lo[2], q_hi[2];
};
template <class Elem>
__device__ __forceinline__ WarpKeys warp_keys(int64_t key0, const KeyRange& keys, int64_t S,
                                              int64_t T) {
  WarpKeys w;
  w.key0 = key0;
  w.any = key0 < S;
  w.q_begin = w.any ? keys.first_query(key0) : 0;
  w.q_end = w.any ? keys.end_query(min(key0 + kAttnRowsPerWarp, S), T) : 0;
  const int g = FragmentLanes<Elem>::row();
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    const int64_t key = key0 + g + 8 * half;
    const bool valid = key < S;
    w.q_lo[half] = valid ? keys.first_query(key) : 0;
    w.q_hi[half] = valid ? keys.end_query(key + 1, T) : 0;
  }
  return w;
}

// The dK/dV kernels' last step: dK (times the softmax scale) and dV of the
// warp's 16 keys from warp_key0, each unless its pointer is null (kv_row:
// the rows' stride, S: the keys; what the kernels already hold).
template <class Elem, int kDT>
__device__ __forceinline__ void store_key_grads(const AttentionBackwardParams& p, int64_t b,
                                                int64_t kv_head, int64_t kv_row, int64_t S,
                                                int64_t warp_key0, const float (&dk)[kDT][4],
                                                const float (&dv)[kDT][4]) {
  const AttentionProblem& pr = p.problem;
  const float one[2] = {1.0f, 1.0f}, scale[2] = {pr.scale, pr.scale};
  if (p.d_grad_k != nullptr)
    store_fragment<Elem, kDT>(head_rows<Elem>(p.d_grad_k, pr.kv_strides, b, kv_head), kv_row,
                              warp_key0, S, dk, scale);
  if (p.d_grad_v != nullptr)
    store_fragment<Elem, kDT>(head_rows<Elem>(p.d_grad_v, pr.kv_strides, b, kv_head), kv_row,
                              warp_key0, S, dv, one);
}

// The dK/dV kernels' step from the transposed scores of the tile of 8 kNT
// queries from i0 (rows the warp's keys wk, columns the queries, whose lse
// and Di are lse_tile[] and dot_tile[]) to P^T, left in pt, and dS^T, left
// in dpt; queries outside a key's span get P = 0.
template <class Elem, int kNT>
__device__ __forceinline__ void dkdv_tile_scores(float (&pt)[kNT][4], float (&dpt)[kNT][4],
                                                 const WarpKeys& wk, int64_t i0, float scale_log2,
                                                 const float* lse_tile, const float* dot_tile) {
  const TileSpan span[2] = {tile_span(wk.q_lo[0], wk.q_hi[0], i0, 8 * kNT),
                            tile_span(wk.q_lo[1], wk.q_hi[1], i0, 8 * kNT)};
  const bool whole = warp_sees_whole_tile(span, 8 * kNT);
  const int t = FragmentLanes<Elem>::col();
#pragma unroll
  for (int j = 0; j < kNT; ++j)
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int col = 8 * j + 2 * t + (e & 1);
      const float p = exp2_ftz(fmaf(lse_tile[col], -kLog2e, pt[j][e] * scale_log2));
      const float prob = whole ? p : (in_span<Elem>(span, j, e) ? p : 0.0f);
      pt[j][e] = prob;
      dpt[j][e] = prob * (dpt[j][e] - dot_tile[col]);  // now dS^T
    }
}
}  // namespace attn

// rowdot[b, h, i] = sum_c dO[b, h, i, c] * O[b, h, i, c]. The grid is
// (row blocks, query heads, batch) of kAttnRowdotThreads threads;
// rowdot_threads() threads share a row, each with one 16-byte vector of O
// and of dO, and each warp takes kAttnRowdotPasses groups of rows, every
// load issued before the first sum. (One row per warp pass, found with
// 64-bit divisions, took forward + backward at B32 h8 T256 d64 1.8 to 3.2
// us longer on an H200, bench/RESULTS.md.) O streams past L2 (the backward
// reads it nowhere else); dO stays for the kernel that follows. Before the fused
// backward (attention_backward_fused.cuh) it also zeroes that kernel's
// `counters` words (none when d_counters is null). The kernel after it
// (fused or dK/dV) is its dependent (dependent_launch.h), allowed to start
// as its blocks end.
// The blocks of attention_rowdot_kernel an SM holds: kAttnRowdotMinBlocks
// where an SM takes 2048 threads (sm_80, sm_90), and as many as 1536
// threads allow on sm_86, sm_87, sm_89 and sm_120 (eight 256-thread blocks
// cannot be resident there, and ptxas says so for each instance).
#if defined(__CUDA_ARCH__) && \
    (__CUDA_ARCH__ == 860 || __CUDA_ARCH__ == 870 || __CUDA_ARCH__ == 890 || __CUDA_ARCH__ >= 1200)
inline constexpr int kAttnRowdotResidentBlocks = 1536 / kAttnRowdotThreads;
#else
inline constexpr int kAttnRowdotResidentBlocks = kAttnRowdotMinBlocks;
#endif

template <class Elem, int kD>
__global__ void __launch_bounds__(kAttnRowdotThreads, kAttnRowdotResidentBlocks)
    attention_rowdot_kernel(const AttentionBackwardParams p, float* d_rowdot,
                            uint32_t* d_counters, int64_t counters) {
  using namespace attn;
  constexpr int kPerRow = rowdot_threads<Elem, kD>();
  constexpr int kVec = 16 / sizeof(Elem);
  constexpr int kRowsPerPass = 32 / kPerRow;  // a warp's rows per pass
  constexpr int kPasses = kAttnRowdotPasses;
  const AttentionProblem& pr = p.problem;
  if (d_counters != nullptr) {
    const int64_t block =
        blockIdx.x + int64_t{gridDim.x} * (blockIdx.y + int64_t{gridDim.y} * blockIdx.z);
    const int64_t threads = int64_t{gridDim.x} * gridDim.y * gridDim.z * blockDim.x;
    for (int64_t w = block * blockDim.x + threadIdx.x; w < counters; w += threads)
      d_counters[w] = 0;
  }
  const int64_t T = pr.shape.q_len, b = blockIdx.z, h = blockIdx.y;
  const int lane = threadIdx.x % 32, part = lane % kPerRow;
  const int64_t warp = int64_t{blockIdx.x} * (kAttnRowdotThreads / 32) + threadIdx.x / 32;
  const int64_t row0 = warp * kPasses * kRowsPerPass + lane / kPerRow;
  const Elem* o_rows = head_rows<Elem>(p.d_o, pr.q_strides, b, h);
  const Elem* do_rows = head_rows<Elem>(p.d_grad_o, pr.q_strides, b, h);
  const bool has_part = part * kVec < kD;
  uint4 o[kPasses], d_o[kPasses];
#pragma unroll
  for (int pass = 0; pass < kPasses; ++pass) {
    const int64_t row = row0 + pass * kRowsPerPass;
    o[pass] = d_o[pass] = make_uint4(0, 0, 0, 0);
    if (row < T && has_part) {
      const int64_t offset = row * pr.q_strides.row;
      o[pass] = __ldcs(reinterpret_cast<const uint4*>(o_rows + offset) + part);
      d_o[pass] = __ldg(reinterpret_cast<const uint4*>(do_rows + offset) + part);
    }
  }
  float* out = d_rowdot + (b * pr.shape.q_heads + h) * T;
#pragma unroll
  for (int pass = 0; pass < kPasses; ++pass) {
    float sum = vector_dot<Elem>(o[pass], d_o[pass]);
    // Every lane reaches the shuffles; rows past T only drop their sums.
#pragma unroll
    for (int step = kPerRow / 2; step > 0; step /= 2)
      sum += __shfl_xor_sync(0xffffffffu, sum, step);
    const int64_t row = row0 + pass * kRowsPerPass;
    if (row < T && part == 0) out[row] = sum;
  }
  // The kernel after it may start once every block is here. Allowed as each
  // block starts instead, its blocks were placed while the rowsum blocks
  // still held SMs, and a fused grid of one wave (B16 h8 T128, B32 h8 T64)
  // ran 5 to 16 us slower on an H200; allowed here, no shape measured was
  // slower than without a dependent launch (bench/RESULTS.md).
  allow_dependent_grid();
}

template <class Elem, int kD>
__global__ void __launch_bounds__(kAttnMaxWarps * 32, attention_min_blocks(sizeof(Elem), kD))
    attention_dkdv_kernel(const AttentionBackwardParams p, const float* d_rowdot,
                          bool heaviest_first) {
  using namespace attn;
  wait_for_prior_grid();  // launched as the dQ or rowsum kernel's dependent
  constexpr int kQT = attention_query_tile(attention_storage<Elem>, kD);
  constexpr int kNT = kQT / 8;  // 8-query tiles of one score fragment
  constexpr int kDT = kD / 8;
  constexpr int kLd = attention_row_stride(sizeof(Elem), kD);
  const AttentionProblem& pr = p.problem;
  const int warp = threadIdx.x / 32, warps = blockDim.x / 32;
  const int rows = kAttnRowsPerWarp * warps;

  constexpr int kStages = attention_stages(sizeof(Elem));
  extern __shared__ __align__(16) unsigned char smem[];
  Elem* k_s = reinterpret_cast<Elem*>(smem);
  Elem* v_s = k_s + rows * kLd;
  Elem* q_s = v_s + rows * kLd;              // [kStages][kQT][kLd]
  Elem* do_s = q_s + kStages * kQT * kLd;    // [kStages][kQT][kLd]
  float* lse_s = reinterpret_cast<float*>(do_s + kStages * kQT * kLd);  // [kStages][kQT]
  float* dot_s = lse_s + kStages * kQT;                                  // [kStages][kQT]
  float* scratch =
      dot_s + kStages * kQT + warp * kAttnRowsPerWarp * attention_scratch_stride(kQT);

  const BlockCoord at = block_coord(heaviest_first, false);
  const int64_t b = at.batch, kv_head = at.head;
  const int64_t T = pr.shape.q_len, S = pr.shape.kv_len;
  const int64_t group = pr.shape.q_heads / pr.shape.kv_heads;
  const int64_t key0 = at.row_block * rows;
  const KeyRange keys = KeyRange::of(pr);
  const int64_t q_row = pr.q_strides.row, kv_row = pr.kv_strides.row;

  // The walk: for each query head of the group, the query tiles that see
  // any of the block's keys.
  const int64_t q_begin = keys.first_query(key0);
  const int64_t q_end = keys.end_query(min(key0 + rows, S), T);
  const int64_t tiles_per_head = q_end > q_begin ? (q_end - q_begin + kQT - 1) / kQT : 0;
  const int64_t tiles = group * tiles_per_head;
  auto load_tile = [&](int64_t n, int stage) {
    const int64_t h = kv_head * group + n / tiles_per_head;
    const int64_t i0 = q_begin + (n % tiles_per_head) * kQT;
    load_rows_async<Elem, kD>(q_s + stage * kQT * kLd, kLd,
                              head_rows<Elem>(p.d_q, pr.q_strides, b, h) + i0 * q_row, q_row, kQT,
                              T - i0);
    load_rows_async<Elem, kD>(do_s + stage * kQT * kLd, kLd,
                              head_rows<Elem>(p.d_grad_o, pr.q_strides, b, h) + i0 * q_row, q_row,
                              kQT, T - i0);
    // lse and rowdot travel with their rows, so that no warp waits for a
    // plain load before the tile's products. Rows past T read 0: they are
    // outside every key's span (in_span), as are rows whose lse is -inf
    // (they see no key), so their P is 0 whatever these values are.
    const int64_t stats = (b * pr.shape.q_heads + h) * T + i0;
    load_floats_async(lse_s + stage * kQT, p.d_lse + stats, kQT, T - i0);
    load_floats_async(dot_s + stage * kQT, d_rowdot + stats, kQT, T - i0);
  };

  load_rows_async<Elem, kD>(k_s, kLd, head_rows<Elem>(p.d_k, pr.kv_strides, b, kv_head) + key0 * kv_row,
                            kv_row, rows, S - key0);
  load_rows_async<Elem, kD>(v_s, kLd, head_rows<Elem>(p.d_v, pr.kv_strides, b, kv_head) + key0 * kv_row,
                            kv_row, rows, S - key0);
  if (tiles > 0) load_tile(0, 0);
  cp_async_commit();

  const WarpKeys wk = warp_keys<Elem>(key0 + kAttnRowsPerWarp * warp, keys, S, T);
  const float scale_log2 = pr.scale * kLog2e;

  float dk[kDT][4] = {}, dv[kDT][4] = {};
  int stage = 0;
  for (int64_t n = 0; n < tiles; ++n, stage = kStages == 1 ? 0 : stage ^ 1) {
    if constexpr (kStages == 2) {
      if (n + 1 < tiles) load_tile(n + 1, stage ^ 1);
      cp_async_commit();
      cp_async_wait<1>();
    } else {
      if (n != 0) {
        load_tile(n, 0);
        cp_async_commit();
      }
      cp_async_wait<0>();
    }
    __syncthreads();
    const int64_t i0 = q_begin + (n % tiles_per_head) * kQT;
    if (i0 < wk.q_end && i0 + kQT > wk.q_begin) {
      const Elem* q_tile = q_s + stage * kQT * kLd;
      const Elem* do_tile = do_s + stage * kQT * kLd;
      const float* lse_tile = lse_s + stage * kQT;
      const float* dot_tile = dot_s + stage * kQT;
      // Transposed scores: rows are this warp's keys, columns the tile's queries.
      float pt[kNT][4] = {}, dpt[kNT][4] = {};
      WarpMma<Elem>::template a_smem_b_nk<kNT, kD>(pt, k_s + kAttnRowsPerWarp * warp * kLd, kLd,
                                                   q_tile, kLd, scratch);
      WarpMma<Elem>::template a_smem_b_nk<kNT, kD>(dpt, v_s + kAttnRowsPerWarp * warp * kLd, kLd,
                                                   do_tile, kLd, scratch);
      dkdv_tile_scores<Elem>(pt, dpt, wk, i0, scale_log2, lse_tile, dot_tile);
      WarpMma<Elem>::template a_frag_b_kn<kDT, kQT>(dv, pt, do_tile, kLd, scratch);
      WarpMma<Elem>::template a_frag_b_kn<kDT, kQT>(dk, dpt, q_tile, kLd, scratch);
    }
    __syncthreads();  // every warp is done with this stage before it is refilled
  }
  cp_async_wait<0>();

  if (!wk.any) return;
  store_key_grads<Elem, kDT>(p, b, kv_head, kv_row, S, wk.key0, dk, dv);
}

template <class Elem, int kD, int kKT>
__global__ void __launch_bounds__(kAttnMaxWarps * 32, attention_min_blocks(sizeof(Elem), kD))
    attention_dq_kernel(const AttentionBackwardParams p, float* d_rowdot_out,
                        bool heaviest_first) {
  using namespace attn;
  constexpr int kNT = kKT / 8;
  constexpr int kDT = kD / 8;
  constexpr int kLd = attention_row_stride(sizeof(Elem), kD);
  const AttentionProblem& pr = p.problem;
  const int warp = threadIdx.x / 32, warps = blockDim.x / 32;
  const int rows = kAttnRowsPerWarp * warps;

  constexpr int kStages = attention_stages(sizeof(Elem));
  extern __shared__ __align__(16) unsigned char smem[];
  Elem* q_s = reinterpret_cast<Elem*>(smem);
  Elem* do_s = q_s + rows * kLd;
  Elem* k_s = do_s + rows * kLd;           // [kStages][kKT][kLd]
  Elem* v_s = k_s + kStages * kKT * kLd;   // [kStages][kKT][kLd]
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
  auto load_kv = [&](int64_t k0, int stage) {
    load_rows_async<Elem, kD>(k_s + stage * kKT * kLd, kLd, d_k + k0 * kv_row, kv_row, kKT, S - k0);
    load_rows_async<Elem, kD>(v_s + stage * kKT * kLd, kLd, d_v + k0 * kv_row, kv_row, kKT, S - k0);
  };

  load_rows_async<Elem, kD>(q_s, kLd, head_rows<Elem>(p.d_q, pr.q_strides, b, h) + row0 * q_row,
                            q_row, rows, T - row0);
  load_rows_async<Elem, kD>(do_s, kLd,
                            head_rows<Elem>(p.d_grad_o, pr.q_strides, b, h) + row0 * q_row, q_row,
                            rows, T - row0);
  if (k_begin < k_end) load_kv(k_begin, 0);
  cp_async_commit();

  const int g = FragmentLanes<Elem>::row();
  const int64_t warp_row0 = row0 + kAttnRowsPerWarp * warp;
  const int64_t my_row[2] = {warp_row0 + g, warp_row0 + g + 8};
  const bool warp_has_rows = warp_row0 < T;
  const int64_t warp_lo = warp_has_rows ? keys.lo(warp_row0) : 0;
  const int64_t warp_hi = warp_has_rows ? keys.hi(min(warp_row0 + kAttnRowsPerWarp, T) - 1) : 0;
  const float scale_log2 = pr.scale * kLog2e;
  // Di's loads go out with the tiles' copies; the first tile waits for both.
  float row_dot[2], row_lse[2];
  dq_row_statistics<Elem, kD>(p, b, h, warp_row0, d_rowdot_out, row_dot, row_lse);
  const int64_t row_lo[2] = {keys.lo(my_row[0]), keys.lo(my_row[1])};
  const int64_t row_hi[2] = {keys.hi(my_row[0]), keys.hi(my_row[1])};

  float dq[kDT][4] = {};
  stream_kv_tiles<kStages>(k_begin, k_end, kKT, load_kv, [&](int64_t k0, int stage) {
    if (k0 < warp_hi && k0 + kKT > warp_lo) {  // the warp sees keys of the tile
      const Elem* k_tile = k_s + stage * kKT * kLd;
      const Elem* v_tile = v_s + stage * kKT * kLd;
      float s[kNT][4] = {}, dp[kNT][4] = {};
      WarpMma<Elem>::template a_smem_b_nk<kNT, kD>(s, q_s + kAttnRowsPerWarp * warp * kLd, kLd,
                                                   k_tile, kLd, scratch);
      WarpMma<Elem>::template a_smem_b_nk<kNT, kD>(dp, do_s + kAttnRowsPerWarp * warp * kLd, kLd,
                                                   v_tile, kLd, scratch);
      const TileSpan span[2] = {tile_span(row_lo[0], row_hi[0], k0, kKT),
                                tile_span(row_lo[1], row_hi[1], k0, kKT)};
      dq_tile_scores<Elem>(s, dp, span, scale_log2, row_lse, row_dot);
      WarpMma<Elem>::template a_frag_b_kn<kDT, kKT>(dq, dp, k_tile, kLd, scratch);
    }
  });
  cp_async_wait<0>();
  allow_dependent_grid();  // the dK/dV kernel, as this block ends

  if (!warp_has_rows) return;
  const float scale[2] = {pr.scale, pr.scale};
  store_fragment<Elem, kDT>(head_rows<Elem>(p.d_grad_q, pr.q_strides, b, h), q_row, warp_row0, T,
                            dq, scale);
}

}  // namespace exphil::kernels
