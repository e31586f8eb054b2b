/*
 * The backward's reverse walk (gated_rnn_backward.cuh), its part product on
 * tensor cores: part[b, k] = sum_c grad_rh[b, c] R[k, c] over the block's
 * slice of columns c, for the tile's rows b and every output k < H.
 *
 * Algorithm. The product is taken transposed, part^T[k, b] = sum_c W^T[k,
 * c] g[c, b], in m16n8k16 instructions (common/mma_m16n8k16.cuh): the
 * slice's H outputs k on the instruction's 16-row side, the tile's rows b
 * on its 8-column side, the slice's columns c along its depth of 16. R is
 * bf16 (the plan takes this with bf16 weights), exact in one pass;
 * grad_rh (f32) is split into its nearest bf16 and the bf16 of the rest
 * (gated_rnn_split2), two passes, about 16 bits of it, each sum in f32.
 * f32 weights, where asked (kSplit: GatedRnnLaunchOptions::
 * f32_tensor_cores), are split the same way when the slice is loaded, and
 * a third pass multiplies R's rests by big(g): W x big(g), W x rest(g),
 * rest(W) x big(g), about 16 bits of each operand (TF32 keeps 11; the
 * dropped rest(W) x rest(g) is below 2^-16 of a product).
 * Each warp takes k tiles warp, warp + 8, ... (four at a time: 16
 * accumulators a thread), the rows in tiles of 8, c in steps of 16 in
 * increasing order, each step's passes in the order above: every sum in
 * a fixed order, bitwise reproducible.
 *
 * Why. Timed from inside (bench/RESULTS.md, issue 30 runs BN and BP), the
 * CUDA-core part product is half of the GRU's step at B64 T256 H512 bf16,
 * 2.8x its multiply-adds' floor: two warps a scheduler cannot hide its
 * latency. Run AX's tensor-core version put the tile's rows on the 16-row
 * side (half of it zeros at 8 rows) and took three passes over bf16 halves
 * of both operands: no faster. Here, at B64 H512 (GRU: 8 rows x 96 columns
 * x 512), a block takes 32 x 6 x 2 = 384 instructions a step, 48 a warp,
 * where the CUDA cores took about 2,100 instructions a warp. Measured
 * (runs BR and BS, H200): the walk at B64 T256 H512 bf16 took 2.33 ms
 * against 2.96 (GRU) and, its bf16 slice letting the LSTM take 32 units a
 * block in 8 groups, 2.67 against 4.33; in tiles of 4 rows (B32 H256) it
 * was 4 to 8% slower than on CUDA cores, hence the limit below.
 *
 * Layout. The slice, loaded once and transposed: As[k][c] = R[k, g*H + u0 +
 * u] for the slice's column c = g*U + u, bf16 [K16][ld] (gated_rnn_launch.h:
 * K16 = H rounded up to 16, ld the stored columns rounded up to 16 plus 8,
 * an odd number of 16-byte units a row, so the 8 rows an ldmatrix reads
 * fall in distinct banks); zeros past the live units, past H and in the
 * padding; with kSplit the rests' array of the same shape right after it
 * (gated_rnn_walk_tc_array_floats further on). grad_rh of the slice as the
 * CUDA-core product takes it, f32 [C, rows].
 *
 * Limits. Tiles of 8 rows or more (kGatedRnnWalkTcMinTile; a group's last
 * tile may have fewer, its missing rows zeros); the slice and the rest of
 * the walk's shared memory within the block's.
 */
#pragma once

#include <cstdint>
#include <type_traits>

#include <cuda_bf16.h>

#include "common/mma_m16n8k16.cuh"
#include "gated_rnn/gated_rnn_common.cuh"
#include "gated_rnn/gated_rnn_gemm.cuh"
#include "gated_rnn/gated_rnn_launch.h"

