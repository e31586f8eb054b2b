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
 * For bf16 and f16 sequences, and f32 ones at precision tf32, the same
 * products run on tensor cores (gated_rnn_gemm_tc_kernel, below) unless the
 * plan says otherwise (GatedRnnPlan::gemm_tensor_cores). Both kernels share
 * the tiles, the loads and the k loop (GatedRnnGemmTile). Where both
 * operands are bf16 or f32 rows that 16-byte copies can take,
 * gated_rnn_gemm_async_kernel (below) gives the tensor-core kernel's sums
 * from asynchronous copies.
 *
 * Loader contract: A::kContiguousK says whether A's elements of one m are
 * contiguous in k (a row-major [M, K] operand) or those of one k contiguous
 * in m ([K, M]). A.row(m) and A.at(row, k) when contiguous in k, else
 * A.row(k) and A.at(row, m); B.row(k), B.at(row, n); at8(row, i, v) the
 * eight elements from i, all in range; for the tensor-core kernel also
 * bf16_exact(), true where every element is a bf16 value. Out-of-range
 * indices never reach the loaders.
 */
#pragma once

#include <cstdint>
#include <type_traits>
#include <utility>

#include <cuda_bf16.h>

#include "common/cp_async.cuh"
#include "common/mma_m16n8k16.cuh"
#include "gated_rnn/gated_rnn_common.cuh"
#include "gated_rnn/gated_rnn_launch.h"

namespace exphil::kernels {

inline constexpr int kGatedRnnGemmTileM = static_cast<int>(kGatedRnnWeightGradTile);
inline constexpr int kGatedRnnGemmTileN = static_cast<int>(kGatedRnnWeightGradTile);
inline constexpr int kGatedRnnGemmDepth = static_cast<int>(kGatedRnnWeightGradDepth);

// A store takes an output's sum: operator()(z, m, n, v), z the split. It
// may also offer, each optional:
//   column_addend(n)        a term every sum of column n takes (a bias): the
//                           epilogues read a thread's columns' terms once,
//                           before any store, and pass v with the term added
//                           (v + term). Read inside the store, each waited for
//                           the store before it, which might alias it: 64
//                           round trips to L1 in a row a thread. Waits on
//                           loads outside the k loop were 29% of the
//                           recompute product's stall samples at B32 T64 H256
//                           (bench/RESULTS.md, issue 30 run CI), 17.3 us a
//                           product before, 13.2 after (run CJ);
//   pairs(), pair(z, m, n, v0, v1)
//                           outputs (m, n) and (m, n + 1), n even, in one
//                           store where pairs() says the rows allow it (N
//                           even, aligned): half the store instructions,
//                           whose queue held up the weight gradient's
//                           epilogue (stall_lg, run CI; 25.3 us a product
//                           before, 19.4 after, run CJ).
template <class S, class = void>
struct GatedRnnStoreColumnAddend : std::false_type {};
template <class S>
struct GatedRnnStoreColumnAddend<
    S, std::void_t<decltype(std::declval<const S&>().column_addend(int64_t{}))>> : std::true_type {};
template <class S, class = void>
struct GatedRnnStorePairs : std::false_type {};
template <class S>
struct GatedRnnStorePairs<S, std::void_t<decltype(std::declval<const S&>().pairs())>>
    : std::true_type {};

template <class S>
__device__ __forceinline__ float gated_rnn_column_addend(const S& store, int64_t n) {
  if constexpr (GatedRnnStoreColumnAddend<S>::value)
    return store.column_addend(n);
  else
    return 0.0f;
}
// v with its column's term (none: v itself, -0 kept).
template <class S>
__device__ __forceinline__ float gated_rnn_with_addend(float v, float addend) {
  if constexpr (GatedRnnStoreColumnAddend<S>::value)
    return v + addend;
  else
    return v;
}
template <class S>
__device__ __forceinline__ bool gated_rnn_store_pairs(const S& store) {
  if constexpr (GatedRnnStorePairs<S>::value)
    return store.pairs();
  else
    return false;
}

// Outputs (m, n) and (m, n + 1) of a row within M, n even: one store where
// `paired` (gated_rnn_store_pairs) and both columns are within N, else each
// within N on its own.
template <class S>
__device__ __forceinline__ void gated_rnn_gemm_store2(const S& store, bool paired, int z, int64_t m,
                                                      int64_t n, int64_t N, float v0, float v1) {
  if constexpr (GatedRnnStorePairs<S>::value)
    if (paired && n + 1 < N) {
      store.pair(z, m, n, v0, v1);
      return;
    }
  if (n < N) store(z, m, n, v0);
  if (n + 1 < N) store(z, m, n + 1, v1);
}

// Store of split z's partial sums, [splits, M, N].
struct GatedRnnGemmPartialStore {
  float* partial;
  int64_t M, N;
  __device__ __forceinline__ void operator()(int z, int64_t m, int64_t n, float v) const {
    partial[(z * M + m) * N + n] = v;
  }
  __device__ __forceinline__ bool pairs() const { return gated_rnn_elem_pairs(partial, N); }
  __device__ __forceinline__ void pair(int z, int64_t m, int64_t n, float v0, float v1) const {
    VecIO<float, 2>::store(partial + (z * M + m) * N + n, {v0, v1});
  }
};

// Eight consecutive elements first + j of one prepared row of an operand,
// zeros where the row is not `live` or past `end`. Whole runs go through the
// loader's at8, which takes its branches once so that the eight loads fly
// together; at() a load at a time behind its branch left the tensor-core
// product waiting on memory (bench/RESULTS.md, issue 30 run AD).
template <class Load>
__device__ __forceinline__ void gated_rnn_gemm_load8(const Load& load, const typename Load::Row& row,
                                                     bool live, int64_t first, int64_t end,
                                                     float (&out)[8]) {
  if (live && first + 8 <= end) {
    load.at8(row, first, out);
    return;
  }
#pragma unroll
  for (int j = 0; j < 8; ++j) out[j] = (live && first + j < end) ? load.at(row, first + j) : 0.0f;
}

// A block's tile of outputs (blockIdx.x, .y), its slice of k (split
// blockIdx.z), and a thread's share of each step of 16 * kRuns along k:
// kRuns runs of 8 elements of A and of B. A contiguous in k: row m0 + tid / 2
// at k (tid % 2) * 8 kRuns, the row prepared once; A contiguous in m, and
// B: row k = tid / (16 / kRuns) at (tid % (16 / kRuns)) * 8 kRuns.
template <int kRuns, class ALoad, class BLoad>
struct GatedRnnGemmTile {
  static constexpr int kSpan = 8 * kRuns;
  static constexpr int kLanes = kGatedRnnGemmTileN / kSpan;  // threads along a row of m or n
  static_assert(kGatedRnnThreads == 256 && kGatedRnnGemmTileM == 128 && kGatedRnnGemmTileN == 128,
                "the mapping assumes 256 threads and 128 x 128 tiles");
  int64_t m0, n0, k_begin, k_end;
  int z, a_fixed, a_first, b_k, b_first;
  bool a_live = false;  // A contiguous in k: its row within M
  typename ALoad::Row a_row{};

