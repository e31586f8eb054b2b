/*
 * The forward's recurrent product on tensor cores: a block's pre-activations
 * h_{t-1} R[:, its columns] for the rows of one batch tile, every step, in
 * the block layout of gated_rnn_forward.cuh (which runs it with
 * GatedRnnForwardProduct::tensor_cores; the rest of a step is the same).
 *
 * Why. Above B = 4 a block multiplies its batch tile's rows by G*U columns
 * of R over H. On CUDA cores that product reads both operands from shared
 * memory for every multiply-add (20 loads per 64 FMAs a lane at B64 H512),
 * and shared memory's bandwidth bounded the step: 10.7 us a step for the
 * LSTM at B64 H512 (bench/RESULTS.md, issue 30 run W), where the
 * arithmetic alone is 2.3 us. Here the slice of R stays in registers for
 * the whole sequence and only h_{t-1} is read, once per fragment.
 *
 * Algorithm. mma.sync.m16n8k16 (common/mma_m16n8k16.cuh) with A = the
 * slice transposed (16 columns of R by 16 steps of H: R[k][column]) and B
 * = h_{t-1} transposed (16 steps of H by 8 batch rows), so C is 16 columns
 * by 8 rows. The slice's columns come in m-tiles of 16 (G*U rounded up,
 * zeros past the live ones) and H in k-steps of 16; the block's 8 warps
 * cut H into k_parts parts (gated_rnn_tc_k_parts: the fewest that leave
 * the busiest warp the fewest fragments) and each part's m-tiles among
 * 8 / k_parts warps, tile j of a warp being tile0 + j * (8 / k_parts). A
 * warp loads its fragments of R once, when the call starts, and keeps
 * them: at most kGatedRnnTcWarpTiles x kGatedRnnTcWarpSteps, 128 registers
 * a thread. Each step it reads its k-steps of h_{t-1} from shared memory
 * (rows padded to H + 8 floats: a fragment's 8 rows fall in distinct
 * banks), multiplies every m-tile by them (at most 16 rows a pass,
 * kGatedRnnTcMaxBatchTile), and stores its part's sums; the
 * cell threads add the k_parts parts in order. Every sum is in a fixed
 * order: results are bitwise reproducible.
 *
 * Precision. R is stored in the 16-bit dtype already (the planner takes
 * this product where R and the sequence share bf16 or f16), so its
 * fragments are exact. An f32 sequence with f32 R, where asked
 * (GatedRnnLaunchOptions::f32_tensor_cores), runs as f16: each weight
 * rounded to the nearest f16, the 11 significant bits of TF32 (cuDNN's and
 * PyTorch's default for f32 products on tensor cores) in half its register
 * bits, so that the slice fits the registers a 16-bit one does; |R| must
 * stay below 65504, and weights below 2^-14 keep an absolute error of
 * 2^-25 rather than a relative one. h_{t-1} is f32: each value is split into the
 * nearest 16-bit number and the 16-bit rounding of what is left, and both
 * halves are multiplied (two instructions a fragment), so the product sees
 * about 16 bits of h (bf16) or 22 (f16) rather than 8 or 11, accumulated in
 * f32: the CUDA-core product's 24 bits less 8 or 2, far inside the 16-bit
 * sequence's own rounding of y (bf16 2^-9, f16 2^-12, relative). An
 * f16 h beyond f16's range (|h| > 65504, possible only in an h0 given in
 * f32: every later GRU or LSTM h lies in (-1, 1)) overflows.
 *
 * Limits. H a multiple of 16, at most 16 x 16 x 8 = 2048; G*U at most 128
 * columns (kGatedRnnPreferredColumns) within what the warps hold. sm_80 and
 * later; no Hopper-only instruction.
 */
#pragma once

#include <cstdint>
#include <type_traits>

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "common/mma_m16n8k16.cuh"
#include "gated_rnn/gated_rnn_launch.h"

