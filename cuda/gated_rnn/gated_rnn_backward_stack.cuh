/*
 * Stacked GRU and LSTM layers, backward (ops "gru_stack" and "lstm_stack"):
 * the operands of the stack's own products and W's transpose. The launcher,
 * run_gated_rnn_stack_backward (gated_rnn_launch.cuh), runs the layers from
 * the top down:
 *
 *   for l = L-1 .. 0:
 *     l > 0:  wx_l = y_{l-1} W_l + b_l                    (again, as the forward
 *                                                          formed it layer by layer)
 *     layer l's one-layer backward (gated_rnn_backward.cuh) on wx_l, y_l and
 *       g_l, the gradient of y_l: grad_wx_l, grad_R_l, grad_bias_l, grad_h0_l, ...
 *     l > 0:  grad_W_l      = y_{l-1}^T grad_wx_l          [H, G*H] over B*T
 *             grad_W_bias_l = sum over B*T of grad_wx_l    (row H of the same product)
 *             g_{l-1}       = grad_wx_l W_l^T (+ the caller's gradient of y_{l-1})
 *
 * Each product is one of gated_rnn_gemm.cuh (on tensor cores for 16-bit
 * sequences where the plan says), each sum in a fixed order: the backward
 * is bitwise deterministic. W_l^T is transposed into the workspace first,
 * so that the product reads both operands along rows.
 *
 * Precision. wx_l, grad_wx_l and g_{l-1} are held in the sequence dtype, as
 * two one-layer calls would pass them; the wavefront forward fed the layers
 * above f32 h (gated_rnn_forward_stack.cuh), so in bf16 and f16 the
 * backward's recomputed wx_l differs from the forward's by that rounding.
 * Every sum is f32.
 *
 * Floor. L one-layer backwards plus, per layer above the first, three
 * products of B*T x G*H x H multiply-adds each: at B1 T32 H256 the
 * one-layer backwards' launches dominate; at B64 T256 H512 each product is
 * 26 (GRU) to 34 (LSTM) GFLOP, about 0.1 ms at a few hundred TFLOP/s,
 * against a one-layer backward of 4 to 6 ms (bench/RESULTS.md, run AG).
 */
#pragma once

#include <cstdint>
#include <type_traits>

#include "common/state_io.cuh"
#include "gated_rnn/gated_rnn_forward_stack.cuh"

namespace exphil::kernels {

namespace gated_rnn_stack {

// grad_W's A: [y_{l-1}; 1]^T [H+1, B*T] from row `first` on (row H the ones
// that give grad_W_bias), read along B*T: y_{l-1}'s rows.
template <class Elem>
struct InputGradA {
  static constexpr bool kContiguousK = false;
  const Elem* y;
  int64_t H, first;
  using Row = const Elem*;
  __device__ __forceinline__ Row row(int64_t k) const { return y + k * H; }
  __device__ __forceinline__ float at(Row r, int64_t m) const {
    const int64_t unit = m + first;
    return unit < H ? to_float(r[unit]) : 1.0f;
  }
  __device__ __forceinline__ void at8(Row r, int64_t m, float (&v)[8]) const {
    if (m + first + 8 <= H) {
#pragma unroll
      for (int j = 0; j < 8; ++j) v[j] = to_float(r[m + first + j]);
    } else {
#pragma unroll
      for (int j = 0; j < 8; ++j) v[j] = at(r, m + j);
    }
  }
  // (The ones are bf16 values too.)
  __device__ __forceinline__ bool bf16_exact() const {
    return std::is_same_v<Elem, __nv_bfloat16>;
  }
};

// The gradient of the layer below's y, grad_wx_l W_l^T, plus the caller's
// gradient of that y where given, in the sequence dtype.
template <class Elem>
struct LowerGradStore {
  Elem* grad_y;
  const Elem* outside;  // optional [M, N]
  int64_t N;
  __device__ __forceinline__ void operator()(int, int64_t m, int64_t n, float v) const {
    const int64_t i = m * N + n;
    grad_y[i] = from_float<Elem>(v + (outside ? to_float(outside[i]) : 0.0f));
  }
};

}  // namespace gated_rnn_stack

// dst [cols, rows] = src [rows, cols]^T, both in `dtype` (f32 or 16-bit):
// kTile x kTile tiles through shared memory, so that reads and writes both
// run along rows. Blocks of kTile x 8 threads. (A template so that every
// translation unit that includes this may hold it.)
inline constexpr int kGatedRnnTransposeTile = 32;
template <int kTile>
__global__ void __launch_bounds__(kTile * 8)
    gated_rnn_transpose_kernel(const void* __restrict__ src, void* __restrict__ dst, DType dtype,
                               int64_t rows, int64_t cols) {
  __shared__ float tile[kTile][kTile + 1];
  const int64_t r0 = static_cast<int64_t>(blockIdx.y) * kTile;
  const int64_t c0 = static_cast<int64_t>(blockIdx.x) * kTile;
  const int tx = static_cast<int>(threadIdx.x), ty = static_cast<int>(threadIdx.y);
  for (int i = ty; i < kTile; i += 8) {
    const int64_t r = r0 + i, c = c0 + tx;
    if (r < rows && c < cols) tile[i][tx] = load_state(src, dtype, r * cols + c);
  }
  __syncthreads();
  for (int i = ty; i < kTile; i += 8) {
    const int64_t c = c0 + i, r = r0 + tx;
    if (r < rows && c < cols) store_state(dst, dtype, c * rows + r, tile[tx][i]);
  }
}

}  // namespace exphil::kernels