  __device__ __forceinline__ GatedRnnGemmTile(const ALoad& a, int64_t M, int64_t K,
                                              int64_t k_per_split) {
    const unsigned tid = threadIdx.x;  // (unsigned: the divisions below are shifts)
    m0 = static_cast<int64_t>(blockIdx.x) * kGatedRnnGemmTileM;
    n0 = static_cast<int64_t>(blockIdx.y) * kGatedRnnGemmTileN;
    z = static_cast<int>(blockIdx.z);
    k_begin = z * k_per_split;
    k_end = k_begin + k_per_split < K ? k_begin + k_per_split : K;
    a_fixed = static_cast<int>(ALoad::kContiguousK ? tid / 2 : tid / kLanes);
    a_first = static_cast<int>(ALoad::kContiguousK ? tid % 2 * kSpan : tid % kLanes * kSpan);
    b_k = static_cast<int>(tid / kLanes), b_first = static_cast<int>(tid % kLanes * kSpan);
    a_live = m0 + a_fixed < M;
    if constexpr (ALoad::kContiguousK)
      if (a_live) a_row = a.row(m0 + a_fixed);
  }

  // The k loop: this thread's loads of the next step in registers while
  // the block multiplies this one; stash() moves a step's loads to shared
  // memory, multiply() (where `live`) takes its products from there.
  template <class Load, class Stash, class Multiply>
  __device__ __forceinline__ void steps(bool live, const Load& load, const Stash& stash,
                                        const Multiply& multiply) const {
    constexpr int kDepth = 16 * kRuns;
    if (k_begin < k_end) load(k_begin);
    for (int64_t k0 = k_begin; k0 < k_end; k0 += kDepth) {
      __syncthreads();  // the previous step's reads of shared memory are done
      stash();
      __syncthreads();
      if (k0 + kDepth < k_end) load(k0 + kDepth);
      if (live) multiply();
    }
  }

