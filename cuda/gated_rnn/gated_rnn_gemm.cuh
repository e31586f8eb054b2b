/*
 * The gated-RNN backward's two products over every step at once
 * (gated_rnn_backward.cuh, steps 1 and 4): C[m, n] = sum_k A(m, k) B(k, n)
 * for m < M, n < N, with loaders for A and B and a store for C, so that
 * the operands are read where they lie (h_{t-1} from y or h0, R in its
 * dtype) and the results land where they go (rh + bias; grad_R, grad_bias).
 *
 * Tiles of 128 x 128 outputs, k in steps of 16; 256 threads of 8 x 8
 * outputs, each the sum of its k in increasing order by one thread: results
 * are bitwise reproducible. Per step of k a thread reads 2 float4 of A and
 * 2 of B from shared memory for 64 FMAs, and the next step's tile is
 * loaded into registers while this one is multiplied. A loader prepares
 * what one row of its operand needs once (`row`: pointer, source; the
 * division by T that finds h_{t-1} happens there), then reads elements of
 * it (`at`): the first version computed that per element and its products
 * ran at 6 TFLOP/s on an H100.
 *
 * Split K: with few output tiles (grad_R is [H+1, G*H] summed over B*T;
 * the recompute product [B*T, G*H] at small B*T) the grid is split along k
 * into `splits` slices whose sums land in a f32 buffer [splits, M, N]; gated_rnn_gemm_reduce_kernel then adds the slices
 * in order and stores. Still one fixed order per output: deterministic.
 *
 * Loader contract: A::kContiguousK says whether A's elements of one m are
 * contiguous in k (a row-major [M, K] operand) or those of one k contiguous
 * in m ([K, M]). A.row(m) and A.at(row, k) when contiguous in k, else
 * A.row(k) and A.at(row, m); B.row(k), B.at(row, n). Out-of-range indices
 * never reach the loaders.
 */
#pragma once

#include <cstdint>

#include "gated_rnn/gated_rnn_launch.h"

namespace exphil::kernels {

inline constexpr int kGatedRnnGemmTileM = static_cast<int>(kGatedRnnWeightGradTile);
inline constexpr int kGatedRnnGemmTileN = static_cast<int>(kGatedRnnWeightGradTile);
inline constexpr int kGatedRnnGemmDepth = static_cast<int>(kGatedRnnWeightGradDepth);

// Store of split z's partial sums, [splits, M, N].
struct GatedRnnGemmPartialStore {
  float* partial;
  int64_t M, N;
  __device__ __forceinline__ void operator()(int z, int64_t m, int64_t n, float v) const {
    partial[(z * M + m) * N + n] = v;
  }
};

// Eight consecutive elements first + j of one prepared row of an operand,
// zeros where the row is not `live` or past `end`.
template <class Load>
__device__ __forceinline__ void gated_rnn_gemm_load8(const Load& load, const typename Load::Row& row,
                                                     bool live, int64_t first, int64_t end,
                                                     float (&out)[8]) {
#pragma unroll
  for (int j = 0; j < 8; ++j) out[j] = (live && first + j < end) ? load.at(row, first + j) : 0.0f;
}

template <class ALoad, class BLoad, class CStore>
__global__ void __launch_bounds__(kGatedRnnThreads)
    gated_rnn_gemm_kernel(int64_t M, int64_t N, int64_t K, int64_t k_per_split, const ALoad a,
                          const BLoad b, const CStore store) {
  constexpr int TM = kGatedRnnGemmTileM, TN = kGatedRnnGemmTileN, TK = kGatedRnnGemmDepth;
  static_assert(kGatedRnnThreads == 256 && TM == 128 && TN == 128 && TK == 16,
                "the thread mappings below assume 256 threads and 128 x 128 x 16 tiles");
  __shared__ __align__(16) float As[TK][TM + 4];
  __shared__ __align__(16) float Bs[TK][TN + 4];
  const int tid = static_cast<int>(threadIdx.x);
  const int tx = tid & 15, ty = tid >> 4;
  const int64_t m0 = static_cast<int64_t>(blockIdx.x) * TM;
  const int64_t n0 = static_cast<int64_t>(blockIdx.y) * TN;
  const int z = static_cast<int>(blockIdx.z);
  const int64_t k_begin = z * k_per_split;
  const int64_t k_end = k_begin + k_per_split < K ? k_begin + k_per_split : K;

  // Loads: 8 elements of A and 8 of B a thread per step of k. A contiguous
  // in k: row m0 + tid / 2, k (tid % 2) * 8 + j, its row prepared once.
  // A contiguous in m, and B: row k = tid / 16, columns (tid % 16) * 8 + j.
  constexpr bool kAk = ALoad::kContiguousK;
  const int a_fixed = kAk ? tid >> 1 : tid >> 4;
  const int a_first = kAk ? (tid & 1) * 8 : (tid & 15) * 8;
  const int b_k = tid >> 4, b_first = (tid & 15) * 8;
  typename ALoad::Row a_row{};
  const int64_t am = m0 + a_fixed;
  if constexpr (kAk)
    if (am < M) a_row = a.row(am);
  float ra[8], rb[8];
  const auto load = [&](int64_t k0) {
    if constexpr (kAk) {
      gated_rnn_gemm_load8(a, a_row, am < M, k0 + a_first, k_end, ra);
    } else {
      const int64_t k = k0 + a_fixed;
      gated_rnn_gemm_load8(a, k < k_end ? a.row(k) : typename ALoad::Row{}, k < k_end,
                           m0 + a_first, M, ra);
    }
    const int64_t k = k0 + b_k;
    gated_rnn_gemm_load8(b, k < k_end ? b.row(k) : typename BLoad::Row{}, k < k_end, n0 + b_first,
                         N, rb);
  };
  const auto stash = [&]() {
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      if constexpr (kAk)
        As[a_first + j][a_fixed] = ra[j];
      else
        As[a_fixed][a_first + j] = ra[j];
      Bs[b_k][b_first + j] = rb[j];
    }
  };