namespace exphil::kernels {

// The f32 value of a packed pair's halves (the inverse of MmaOp::pack).
template <class Elem> struct GatedRnnUnpack;
template <> struct GatedRnnUnpack<__nv_bfloat16> {
  __device__ __forceinline__ static float2 run(uint32_t v) {
    return make_float2(__uint_as_float(v << 16), __uint_as_float(v & 0xffff0000u));
  }
};
template <> struct GatedRnnUnpack<__half> {
  __device__ __forceinline__ static float2 run(uint32_t v) {
    return __half22float2(*reinterpret_cast<const __half2*>(&v));
  }
};

// Two f32 values as a pair of 16-bit numbers and the pair of what each
// leaves over (the Precision paragraph above).
template <class Elem>
__device__ __forceinline__ void gated_rnn_split_pair(float2 v, uint32_t& big, uint32_t& rest) {
  big = MmaOp<Elem>::pack(v.x, v.y);
  const float2 b = GatedRnnUnpack<Elem>::run(big);
  rest = MmaOp<Elem>::pack(v.x - b.x, v.y - b.y);
}

// R's element as a fragment's 16-bit word: a 16-bit R's own bits, an f32
// R's nearest f16 (the Precision paragraph above).
__device__ __forceinline__ uint32_t gated_rnn_tc_word(uint16_t v) { return v; }
__device__ __forceinline__ uint32_t gated_rnn_tc_word(float v) {
  return __half_as_ushort(__float2half_rn(v));
}

// The instruction's operand type for a sequence of Elem: f32 runs as f16.
template <class Elem> struct GatedRnnTcOperand { using type = Elem; };
template <> struct GatedRnnTcOperand<float> { using type = __half; };

template <class Elem>
struct GatedRnnTensorCoreSlice {
  static constexpr int kTiles = kGatedRnnTcWarpTiles;
  static constexpr int kSteps = kGatedRnnTcWarpSteps;
  static constexpr int kMaxRowTiles = kGatedRnnTcMaxBatchTile / 8;

  uint32_t a[kTiles][kSteps][4];  // A fragments: this warp's m-tiles by its k-steps
  int tile0, tile_stride, tiles;  // its m-tiles: tile0 + j * tile_stride, those below `tiles`
  int step0, steps;               // its k-steps: [step0, step0 + steps)
  int part;                       // which part of H it sums

  // This warp's fragments of the slice: R [H, G*H] as stored (Elem's 16-bit
  // words, or f32 where Elem is f16), the block's columns g * H + u0 + u
  // for gate g and unit u < live (U a slice).
  template <class Stored>
  __device__ __forceinline__ void load(const Stored* r, int G, int H, int U, int u0, int live,
                                       int parts) {
    static_assert(std::is_same_v<Stored, uint16_t> ||
                      (std::is_same_v<Stored, float> && std::is_same_v<Elem, __half>),
                  "R's own 16-bit words, or f32 rounded to f16");
    const int warp = static_cast<int>(threadIdx.x >> 5), lane = static_cast<int>(threadIdx.x & 31);
    const int g = lane >> 2, t = lane & 3;
    const int groups = (kGatedRnnThreads / 32) / parts;
    const int columns = G * U;
    part = warp % parts;
    tile0 = warp / parts;
    tile_stride = groups;
    tiles = (columns + 15) / 16;
    const int depth = H / 16, per = (depth + parts - 1) / parts;
    step0 = part * per;
    steps = max(0, min(per, depth - step0));
    const int64_t GH = static_cast<int64_t>(G) * H;
#pragma unroll
    for (int j = 0; j < kTiles; ++j)
#pragma unroll
      for (int s = 0; s < kSteps; ++s)
#pragma unroll
        for (int q = 0; q < 4; ++q) {
          const int m = (tile0 + j * tile_stride) * 16 + g + (q & 1) * 8;
          const int k = (step0 + s) * 16 + 2 * t + (q >> 1) * 8;
          // Predicated loads, no branch: the fragments' loads go out
          // together. A branch around each kept it waiting for the last,
          // and the load took 46 us at B64 H512 bf16, now 7 (runs BX, BZ).
          const int gate = m / U, u = m - gate * U;
          const bool in = s < steps && m < columns && u < live;
          const int64_t at = in ? static_cast<int64_t>(k) * GH + gate * H + u0 + u : 0;
          const uint32_t lo = in ? gated_rnn_tc_word(r[at]) : 0u;
          const uint32_t hi = in ? gated_rnn_tc_word(r[at + GH]) : 0u;
          a[j][s][q] = lo | (hi << 16);
          // Rounds of 8 loads: all of them at once would spill.
          if (q == 3) __syncwarp();
        }
  }