  // The step from k0 of A [M, K] (or [K, M]) and B [K, N].
  __device__ __forceinline__ void load(const ALoad& a, const BLoad& b, int64_t M, int64_t N,
                                       int64_t k0, float (&ra)[kSpan], float (&rb)[kSpan]) const {
    const int64_t ka = k0 + a_fixed, kb = k0 + b_k;
    const typename BLoad::Row brow = kb < k_end ? b.row(kb) : typename BLoad::Row{};
#pragma unroll
    for (int r = 0; r < kRuns; ++r) {
      float(&ar)[8] = *reinterpret_cast<float(*)[8]>(&ra[8 * r]);
      if constexpr (ALoad::kContiguousK) {
        gated_rnn_gemm_load8(a, a_row, a_live, k0 + a_first + 8 * r, k_end, ar);
      } else {
        const typename ALoad::Row arow = ka < k_end ? a.row(ka) : typename ALoad::Row{};
        gated_rnn_gemm_load8(a, arow, ka < k_end, m0 + a_first + 8 * r, M, ar);
      }
    }
#pragma unroll
    for (int r = 0; r < kRuns; ++r) {
      float(&br)[8] = *reinterpret_cast<float(*)[8]>(&rb[8 * r]);
      gated_rnn_gemm_load8(b, brow, kb < k_end, n0 + b_first + 8 * r, N, br);
    }
  }
};

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
  constexpr bool kAk = ALoad::kContiguousK;
  const GatedRnnGemmTile<1, ALoad, BLoad> tile(a, M, K, k_per_split);
  const int64_t m0 = tile.m0, n0 = tile.n0;
  const int z = tile.z, a_fixed = tile.a_fixed, a_first = tile.a_first, b_k = tile.b_k,
            b_first = tile.b_first;
  float ra[8], rb[8];
  const auto load = [&](int64_t k0) { tile.load(a, b, M, N, k0, ra, rb); };
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
  tile.steps(rows_live, load, stash, [&]() {
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
  });
  // Rows m0 + ty * 4 + i and columns n0 + tx * 4 + j, each 4 of them and
  // the 4 after 64 more; the columns' terms first (the store's protocol,
  // above).
  const auto column = [&](int j) { return n0 + (j < 4 ? tx * 4 + j : 64 + tx * 4 + j - 4); };
  float addend[8];
#pragma unroll
  for (int j = 0; j < 8; ++j) addend[j] = column(j) < N ? gated_rnn_column_addend(store, column(j)) : 0.0f;
  const bool paired = gated_rnn_store_pairs(store);
#pragma unroll
  for (int i = 0; i < 8; ++i) {
    const int64_t m = m0 + (i < 4 ? ty * 4 + i : 64 + ty * 4 + i - 4);
    if (m >= M) continue;
#pragma unroll
    for (int j = 0; j < 8; j += 2)
      gated_rnn_gemm_store2(store, paired, z, m, column(j), N,
                            gated_rnn_with_addend<CStore>(acc[i][j], addend[j]),
                            gated_rnn_with_addend<CStore>(acc[i][j + 1], addend[j + 1]));
  }
}

// ---------------------------------------------------------------------------
// The same products on tensor cores, for bf16 and f16 sequences and f32
// ones at precision tf32 (the launcher's choice): same loaders, stores,
// tiles of 128 x 128 and split along k, so every caller takes either.
//
// Why. On CUDA cores the two products ran at 13 to 24 TFLOP/s and took 4.1
// of the LSTM's 9.0 ms backward at B64 T256 H512 bf16 on an H100; on
// tensor cores that backward takes 0.84 to 0.89x of its time on CUDA
// cores (bench/RESULTS.md, issue 30 runs AD, AF and AG).
//
// Precision. Every operand element, as its loader gives it in f32, is
// split into the nearest bf16 and the bf16 rounding of what is left (f16
// would flush small gradients), and a product is big x big + big x rest +
// rest x big in f32 (m16n8k16, common/mma_m16n8k16.cuh): about 16 bits of
// each operand, all of an f16 or bf16 input (y, R, h0 in the sequence's
// dtype), and of an f32 one (grad_rh, f32 weights or states) 2^-16 or so
// relative, far inside a 16-bit sequence's tolerances; the terms left out
// (rest x rest) are below 2^-16 of the product. An operand whose loader
// says bf16_exact() (every element a bf16 value) has no rest, and its pass
// is left out, the sums unchanged: in a bf16 sequence with bf16 weights
// the recompute product is one pass, and so is grad_R's, whose grad_rh the
// walk then stores as bf16 (GatedRnnPlan::grad_rh_bf16). That rounding is
// a choice: where grad_R and grad_bias land in bf16, each term h g errs by
// at most 2^-9 of itself, signs mixed over B*T terms, beside the store's
// rounding of the sum by up to 2^-9; the tolerances judge grad_R against
// the sum of its terms' magnitudes for that reason
// (test/gpu/test_gated_rnn.cpp). grad_rh's rest had added 39 to 41% to
// that product's time (LSTM and GRU bf16 B64 T256 H512, bench/RESULTS.md,
// issue 30 run DC).
//
// Algorithm. 256 threads in 8 warps of 64 x 32 outputs (4 x 4 instruction
// tiles, 64 f32 accumulators a thread). k in steps of 32: each thread loads
// 16 elements of A and 16 of B for the next step into registers while the
// tensor cores work on this one (a step is 96 instructions a warp, about as
// long as a global load takes), then stores their two halves to shared
// memory, where ldmatrix (.trans for k-major tiles) fetches the fragments;
// rows padded by 8 elements so that the 8 rows of an 8 x 8 matrix fall in
// distinct banks. Each output's sum runs over k in increasing order: bitwise
// reproducible.
inline constexpr int kGatedRnnGemmTcDepth = 32;

__device__ __forceinline__ uint32_t gated_rnn_smem_address(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// Two f32 values as the nearest bf16 pair.
__device__ __forceinline__ uint32_t gated_rnn_nearest2(float v0, float v1) {
  const __nv_bfloat162 hb = __floats2bfloat162_rn(v0, v1);
  return *reinterpret_cast<const uint32_t*>(&hb);
}

// Two f32 values as a bf16 pair, the nearest (big) and the nearest to
// what is left (rest).
__device__ __forceinline__ void gated_rnn_split2(float v0, float v1, uint32_t& big, uint32_t& rest) {
  big = gated_rnn_nearest2(v0, v1);
  const float2 hf = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&big));
  rest = gated_rnn_nearest2(v0 - hf.x, v1 - hf.y);
}