namespace exphil::kernels {

// R's element as As's words: bf16 R's own; f32 R's nearest bf16 (low
// half) and the bf16 of what it leaves (high half).
__device__ __forceinline__ uint32_t gated_rnn_walk_tc_words(uint16_t v) { return v; }
__device__ __forceinline__ uint32_t gated_rnn_walk_tc_words(float v) {
  uint32_t big, rest;
  gated_rnn_split2(v, 0.0f, big, rest);
  return (big & 0xffffu) | (rest << 16);
}

// As (above) from R [H, G*H] (bf16, or f32 into the two arrays): a lane
// takes columns lane, lane + 32, ... (one division each), the warps the
// rows k, kGatedRnnLoadsInFlight of them at a time (gated_rnn_common.cuh
// says why): reads along R's units, stores along As's rows.
template <class Stored>
__device__ __forceinline__ void gated_rnn_load_slice_transposed(__nv_bfloat16* __restrict__ As,
                                                                const Stored* r, int G, int H,
                                                                int U, int u0, int live, int C) {
  static_assert(std::is_same_v<Stored, uint16_t> || std::is_same_v<Stored, float>,
                "bf16 or f32 weights");
  constexpr bool kSplit = std::is_same_v<Stored, float>;
  constexpr int kRound = kGatedRnnLoadsInFlight;
  const int ld = static_cast<int>(gated_rnn_walk_tc_ld(C));
  const int rows = static_cast<int>(gated_rnn_walk_tc_rows(H));
  const int64_t GH = static_cast<int64_t>(G) * H;
  const int lane = static_cast<int>(threadIdx.x) & 31, warp = static_cast<int>(threadIdx.x) >> 5;
  const int warps = static_cast<int>(blockDim.x) >> 5;
  uint16_t* const as = reinterpret_cast<uint16_t*>(As);
  // The rests' array (kSplit), in 16-bit words from As.
  const int64_t rests = gated_rnn_walk_tc_array_floats(C, H) * 2;
  for (int c = lane; c < ld; c += 32) {
    const int g = c / U, u = c - g * U;
    const bool in = g < G && u < live;
    const Stored* const src = r + (in ? static_cast<int64_t>(g) * H + u0 + u : 0);
    for (int k0 = warp; k0 < rows; k0 += warps * kRound) {
      uint32_t v[kRound];
#pragma unroll
      for (int j = 0; j < kRound; ++j) {
        const int k = k0 + warps * j;
        v[j] = in && k < H ? gated_rnn_walk_tc_words(src[k * GH]) : 0u;
      }
#pragma unroll
      for (int j = 0; j < kRound; ++j)
        if (k0 + warps * j < rows) {
          uint16_t* const at = as + (k0 + warps * j) * ld + c;
          at[0] = static_cast<uint16_t>(v[j]);
          if constexpr (kSplit) at[rests] = static_cast<uint16_t>(v[j] >> 16);
        }
    }
  }
}

// part[b, k] for b < nb and k < K, rows b and b + 1 handed together,
// publish(b, k, row b's, row b + 1's) for even b (row b + 1's meaningless
// past nb: the consumer drops it), from
// g [C, rows] (rows a power of two, below 8 only in a group's last tile;
// zeros past nb and past the live columns) and As (kSplit: and its rests).
template <bool kSplit, class Publish>
__device__ __forceinline__ void gated_rnn_part_product_tc(int rows, const float* __restrict__ g,
                                                          int C, const __nv_bfloat16* As, int K,
                                                          int nb, const Publish& publish) {
  constexpr int kWarps = kGatedRnnThreads / 32;
  constexpr int kMTiles = 4;  // accumulators: 16 a thread
  const int ld = static_cast<int>(gated_rnn_walk_tc_ld(C));
  const int depth = static_cast<int>(gated_rnn_walk_tc_depth(C));
  const int mtiles = static_cast<int>(gated_rnn_walk_tc_rows(K) / 16);
  const int warp = static_cast<int>(threadIdx.x) >> 5, lane = static_cast<int>(threadIdx.x) & 31;
  const int gq = lane >> 2, t = lane & 3;
  const int q = lane >> 3, r8 = lane & 7;  // ldmatrix: the matrix and row this lane addresses
  // This lane's ldmatrix address in As at m-tile 0 and k0 = 0, converted to
  // a shared-window address once (converted where used, the k loop read
  // the block's shared window, S2R, on every pass: run CY's ncu); m-tile
  // mt's is tile_bytes * mt further on.
  const uint32_t as_lane = gated_rnn_smem_address(As + ((q & 1) * 8 + r8) * ld + (q >> 1) * 8);
  const uint32_t tile_bytes = 16u * static_cast<uint32_t>(ld) * sizeof(__nv_bfloat16);
  const uint32_t rests_bytes =
      static_cast<uint32_t>(gated_rnn_walk_tc_array_floats(C, K)) * sizeof(float);
  // Every column of g a k-step reads is below C, and every lane's row
  // below rows: C a multiple of 16 and 8 rows or more.
  const bool whole = C % 16 == 0 && rows >= 8;
  for (int n0 = 0; n0 < rows; n0 += 8) {
    const float* const gb = g + n0 + gq;  // column b = n0 + gq of B = g
    const int live_c = n0 + gq < rows ? C : 0;  // a tile of fewer than 8 rows: zeros past them
    for (int mt0 = warp; mt0 < mtiles; mt0 += kWarps * kMTiles) {
      float acc[kMTiles][4] = {};
      const uint32_t a_tile0 = as_lane + static_cast<uint32_t>(mt0) * tile_bytes;
      // kUnchecked: g whole (above) and every one of the warp's kMTiles
      // m-tiles below mtiles (every warp at H = 512), so the k loop checks
      // neither: without the m-tiles' check the bf16 walks at B64 H512
      // took 10 to 12% less (issue 30 run CX).
      const auto multiply = [&](auto unchecked) {
        constexpr bool kUnchecked = decltype(unchecked)::value;
        // B: b0 = (c k0 + 2t, + 1), b1 = (c k0 + 2t + 8, + 9), column gq;
        // gk at column k0 + 2t.
        const float* gk = gb + 2 * t * rows;
        for (int k0 = 0; k0 < depth; k0 += 16, gk += 16 * rows) {
          float v0, v1, v2, v3;
          if constexpr (kUnchecked) {
            v0 = gk[0];
            v1 = gk[rows];
            v2 = gk[8 * rows];
            v3 = gk[9 * rows];
          } else {
            const int c0 = k0 + 2 * t;
            v0 = c0 < live_c ? gk[0] : 0.0f;
            v1 = c0 + 1 < live_c ? gk[rows] : 0.0f;
            v2 = c0 + 8 < live_c ? gk[8 * rows] : 0.0f;
            v3 = c0 + 9 < live_c ? gk[9 * rows] : 0.0f;
          }
          uint32_t big0, rest0, big1, rest1;
          gated_rnn_split2(v0, v1, big0, rest0);
          gated_rnn_split2(v2, v3, big1, rest1);
#pragma unroll
          for (int j = 0; j < kMTiles; ++j) {
            if (!kUnchecked && mt0 + j * kWarps >= mtiles) break;  // the same for the whole warp
            uint32_t a[4];
            const uint32_t at =
                a_tile0 + static_cast<uint32_t>(j * kWarps) * tile_bytes +
                static_cast<uint32_t>(k0) * static_cast<uint32_t>(sizeof(__nv_bfloat16));
            gated_rnn_ldmatrix_x4<false>(a, at);
            MmaOp<__nv_bfloat16>::run(acc[j], a, big0, big1);
            MmaOp<__nv_bfloat16>::run(acc[j], a, rest0, rest1);
            if constexpr (kSplit) {
              gated_rnn_ldmatrix_x4<false>(a, at + rests_bytes);
              MmaOp<__nv_bfloat16>::run(acc[j], a, big0, big1);
            }
          }
        }
      };
      if (whole && mt0 + (kMTiles - 1) * kWarps < mtiles)
        multiply(std::true_type{});
      else
        multiply(std::false_type{});
#pragma unroll
      for (int j = 0; j < kMTiles; ++j) {
        const int mt = mt0 + j * kWarps;
        // The accumulator's columns 2t and 2t + 1 are rows b and b + 1.
#pragma unroll
        for (int e = 0; e < 4; e += 2) {
          const int k = mt * 16 + gq + (e >> 1) * 8, b = n0 + 2 * t;
          if (mt < mtiles && b < nb && k < K) publish(b, k, acc[j][e], acc[j][e + 1]);
        }
      }
    }
  }
}

}  // namespace exphil::kernels