  // Outputs: rows ty*4 + i and 64 + ty*4 + i, columns tx*4 + j and
  // 64 + tx*4 + j (i, j < 4): float4 reads of shared memory, broadcast or
  // conflict-free.
  float acc[8][8];
#pragma unroll
  for (int i = 0; i < 8; ++i)
#pragma unroll
    for (int j = 0; j < 8; ++j) acc[i][j] = 0.0f;
  // A warp's outputs lie in rows m0 + 8w .. + 7 and m0 + 64 + 8w .. + 7: a
  // warp whose first row is past M has only zeros to sum and skips its
  // FMAs (at B1 T32 the recompute product's single row of tiles is a
  // quarter live).
  const bool rows_live = m0 + 8 * (tid >> 5) < M;
  if (k_begin < k_end) load(k_begin);
  for (int64_t k0 = k_begin; k0 < k_end; k0 += TK) {
    __syncthreads();  // the previous step's reads of As, Bs are done
    stash();
    __syncthreads();
    if (k0 + TK < k_end) load(k0 + TK);  // in flight while this step multiplies
    if (!rows_live) continue;
#pragma unroll
    for (int kk = 0; kk < TK; ++kk) {
      float av[8], bv[8];
      const float4 a0 = *reinterpret_cast<const float4*>(&As[kk][ty * 4]);
      const float4 a1 = *reinterpret_cast<const float4*>(&As[kk][64 + ty * 4]);
      const float4 b0 = *reinterpret_cast<const float4*>(&Bs[kk][tx * 4]);
      const float4 b1 = *reinterpret_cast<const float4*>(&Bs[kk][64 + tx * 4]);
      av[0] = a0.x, av[1] = a0.y, av[2] = a0.z, av[3] = a0.w;
      av[4] = a1.x, av[5] = a1.y, av[6] = a1.z, av[7] = a1.w;
      bv[0] = b0.x, bv[1] = b0.y, bv[2] = b0.z, bv[3] = b0.w;
      bv[4] = b1.x, bv[5] = b1.y, bv[6] = b1.z, bv[7] = b1.w;
#pragma unroll
      for (int i = 0; i < 8; ++i)
#pragma unroll
        for (int j = 0; j < 8; ++j) acc[i][j] = fmaf(av[i], bv[j], acc[i][j]);
    }
  }
#pragma unroll
  for (int i = 0; i < 8; ++i)
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      const int64_t m = m0 + (i < 4 ? ty * 4 + i : 64 + ty * 4 + i - 4);
      const int64_t n = n0 + (j < 4 ? tx * 4 + j : 64 + tx * 4 + j - 4);
      if (m < M && n < N) store(z, m, n, acc[i][j]);
    }
}

// Adds the splits' partial sums of each output in split order and stores.
template <class CStore>
__global__ void __launch_bounds__(kGatedRnnThreads)
    gated_rnn_gemm_reduce_kernel(int64_t M, int64_t N, int splits, const float* partial,
                                 const CStore store) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < M * N;
       i += stride) {
    float v = 0.0f;
    for (int z = 0; z < splits; ++z) v += partial[z * M * N + i];
    store(0, i / N, i % N, v);
  }
}

}  // namespace exphil::kernels