// Sixteen f32 values as bf16 pairs, big and (with_rest) rest, into two
// 32-byte runs.
__device__ __forceinline__ void gated_rnn_gemm_split16(const float (&v)[16], __nv_bfloat16* big,
                                                       __nv_bfloat16* rest, bool with_rest) {
  uint32_t b[8], r[8];
#pragma unroll
  for (int j = 0; j < 8; ++j) gated_rnn_split2(v[2 * j], v[2 * j + 1], b[j], r[j]);
  reinterpret_cast<uint4*>(big)[0] = make_uint4(b[0], b[1], b[2], b[3]);
  reinterpret_cast<uint4*>(big)[1] = make_uint4(b[4], b[5], b[6], b[7]);
  if (!with_rest) return;
  reinterpret_cast<uint4*>(rest)[0] = make_uint4(r[0], r[1], r[2], r[3]);
  reinterpret_cast<uint4*>(rest)[1] = make_uint4(r[4], r[5], r[6], r[7]);
}

template <bool kTrans>
__device__ __forceinline__ void gated_rnn_ldmatrix_x4(uint32_t (&r)[4], uint32_t address) {
  if constexpr (kTrans)
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(address));
  else
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(address));
}
template <bool kTrans>
__device__ __forceinline__ void gated_rnn_ldmatrix_x4(uint32_t (&r)[4], const void* p) {
  gated_rnn_ldmatrix_x4<kTrans>(r, gated_rnn_smem_address(p));
}

// A warp's 64 x 32 outputs from its 4 x 4 m16n8 accumulators, from row m0
// and column n0 (both kernels' epilogue).
template <class CStore>
__device__ __forceinline__ void gated_rnn_gemm_tc_store(const float (&acc)[4][4][4], int64_t m0, int64_t n0,
                                                        int lane, int64_t M, int64_t N, int z,
                                                        const CStore& store) {
  const int g = lane >> 2, t = lane & 3;
  // Accumulator e of tile (i, j): row 16 i + g + 8 (e >> 1), column 8 j + 2 t
  // + (e & 1). The columns' terms first (the store's protocol, above).
  float addend[4][2];
#pragma unroll
  for (int j = 0; j < 4; ++j)
#pragma unroll
    for (int c = 0; c < 2; ++c) {
      const int64_t n = n0 + j * 8 + 2 * t + c;
      addend[j][c] = n < N ? gated_rnn_column_addend(store, n) : 0.0f;
    }
  const bool paired = gated_rnn_store_pairs(store);
#pragma unroll
  for (int i = 0; i < 4; ++i)
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int64_t m = m0 + i * 16 + g + 8 * h;
      if (m >= M) continue;
#pragma unroll
      for (int j = 0; j < 4; ++j)
        gated_rnn_gemm_store2(store, paired, z, m, n0 + j * 8 + 2 * t, N,
                              gated_rnn_with_addend<CStore>(acc[i][j][2 * h], addend[j][0]),
                              gated_rnn_with_addend<CStore>(acc[i][j][2 * h + 1], addend[j][1]));
    }
}