  // sums[part][n][c] = sum over this part's k of x[n][k] * R[k][column c]
  // for the nb live rows n (and zero rows up to the next multiple of 8) and
  // the slice's columns c: x [>= 8 rows, ldx], sums [parts][rows][lds].
  // A warp with all kSteps k-steps (H = 256 x k_parts: B64 H512 in bf16,
  // GRU and LSTM) runs the product for its count of live m-tiles and row
  // tiles without a guard: the guards were a compare and a branch for each
  // k-step, row tile and m-tile, about 100 of the 1100 instructions a warp
  // ran a step (run CU). Without them the bf16 forwards at B64 H512 took
  // 22% less (bench/RESULTS.md, issue 30 run CX), more than the
  // instructions saved: perhaps the branches also kept the compiler from
  // moving a k-step's loads ahead of the one before (not measured).
  __device__ __forceinline__ void multiply(const float* __restrict__ x, int ldx, int nb,
                                           float* __restrict__ sums, int rows, int lds) const {
    static_assert(kTiles == 2 && kMaxRowTiles == 2, "the dispatch below names every count");
    const int row_tiles = (nb + 7) / 8;
    const int live_tiles = tile0 >= tiles ? 0 : tile0 + tile_stride >= tiles ? 1 : 2;
    if (steps != kSteps || live_tiles == 0)
      multiply_rows<kTiles, kMaxRowTiles, true>(x, ldx, row_tiles, sums, rows, lds);
    else if (live_tiles == 2)
      row_tiles == 1 ? multiply_rows<2, 1, false>(x, ldx, row_tiles, sums, rows, lds)
                     : multiply_rows<2, 2, false>(x, ldx, row_tiles, sums, rows, lds);
    else
      row_tiles == 1 ? multiply_rows<1, 1, false>(x, ldx, row_tiles, sums, rows, lds)
                     : multiply_rows<1, 2, false>(x, ldx, row_tiles, sums, rows, lds);
  }

  // The warp's first kLiveTiles m-tiles by kRowTiles row tiles, every
  // k-step; kChecked: each against tiles, row_tiles and steps instead.
  template <int kLiveTiles, int kRowTiles, bool kChecked>
  __device__ __forceinline__ void multiply_rows(const float* __restrict__ x, int ldx, int row_tiles,
                                                float* __restrict__ sums, int rows,
                                                int lds) const {
    const int lane = static_cast<int>(threadIdx.x & 31);
    const int g = lane >> 2, t = lane & 3;
    // The big halves' and the rests' products in accumulators of their
    // own, added at the end: each chain of dependent instructions half as
    // long (a chain is this product's latency, one k-step after another).
    float acc[2][kLiveTiles][kRowTiles][4];
#pragma unroll
    for (int h = 0; h < 2; ++h)
#pragma unroll
      for (int j = 0; j < kLiveTiles; ++j)
#pragma unroll
        for (int n = 0; n < kRowTiles; ++n)
#pragma unroll
          for (int q = 0; q < 4; ++q) acc[h][j][n][q] = 0.0f;
#pragma unroll
    for (int s = 0; s < kSteps; ++s) {
      if (kChecked && s >= steps) break;
      const float* xs = x + (step0 + s) * 16 + 2 * t;
#pragma unroll
      for (int n = 0; n < kRowTiles; ++n) {
        if (kChecked && n >= row_tiles) break;
        const float* xr = xs + (n * 8 + g) * ldx;
        // Each warp of a part splits the same fragments of x as the part's
        // other warps. Splitting x once a block into shared words instead
        // (a pass and a barrier more) made the bf16 forwards at B64 H512
        // 11 to 15% slower (bench/RESULTS.md, issue 30 run CV).
        uint32_t b0, b1, r0, r1;
        gated_rnn_split_pair<Elem>(*reinterpret_cast<const float2*>(xr), b0, r0);
        gated_rnn_split_pair<Elem>(*reinterpret_cast<const float2*>(xr + 8), b1, r1);
#pragma unroll
        for (int j = 0; j < kLiveTiles; ++j) {
          if (kChecked && tile0 + j * tile_stride >= tiles) break;
          MmaOp<Elem>::run(acc[0][j][n], a[j][s], b0, b1);
          MmaOp<Elem>::run(acc[1][j][n], a[j][s], r0, r1);
        }
      }
    }
    float* out = sums + static_cast<int64_t>(part) * rows * lds;
#pragma unroll
    for (int j = 0; j < kLiveTiles; ++j) {
      const int m = (tile0 + j * tile_stride) * 16 + g;
      if (kChecked && tile0 + j * tile_stride >= tiles) break;
#pragma unroll
      for (int n = 0; n < kRowTiles; ++n) {
        if (kChecked && n >= row_tiles) break;
        float* o = out + (n * 8 + 2 * t) * lds + m;
        o[0] = acc[0][j][n][0] + acc[1][j][n][0];
        o[lds] = acc[0][j][n][1] + acc[1][j][n][1];
        o[8] = acc[0][j][n][2] + acc[1][j][n][2];
        o[lds + 8] = acc[0][j][n][3] + acc[1][j][n][3];
      }
    }
  }
};

// The pre-activation of row b, column c: the parts' sums added in order.
__device__ __forceinline__ float gated_rnn_tc_sum(const float* sums, int parts, int rows, int lds,
                                                  int b, int c) {
  float v = sums[b * lds + c];
  for (int q = 1; q < parts; ++q) v += sums[(q * rows + b) * lds + c];
  return v;
}

}  // namespace exphil::kernels