template <class ALoad, class BLoad, class CStore>
__global__ void __launch_bounds__(kGatedRnnThreads)
    gated_rnn_gemm_tc_kernel(int64_t M, int64_t N, int64_t K, int64_t k_per_split, const ALoad a,
                             const BLoad b, const CStore store) {
  constexpr int TM = kGatedRnnGemmTileM, TN = kGatedRnnGemmTileN, TK = kGatedRnnGemmTcDepth;
  static_assert(kGatedRnnThreads == 256 && TM == 128 && TN == 128 && TK == 32,
                "the thread mappings below assume 256 threads and 128 x 128 x 32 tiles");
  constexpr bool kAk = ALoad::kContiguousK;
  // A as [m][k] rows (kAk) or [k][m] rows; B as [k][n] rows. Padded by 8.
  constexpr int kARows = kAk ? TM : TK, kALd = (kAk ? TK : TM) + 8, kBLd = TN + 8;
  __shared__ __align__(16) __nv_bfloat16 As[2][kARows][kALd];  // [big, rest]
  __shared__ __align__(16) __nv_bfloat16 Bs[2][TK][kBLd];
  const int tid = static_cast<int>(threadIdx.x);
  const int warp = tid >> 5, lane = tid & 31;
  const GatedRnnGemmTile<2, ALoad, BLoad> tile(a, M, K, k_per_split);
  const int64_t m0 = tile.m0, n0 = tile.n0;
  const int z = tile.z, a_fixed = tile.a_fixed, a_first = tile.a_first, b_k = tile.b_k,
            b_first = tile.b_first;
  float ra[16], rb[16];
  const auto load = [&](int64_t k0) { tile.load(a, b, M, N, k0, ra, rb); };
  // Operands of bf16 values have no rest (the same for the whole grid).
  const bool a_rest = !a.bf16_exact(), b_rest = !b.bf16_exact();
  const auto stash = [&]() {
    gated_rnn_gemm_split16(ra, &As[0][a_fixed][a_first], &As[1][a_fixed][a_first], a_rest);
    gated_rnn_gemm_split16(rb, &Bs[0][b_k][b_first], &Bs[1][b_k][b_first], b_rest);
  };

  // Warp (wm, wn) owns rows wm * 64 + [0, 64), columns wn * 32 + [0, 32).
  const int wm = warp >> 2, wn = warp & 3;
  const int q = lane >> 3, r8 = lane & 7;
  float acc[4][4][4] = {};
  const bool rows_live = m0 + wm * 64 < M;
  tile.steps(rows_live, load, stash, [&]() {
#pragma unroll
    for (int kk = 0; kk < TK; kk += 16) {
      uint32_t af[2][4][4], bf[2][4][2];
#pragma unroll
      for (int h = 0; h < 2; ++h) {
#pragma unroll
        for (int i = 0; i < 4; ++i) {
          if (h == 1 && !a_rest) break;
          const int mr = wm * 64 + i * 16;
          // Lane l addresses matrix l / 8's row l % 8: rows m (or k) and
          // the other index's offset as the fragment order a0..a3 needs.
          if constexpr (kAk)
            gated_rnn_ldmatrix_x4<false>(af[h][i], &As[h][mr + (q & 1) * 8 + r8][kk + (q >> 1) * 8]);
          else
            gated_rnn_ldmatrix_x4<true>(af[h][i], &As[h][kk + (q >> 1) * 8 + r8][mr + (q & 1) * 8]);
        }
#pragma unroll
        for (int j = 0; j < 4; j += 2) {
          if (h == 1 && !b_rest) break;
          uint32_t t4[4];
          gated_rnn_ldmatrix_x4<true>(t4, &Bs[h][kk + (q & 1) * 8 + r8][wn * 32 + j * 8 + (q >> 1) * 8]);
          bf[h][j][0] = t4[0], bf[h][j][1] = t4[1], bf[h][j + 1][0] = t4[2], bf[h][j + 1][1] = t4[3];
        }
      }
      // big x big, big x rest, rest x big: each pass over all 16 tiles,
      // so that an accumulator's next instruction is 16 away from its last
      // (back to back, each waited for the one before).
#pragma unroll
      for (int pass = 0; pass < 3; ++pass) {
        if ((pass == 1 && !b_rest) || (pass == 2 && !a_rest)) continue;
#pragma unroll
        for (int i = 0; i < 4; ++i)
#pragma unroll
          for (int j = 0; j < 4; ++j)
            MmaOp<__nv_bfloat16>::run(acc[i][j], af[pass == 2][i], bf[pass == 1][j][0],
                                      bf[pass == 1][j][1]);
      }
    }
  });
  gated_rnn_gemm_tc_store(acc, m0 + wm * 64, n0 + wn * 32, lane, M, N, z, store);
}

// ---------------------------------------------------------------------------
// The same tensor-core products from asynchronous copies, where A and B
// are each bf16 or f32 values in memory, in rows whose 16-byte runs are
// aligned: in a bf16 sequence with bf16 weights the recompute product
// h_{t-1} R, grad_R = [h_{t-1}; 1]^T grad_rh (B bf16, or f32 where the
// walk stores grad_rh in f32), and the stacks' products y W, grad_wx W^T
// and [y; 1]^T grad_wx; in an f32 sequence with f32 weights, where asked
// (GatedRnnLaunchOptions::f32_tensor_cores), the recompute product and
// grad_R with both operands f32.
//
// Why. The register-staged kernel above is latency-bound there: at B64
// T256 H512 bf16 its recompute product issued 0.15 warp instructions a
// scheduler a cycle, 85% of cycles with no eligible warp, most stalls on
// its global loads; one block of 172 registers a multiprocessor
// (bench/RESULTS.md, issue 30 run BG). Here cp.async copies each step's
// tiles straight to shared memory while the tensor cores work on the
// previous one, no registers hold them, and two blocks share a
// multiprocessor (the recompute product 4.1x faster there, run BI).
//
// Algorithm. The tile, warps, fragments and k steps of
// gated_rnn_gemm_tc_kernel, in two stages: at the top of step i a thread
// waits for its own copies of step i, the block's barrier publishes them
// all (and ends every read of step i - 1's stage), then the copies of step
// i + 1 go to the other stage and the warps multiply step i. A step's A
// tile is 512 runs of 8 bf16 (two a thread), B's 512 runs of 8 bf16 or
// 1024 of 4 f32; runs past M, N or the split's k end are zeros (cp.async's
// source size 0); an f32 A's tile is 1024 runs of 4 f32 likewise. A bf16
// B is one pass (big x big, as the register-staged kernel takes an operand
// with no rest); an f32 B is read from shared memory as f32 and split into
// its bf16 halves at the fragment, by the same arithmetic as
// gated_rnn_gemm_split16, for the passes big x big and big x rest. An f32
// A is split at the fragment too, an m-tile at a time (its halves for all
// four at once would not fit two blocks' registers), and adds the pass
// rest x big. Each output's sum takes big x big, big x rest, rest x big at
// every step of 16, as the register-staged kernel's does, by the same
// instructions: the two kernels' results are bitwise equal.
//
// Loader contract (besides the one above): kAsyncRows, whether the loader
// can give such rows at all (the kernel is instantiated only where both
// can); kF32Rows (optional), its elements f32; async_rows() (host),
// true where this call's rows qualify (bf16 or, kF32Rows, f32 elements;
// every 16-byte run the kernel copies aligned); src16(row, i) the address
// of the 16 bytes from element i of a prepared row (along k for an A
// contiguous in k, else along m; along n for B), or nullptr for zeros.
inline constexpr int kGatedRnnGemmAsyncStages = 2;

template <class Load, class = void>
struct GatedRnnGemmF32Rows : std::false_type {};
template <class Load>
struct GatedRnnGemmF32Rows<Load, std::void_t<decltype(Load::kF32Rows)>>
    : std::bool_constant<Load::kF32Rows> {};

// Shared memory of gated_rnn_gemm_async_kernel: two stages of A ([m][k]
// rows when kAk, else [k][m]; bf16 or f32) then two of B ([k][n], bf16 or
// f32), rows padded so that ldmatrix's 8 rows, and the f32 fragment reads,
// fall in distinct banks: an f32 [m][k] row by 8 floats (a half-warp's
// 8-byte reads of rows g, words 2t: 8 g + 2 t, distinct pairs), an f32
// [k][m] or [k][n] row by 4 (a warp's reads of rows 2t, word g: 8 t + g).
template <bool kAk, bool kAf32, bool kBf32>
struct GatedRnnGemmAsyncLayout {
  static constexpr int kARows = kAk ? kGatedRnnGemmTileM : kGatedRnnGemmTcDepth;
  static constexpr int kALd =
      (kAk ? kGatedRnnGemmTcDepth : kGatedRnnGemmTileM) + (kAf32 && !kAk ? 4 : 8);
  static constexpr int kBLd = kGatedRnnGemmTileN + (kBf32 ? 4 : 8);
  static constexpr int kAStage = kARows * kALd;                // A elements
  static constexpr int kBStage = kGatedRnnGemmTcDepth * kBLd;  // B elements
  static constexpr int kABytes = kGatedRnnGemmAsyncStages * kAStage * (kAf32 ? 4 : 2);
  static constexpr int kBytes =
      kABytes + kGatedRnnGemmAsyncStages * kBStage * (kBf32 ? 4 : 2);
};

// Sixteen bytes of ones (eight bf16, four f32), for the row of ones of an
// A that gives a bias's gradient ([h; 1]^T).
template <class Elem>
__device__ __forceinline__ const void* gated_rnn_ones16() {
  static_assert(std::is_same_v<Elem, __nv_bfloat16> || std::is_same_v<Elem, float>,
                "bf16 or f32 rows");
  static __device__ __align__(16) const unsigned short kBf16[8] = {0x3F80, 0x3F80, 0x3F80, 0x3F80,
                                                                   0x3F80, 0x3F80, 0x3F80, 0x3F80};
  static __device__ __align__(16) const float kF32[4] = {1.0f, 1.0f, 1.0f, 1.0f};
  if constexpr (std::is_same_v<Elem, float>)
    return kF32;
  else
    return kBf16;
}

// The 16 bytes from unit `unit` of a row of [h; 1]^T (the A of a weight
// gradient and its bias's) in Elem: h's units (units(unit), the run within
// H), the ones (unit == H), or zeros past them. H a multiple of the run
// (8 bf16, 4 f32): a run never straddles H.
template <class Elem, class Units>
__device__ __forceinline__ const void* gated_rnn_units_or_ones16(int64_t unit, int64_t H,
                                                                 const Units& units) {
  if (unit + static_cast<int64_t>(16 / sizeof(Elem)) <= H) return units(unit);
  return unit == H ? gated_rnn_ones16<Elem>() : nullptr;
}

template <class ALoad, class BLoad, class CStore>
__global__ void __launch_bounds__(kGatedRnnThreads, 2)
    gated_rnn_gemm_async_kernel(int64_t M, int64_t N, int64_t K, int64_t k_per_split,
                                const ALoad a, const BLoad b, const CStore store) {
  constexpr int TM = kGatedRnnGemmTileM, TN = kGatedRnnGemmTileN, TK = kGatedRnnGemmTcDepth;
  static_assert(kGatedRnnThreads == 256 && TM == 128 && TN == 128 && TK == 32,
                "the thread mappings below assume 256 threads and 128 x 128 x 32 tiles");
  constexpr bool kAk = ALoad::kContiguousK;
  constexpr bool kAf32 = GatedRnnGemmF32Rows<ALoad>::value;
  constexpr bool kBf32 = GatedRnnGemmF32Rows<BLoad>::value;
  using Layout = GatedRnnGemmAsyncLayout<kAk, kAf32, kBf32>;
  extern __shared__ float4 gemm_smem[];
  __nv_bfloat16* const As = reinterpret_cast<__nv_bfloat16*>(gemm_smem);
  unsigned char* const Bs = reinterpret_cast<unsigned char*>(gemm_smem) + Layout::kABytes;
  const auto a_at = [&](int s, int row, int col) {
    return As + s * Layout::kAStage + row * Layout::kALd + col;
  };
  const auto a32_at = [&](int s, int row, int col) {
    return reinterpret_cast<float*>(gemm_smem) + s * Layout::kAStage + row * Layout::kALd + col;
  };
  const auto b16_at = [&](int s, int k, int n) {
    return reinterpret_cast<__nv_bfloat16*>(Bs) + s * Layout::kBStage + k * Layout::kBLd + n;
  };
  const auto b32_at = [&](int s, int k, int n) {
    return reinterpret_cast<float*>(Bs) + s * Layout::kBStage + k * Layout::kBLd + n;
  };
  const int tid = static_cast<int>(threadIdx.x);
  const int warp = tid >> 5, lane = tid & 31;
  const int64_t m0 = static_cast<int64_t>(blockIdx.x) * TM;
  const int64_t n0 = static_cast<int64_t>(blockIdx.y) * TN;
  const int z = static_cast<int>(blockIdx.z);
  const int64_t k_begin = z * k_per_split;
  const int64_t k_end = k_begin + k_per_split < K ? k_begin + k_per_split : K;

  // A contiguous in k: rows tid / 4 + 64 i (i < 2), k at (tid % 4) * 8,
  // the rows prepared once; f32: rows tid / 8 + 32 i (i < 4), k at (tid %
  // 8) * 4. Else k rows tid / 16 + 16 i, m at (tid % 16) * 8; f32: k rows
  // tid / 32 + 8 i (i < 4), m at (tid % 32) * 4.
  constexpr int kARuns = kAf32 ? 4 : 2;
  constexpr int kARowStep = kAk ? (kAf32 ? 32 : 64) : (kAf32 ? 8 : 16);
  const int a_r = kAk ? (kAf32 ? tid >> 3 : tid >> 2) : (kAf32 ? tid >> 5 : tid >> 4);
  const int a_c = kAk ? (kAf32 ? (tid & 7) * 4 : (tid & 3) * 8)
                      : (kAf32 ? (tid & 31) * 4 : (tid & 15) * 8);
  typename ALoad::Row a_rows[kARuns]{};
  bool a_live[kARuns] = {};
  if constexpr (kAk) {
#pragma unroll
    for (int i = 0; i < kARuns; ++i) {
      a_live[i] = m0 + a_r + kARowStep * i < M;
      if (a_live[i]) a_rows[i] = a.row(m0 + a_r + kARowStep * i);
    }
  }
  const bool a_cols_live = kAk || m0 + a_c < M;
  // B: k rows tid / 16 and 16 + tid / 16, n at (tid % 16) * 8 (bf16); f32,
  // k rows tid / 32 + 8 i (i < 4), n at (tid % 32) * 4.
  constexpr int kBRuns = kBf32 ? 4 : 2, kBRowStep = kBf32 ? 8 : 16;
  const int b_r = kBf32 ? tid >> 5 : tid >> 4, b_n = kBf32 ? (tid & 31) * 4 : (tid & 15) * 8;
  const bool b_live = n0 + b_n < N;
  const auto a_dst = [&](int s, int row, int col) -> void* {
    if constexpr (kAf32)
      return a32_at(s, row, col);
    else
      return a_at(s, row, col);
  };
  const auto copy = [&](int s, int64_t k0) {
#pragma unroll
    for (int i = 0; i < kARuns; ++i) {
      if constexpr (kAk) {
        const int64_t k = k0 + a_c;
        cp_async16_or_zeros(a_dst(s, a_r + kARowStep * i, a_c),
                             a_live[i] && k < k_end ? a.src16(a_rows[i], k) : nullptr);
      } else {
        const int64_t k = k0 + a_r + kARowStep * i;
        cp_async16_or_zeros(a_dst(s, a_r + kARowStep * i, a_c),
                             a_cols_live && k < k_end ? a.src16(a.row(k), m0 + a_c) : nullptr);
      }
    }
#pragma unroll
    for (int i = 0; i < kBRuns; ++i) {
      const int kr = b_r + kBRowStep * i;
      const int64_t k = k0 + kr;
      const void* src = b_live && k < k_end ? b.src16(b.row(k), n0 + b_n) : nullptr;
      if constexpr (kBf32)
        cp_async16_or_zeros(b32_at(s, kr, b_n), src);
      else
        cp_async16_or_zeros(b16_at(s, kr, b_n), src);
    }
    cp_async_commit();
  };

  const int wm = warp >> 2, wn = warp & 3;
  const int q = lane >> 3, r8 = lane & 7, g = lane >> 2, t = lane & 3;
  float acc[4][4][4] = {};
  const bool rows_live = m0 + wm * 64 < M;
  if (k_begin < k_end) copy(0, k_begin);
  int s = 0;
  for (int64_t k0 = k_begin; k0 < k_end; k0 += TK, s ^= 1) {
    cp_async_wait<0>();  // (every group is committed)
    __syncthreads();
    if (k0 + TK < k_end) copy(s ^ 1, k0 + TK);
    if (!rows_live) continue;
#pragma unroll
    for (int kk = 0; kk < TK; kk += 16) {
      uint32_t bf[2][4][2];                     // B: [big, rest]
      [[maybe_unused]] uint32_t af[4][4];  // a bf16 A's (an f32 A: split below)
      if constexpr (!kAf32) {
#pragma unroll
        for (int i = 0; i < 4; ++i) {
          const int mr = wm * 64 + i * 16;
          if constexpr (kAk)
            gated_rnn_ldmatrix_x4<false>(af[i], a_at(s, mr + (q & 1) * 8 + r8, kk + (q >> 1) * 8));
          else
            gated_rnn_ldmatrix_x4<true>(af[i], a_at(s, kk + (q >> 1) * 8 + r8, mr + (q & 1) * 8));
        }
      }
      if constexpr (kBf32) {
        // The fragment's elements (k 2t, 2t + 1 and 2t + 8, 2t + 9 of
        // column g) as f32, split as the register-staged kernel splits them.
#pragma unroll
        for (int j = 0; j < 4; ++j)
#pragma unroll
          for (int h = 0; h < 2; ++h) {
            const float* col = b32_at(s, kk + 2 * t + 8 * h, wn * 32 + j * 8 + g);
            gated_rnn_split2(col[0], col[Layout::kBLd], bf[0][j][h], bf[1][j][h]);
          }
      } else {
#pragma unroll
        for (int j = 0; j < 4; j += 2) {
          uint32_t t4[4];
          gated_rnn_ldmatrix_x4<true>(t4, b16_at(s, kk + (q & 1) * 8 + r8, wn * 32 + j * 8 + (q >> 1) * 8));
          bf[0][j][0] = t4[0], bf[0][j][1] = t4[1], bf[0][j + 1][0] = t4[2], bf[0][j + 1][1] = t4[3];
        }
      }
      if constexpr (kAf32) {
        // An m-tile's fragment (a0..a3: rows g + 8 (e & 1), k 2t + 8 (e >> 1)
        // and the next) as f32, split, then its three passes.
#pragma unroll
        for (int i = 0; i < 4; ++i) {
          const int mr = wm * 64 + i * 16;
          uint32_t big[4], rest[4];
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            const int m = mr + g + 8 * (e & 1), k = kk + 2 * t + 8 * (e >> 1);
            float2 v;
            if constexpr (kAk)
              v = *reinterpret_cast<const float2*>(a32_at(s, m, k));
            else
              v = make_float2(*a32_at(s, k, m), *a32_at(s, k + 1, m));
            gated_rnn_split2(v.x, v.y, big[e], rest[e]);
          }
#pragma unroll
          for (int j = 0; j < 4; ++j) {
            MmaOp<__nv_bfloat16>::run(acc[i][j], big, bf[0][j][0], bf[0][j][1]);
            if constexpr (kBf32) MmaOp<__nv_bfloat16>::run(acc[i][j], big, bf[1][j][0], bf[1][j][1]);
            MmaOp<__nv_bfloat16>::run(acc[i][j], rest, bf[0][j][0], bf[0][j][1]);
          }
        }
      } else {
        // big x big, then (an f32 B) big x rest, each over all 16 tiles: the
        // register-staged kernel's passes in its order.
#pragma unroll
        for (int pass = 0; pass < (kBf32 ? 2 : 1); ++pass)
#pragma unroll
          for (int i = 0; i < 4; ++i)
#pragma unroll
            for (int j = 0; j < 4; ++j)
              MmaOp<__nv_bfloat16>::run(acc[i][j], af[i], bf[pass][j][0], bf[pass][j][1]);
      }
    }
  }
  gated_rnn_gemm_tc_store(acc, m0 + wm * 64, n0 + wn * 32, lane, M, N, z, store);
}

// Whether a loader can feed gated_rnn_gemm_async_kernel (its kAsyncRows;
// the launcher then asks async_rows() of the call's tensors).
template <class Load, class = void>
struct GatedRnnGemmAsyncLoader : std::false_type {};
template <class Load>
struct GatedRnnGemmAsyncLoader<Load, std::void_t<decltype(Load::kAsyncRows)>>
    : std::bool_constant<Load::kAsyncRows> {};

// Adds the splits' partial sums of each output in split order and stores.
template <class CStore>
__global__ void __launch_bounds__(kGatedRnnThreads)
    gated_rnn_gemm_reduce_kernel(int64_t M, int64_t N, int splits, const float* partial,
                                 const CStore store) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < M * N;
       i += stride) {
    const int64_t n = i % N;
    float v = 0.0f;
    for (int z = 0; z < splits; ++z) v += partial[z * M * N + i];
    store(0, i / N, n, gated_rnn_with_addend<CStore>(v, gated_rnn_column_addend(store, n)));
  }
}

}  // namespace exphil::kernels
